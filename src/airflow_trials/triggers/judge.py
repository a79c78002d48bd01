"""RungJudge: ASHA on the Airflow path, as a trial's trigger asks it about each of the trial's results.

Each trial task is watched by its own trigger, so ASHA's rungs live in the trials store
(``TrialStore.record_rung``: one row per trial and rung, judged once) and the rules are
:class:`~airflow_trials.core.rungs.AshaRungs`'. The judge only walks a trial's results through
them, in order, and remembers the verdicts for the trigger's life. It is synchronous (its store
calls block): the trigger runs it in a thread.

A result processed again (a triggerer restart re-reads the trial's results) reaches the row its
first processing recorded and so the same verdict: a decision is never taken twice, nor lost.

Example::

    judge = RungJudge(AshaRungs(metric="loss", mode="min", max_t=16), bracket=0, store=store,
                      experiment_run_id=run_pk, trial_id="t1")
    verdict = judge.judge(snapshot["results"])   # the first STOP among them, or None
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from airflow_trials.core import result as R
from airflow_trials.core.rungs import AshaRungs
from airflow_trials.core.scheduler import Decision
from airflow_trials.store.records import RungDecision


@dataclass(frozen=True)
class Verdict:
    """What ASHA decided about one of a trial's results.

    :param iteration: the result's training_iteration.
    :param decision: CONTINUE or STOP.
    :param reason: why it stops; None for CONTINUE.
    """

    iteration: int
    decision: Decision
    reason: str | None = None


class MissingSchedulerKey(ValueError):  # noqa: N818 - reads as what went wrong with the result
    """A result lacks the metric or ``time_attr`` ASHA judges by: the trial's own fault."""


class RungJudge:
    """One trial's ASHA verdicts, from its results and the rungs stored for its run.

    :param rungs: ASHA's settings.
    :param bracket: the trial's bracket, drawn once per trial.
    :param store: the trials store (``record_rung``, ``trial_rungs``).
    :param experiment_run_id: the run whose trials share the rungs.
    :param trial_id: the trial.
    """

    def __init__(self, rungs: AshaRungs, bracket: int, store: Any, experiment_run_id: int, trial_id: str) -> None:
        self.rungs = rungs
        self.bracket = bracket
        self.store = store
        self.experiment_run_id = experiment_run_id
        self.trial_id = trial_id
        self._recorded: list[RungDecision] | None = None
        self.verdicts: dict[int, Verdict] = {}

    def judge(self, results: Iterable[Mapping[str, Any]]) -> Verdict | None:
        """Judge each new result in order (recording the rungs they reach); the first STOP, or None."""
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
        """The trial ended TERMINATED: record its last value as ASHA does (not acted on)."""
        if not last_result or self.rungs.metric not in last_result or self.rungs.time_attr not in last_result:
            return  # ended before it reported anything: nothing to record (Ray Tune alike)
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

    def _read(self, result: Mapping[str, Any]) -> tuple[int, float, float]:
        """The result's iteration, time and value; MissingSchedulerKey names what it lacks."""
        iteration = result.get(R.TRAINING_ITERATION)
        missing = [key for key in (self.rungs.time_attr, self.rungs.metric) if key not in result]
        if missing or not isinstance(iteration, int):
            raise MissingSchedulerKey(
                f"result {iteration} of trial {self.trial_id} has no {' and no '.join(map(repr, missing or ['training_iteration']))}, "
                f"which ASHAScheduler judges by (metric={self.rungs.metric!r}, time_attr={self.rungs.time_attr!r}); "
                f"make the trainable report it in every result, or give the scheduler a metric it reports"
            )
        return iteration, _number(result[self.rungs.time_attr]), _number(result[self.rungs.metric])


def _number(value: Any) -> float:
    """A result value as ASHA compares it: NaN when it is not a number (it stops nothing)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return math.nan
    return float(value)
