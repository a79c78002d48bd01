"""Judges: ASHA and the median rule on the Airflow path, as a trial's trigger asks them about each
of the trial's results (:func:`judge_for` picks one for the trigger's ``scheduler`` settings).

Each trial task is watched by its own trigger, so ASHA's rungs live in the trials store
(``TrialStore.record_rung``: one row per trial and rung, judged once) and the rules are
:class:`~airflow_trials.core.rungs.AshaRungs`'. The judge only walks a trial's results through
them, in order, and remembers the verdicts for the trigger's life. It is synchronous (its store
calls block): the trigger runs it in a thread.

A result processed again (a triggerer restart re-reads the trial's results) reaches the row its
first processing recorded and so the same verdict: a decision is never taken twice, nor lost.

:class:`MedianJudge` does the same for the median stopping rule, over each trial's running means
(``TrialStore.record_median_point``: one row per trial and result from grace_period).

Example::

    judge = RungJudge(AshaRungs(metric="loss", mode="min", max_t=16), bracket=0, store=store,
                      experiment_run_id=run_pk, trial_id="t1")
    verdict = judge.judge(snapshot["results"])   # the first STOP among them, or None
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from airflow_trials.core import result as R
from airflow_trials.core.judged import MedianRule, judged_from_dict
from airflow_trials.core.median_stopping import better_of
from airflow_trials.core.rungs import AshaRungs
from airflow_trials.core.scheduler import Decision
from airflow_trials.store.records import RungDecision


@dataclass(frozen=True)
class Verdict:
    """What the scheduler (ASHA, the median rule) decided about one of a trial's results.

    :param iteration: the result's training_iteration.
    :param decision: CONTINUE or STOP.
    :param reason: why it stops; None for CONTINUE.
    """

    iteration: int
    decision: Decision
    reason: str | None = None


class MissingSchedulerKey(ValueError):  # noqa: N818 - reads as what went wrong with the result
    """A result lacks the metric or ``time_attr`` the scheduler judges by, or its time went back:
    the trial's own fault."""


class _Judge:
    """What both judges share: the verdicts given in this judge's life, and reading a result."""

    name = "the scheduler"
    metric: str
    time_attr: str
    trial_id: str

    def __init__(self) -> None:
        self.verdicts: dict[int, Verdict] = {}

    def judge(self, results: Iterable[Mapping[str, Any]]) -> Verdict | None:
        """Judge each new result in order (recording what the scheduler keeps); the first STOP, or None."""
        stop = None
        for result in results:
            verdict = self._judge_one(result)
            self.verdicts[verdict.iteration] = verdict
            if stop is None and verdict.decision is Decision.STOP:
                stop = verdict
        return stop

    def verdict_for(self, iteration: int) -> Verdict:
        """The verdict given on result ``iteration`` in this judge's life (CONTINUE if none was needed)."""
        return self.verdicts.get(iteration) or Verdict(iteration, Decision.CONTINUE)

    def at_end(self, last_result: Mapping[str, Any] | None) -> None:
        raise NotImplementedError

    def _judge_one(self, result: Mapping[str, Any]) -> Verdict:
        raise NotImplementedError

    def _judged(self, result: Mapping[str, Any] | None) -> bool:
        """Does ``result`` carry what the scheduler judges by? (A trial that ended before it reported
        anything has nothing to record, Ray Tune alike.)"""
        return bool(result) and self.metric in result and self.time_attr in result  # type: ignore[operator]

    def _read(self, result: Mapping[str, Any]) -> tuple[int, float, float]:
        """The result's iteration, time and value; MissingSchedulerKey names what it lacks."""
        iteration = result.get(R.TRAINING_ITERATION)
        missing = [key for key in (self.time_attr, self.metric) if key not in result]
        if missing or not isinstance(iteration, int):
            raise MissingSchedulerKey(
                f"result {iteration} of trial {self.trial_id} has no {' and no '.join(map(repr, missing or ['training_iteration']))}, "
                f"which {self.name} judges by (metric={self.metric!r}, time_attr={self.time_attr!r}); "
                f"make the trainable report it in every result, or give the scheduler a metric it reports"
            )
        return iteration, _number(result[self.time_attr]), _number(result[self.metric])


class RungJudge(_Judge):
    """One trial's ASHA verdicts, from its results and the rungs stored for its run.

    :param rungs: ASHA's settings.
    :param bracket: the trial's bracket, drawn once per trial.
    :param store: the trials store (``record_rung``, ``trial_rungs``).
    :param experiment_run_id: the run whose trials share the rungs.
    :param trial_id: the trial.
    """

    name = "ASHAScheduler"

    def __init__(self, rungs: AshaRungs, bracket: int, store: Any, experiment_run_id: int, trial_id: str) -> None:
        super().__init__()
        self.rungs = rungs
        self.metric, self.time_attr = rungs.metric, rungs.time_attr
        self.bracket = bracket
        self.store = store
        self.experiment_run_id = experiment_run_id
        self.trial_id = trial_id
        self._recorded: list[RungDecision] | None = None

    def at_end(self, last_result: Mapping[str, Any] | None) -> None:
        """The trial ended TERMINATED: record its last value as ASHA does (not acted on)."""
        if last_result is None or not self._judged(last_result):
            return
        iteration, time, value = self._read(last_result)
        milestone = self.rungs.milestone_for(self.bracket, time, iteration, self._rungs(), at_end=True)
        if milestone is not None:
            self._record(milestone, iteration, time, value, at_end=True)

    def _judge_one(self, result: Mapping[str, Any]) -> Verdict:
        iteration, time, value = self._read(result)
        reason = self.rungs.stop_at_max_t(time)
        if reason is not None:
            return Verdict(iteration, Decision.STOP, reason)
        milestone = self.rungs.milestone_for(self.bracket, time, iteration, self._rungs())
        if milestone is None:
            return Verdict(iteration, Decision.CONTINUE)
        recorded = self._record(milestone, iteration, time, value, at_end=False)
        if recorded.decision is Decision.STOP:
            return Verdict(iteration, Decision.STOP, recorded.reason)
        return Verdict(iteration, Decision.CONTINUE)

    def _record(self, milestone: float, iteration: int, time: float, value: float, *, at_end: bool) -> RungDecision:
        recorded = self.store.record_rung(
            self.experiment_run_id, self.trial_id, bracket=self.bracket, milestone=milestone, value=value,
            iteration=iteration, at_end=at_end,
            decide=self.rungs.decide(self.bracket, time, milestone, value, at_end=at_end),
        )
        if recorded.fresh:
            self._rungs().append(recorded)
        return recorded

    def _rungs(self) -> list[RungDecision]:
        if self._recorded is None:
            self._recorded = list(self.store.trial_rungs(self.trial_id))
        return self._recorded



class MedianJudge(_Judge):
    """One trial's median-rule verdicts, from its results and the running means stored for its run.

    At each result from ``grace_period`` it adds the result to the trial's running mean in the
    store and takes the rule's verdict there (``TrialStore.record_median_point``), comparing the
    trial's best so far (over all its results, kept here and read once from its stored results
    when this judge starts) with the median of the other trials' running means.

    :param rule: the rule's settings.
    :param store: the trials store (``record_median_point``, ``get_results``).
    :param experiment_run_id: the run whose trials the rule compares.
    :param trial_id: the trial.
    """

    name = "MedianStoppingRule"

    def __init__(self, rule: MedianRule, store: Any, experiment_run_id: int, trial_id: str) -> None:
        super().__init__()
        self.rule = rule
        self.metric, self.time_attr = rule.metric, rule.time_attr
        self.store = store
        self.experiment_run_id = experiment_run_id
        self.trial_id = trial_id
        self._best: float | None = None  # the best value of the results judged so far

    def at_end(self, last_result: Mapping[str, Any] | None) -> None:
        """The trial ended TERMINATED: add its last result again, as Ray Tune's rule does (not acted on)."""
        if last_result is None or not self._judged(last_result):
            return
        iteration, time, value = self._read(last_result)
        if time < self.rule.grace_period:
            return
        try:
            self.store.record_median_point(self.experiment_run_id, self.trial_id, iteration=iteration, time=time,
                                           value=value, at_end=True)
        except ValueError:
            return  # a replayed last result, before the trial's latest time: the rule adds nothing (Ray alike)

    def _judge_one(self, result: Mapping[str, Any]) -> Verdict:
        iteration, time, value = self._read(result)
        best = self._best_after(iteration, value)
        if time < self.rule.grace_period:
            return Verdict(iteration, Decision.CONTINUE)
        try:
            point = self.store.record_median_point(
                self.experiment_run_id, self.trial_id, iteration=iteration, time=time, value=value,
                decide=functools.partial(self.rule.verdict, best, time),
            )
        except ValueError as e:  # its time went back: the rule cannot judge it
            raise MissingSchedulerKey(f"trial {self.trial_id}: {e}") from e
        return Verdict(iteration, point.decision, point.reason if point.decision is Decision.STOP else None)

    def _best_after(self, iteration: int, value: float) -> float:
        if self._best is None:
            earlier = [r for r in self.store.get_results(self.trial_id) if r.get(R.TRAINING_ITERATION, 0) < iteration]
            best = math.nan
            for index, previous in enumerate(earlier):
                number = _number(previous.get(self.metric))
                best = number if index == 0 else better_of(best, number, self.rule.mode)
            self._best = value if not earlier else better_of(best, value, self.rule.mode)
        else:
            self._best = better_of(self._best, value, self.rule.mode)
        return self._best


def judge_for(
    settings: Mapping[str, Any], bracket: int, store: Any, experiment_run_id: int, trial_id: str
) -> RungJudge | MedianJudge:
    """The judge of a trigger's ``scheduler`` settings (``AshaRungs`` or ``MedianRule``, as dicts)."""
    scheduler = judged_from_dict(dict(settings))
    if isinstance(scheduler, MedianRule):
        return MedianJudge(scheduler, store, experiment_run_id, trial_id)
    return RungJudge(scheduler, bracket, store, experiment_run_id, trial_id)


def _number(value: Any) -> float:
    """A result value as ASHA compares it: NaN when it is not a number (it stops nothing)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return math.nan
    return float(value)
