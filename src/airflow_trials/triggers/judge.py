"""Judges: a trial's trigger walks its results through ASHA's, MOASHA's or the median rule's one
rule."""

# Each trial task is watched by its own trigger, so the rule's state lives in the trials store
# (schedulers/asha/stored_rungs.py StoredRungs and StoredVectorRungs, store/median.py StoredMeans);
# the rule is the one the runner's schedulers judge with (schedulers/asha/asha_rungs.py
# AshaRungs.judge, schedulers/moasha/moasha_scheduler.py MOASHARungs.judge,
# schedulers/median/median_rule.py MedianRule.judge). A judge walks a trial's new results through
# it, in order, within the transaction that writes them (record_progress's judges:
# store/scheduler_state.py), so a result and its verdict commit together; it remembers the verdicts
# for the trigger's life once that write committed. A result processed again (a triggerer restart
# re-reads the trial's results) reaches the row its first processing recorded and so the same
# verdict: a decision is never taken twice, nor lost.
#
#     judge = judge_for(AshaRungs(metric="loss", mode="min", max_t=16).to_dict(), bracket=0,
#                       experiment_run_id=run_pk, trial_id="t1")
#     call = judge.call()
#     store.record_progress([update], judges={"t1": call})
#     judged = call.settle()         # judged.stop: the first STOP among the results, or None

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from airflow_trials.core import result as R
from airflow_trials.core.scheduler import Decision
from airflow_trials.core.stop_kind import StopKind
from airflow_trials.core.update import TrialUpdate
from airflow_trials.schedulers.asha.asha_rungs import AshaRungs
from airflow_trials.schedulers.asha.stored_rungs import KnownRungs, StoredRungs, StoredVectorRungs
from airflow_trials.schedulers.median.median_rule import MedianRule, better_of
from airflow_trials.schedulers.median.stored_means import StoredMeans
from airflow_trials.schedulers.moasha.moasha_scheduler import MetricVector, MOASHARungs
from airflow_trials.schedulers.registry import judged_from_dict
from airflow_trials.store.scheduler_state import SchedulerState


@dataclass(frozen=True)
class Verdict:
    """What the scheduler (ASHA, MOASHA, the median rule) decided about one of a trial's results.

    :param iteration: the result's training_iteration.
    :param decision: CONTINUE or STOP.
    :param reason: why it stops; None for CONTINUE.
    :param stop_kind: with STOP, the kind of the trial's end: SCHEDULER (default), or MAX_T when
        it reached ``max_t``.
    """

    iteration: int
    decision: Decision
    reason: str | None = None
    stop_kind: StopKind = StopKind.SCHEDULER


def _kind(decision: Decision, reached_max_t: bool) -> StopKind:
    """The stop kind of a rung rule's verdict: MAX_T for a STOP at ``max_t``."""
    return StopKind.MAX_T if decision is Decision.STOP and reached_max_t else StopKind.SCHEDULER


class MissingSchedulerKey(ValueError):  # noqa: N818 - reads as what went wrong with the result
    """A result lacks the metric or ``time_attr`` the scheduler judges by, or its time went back:
    the trial's own fault."""


@dataclass(frozen=True)
class Judged:
    """What a judge found in one committed write of its trial's results.

    :param stop: the first STOP among them, or None.
    :param error: the result it could not judge (the rest were not judged), or None.
    """

    stop: Verdict | None = None
    error: MissingSchedulerKey | None = None


@dataclass
class _Found:
    """What one run of a :class:`JudgeCall` found: kept only once its write committed."""

    view: Any
    verdicts: dict[int, Verdict] = field(default_factory=dict)
    stop: Verdict | None = None
    error: MissingSchedulerKey | None = None


class JudgeCall:
    """One write's call of a judge: the :class:`~airflow_trials.store.scheduler_state.Judging`
    that ``record_progress`` runs within its transaction (more than once if the transaction runs
    again). :meth:`settle`, once the write committed, keeps what the committed run found.

    :param judge: the trial's judge.
    :param last_result: with ``at_end``, the finished trial's last result.
    :param at_end: record the finished trial's last value (not acted on) instead of judging.
    """

    def __init__(
        self, judge: _Judge, last_result: Mapping[str, Any] | None = None, at_end: bool = False
    ) -> None:
        self._judge, self._last_result, self._at_end = judge, last_result, at_end
        self._found: _Found | None = None

    def __call__(self, state: SchedulerState, update: TrialUpdate) -> None:
        judge = self._judge
        if self._at_end:
            self._found = judge.find_end(state, self._last_result)
        else:
            self._found = judge.find(state, update.results)

    def settle(self) -> Judged:
        """The committed run's findings, now the judge's (nothing when it never ran)."""
        found, self._found = self._found, None
        if found is None:
            return Judged()
        self._judge.keep(found)
        return Judged(found.stop, found.error)


class _Judge:
    """What the judges share: the verdicts given in this judge's life, and reading a result."""

    name = "the scheduler"
    metric: str
    time_attr: str
    trial_id: str
    experiment_run_id: int

    def __init__(self) -> None:
        self.verdicts: dict[int, Verdict] = {}

    def call(self) -> JudgeCall:
        """The judging of one write of the trial's new results."""
        return JudgeCall(self)

    def ending(self, last_result: Mapping[str, Any] | None) -> JudgeCall:
        """The write of the trial's finished end: its last value recorded as the rule does
        (Ray Tune's and Syne Tune's ``on_trial_complete``), not acted on."""
        return JudgeCall(self, last_result, at_end=True)

    def find(self, state: SchedulerState, results: Iterable[Mapping[str, Any]]) -> _Found:
        """Judge each result in order, recording what the scheduler keeps: the verdicts, the
        first STOP, or the result it could not judge."""
        found = _Found(self._open(state))
        try:
            for result in results:
                verdict = self._judge_one(found.view, result)
                found.verdicts[verdict.iteration] = verdict
                if found.stop is None and verdict.decision is Decision.STOP:
                    found.stop = verdict
        except MissingSchedulerKey as e:
            found.error = e
        return found

    def find_end(self, state: SchedulerState, last_result: Mapping[str, Any] | None) -> _Found:
        found = _Found(self._open(state))
        if last_result is not None and self._judged(last_result):
            self._end(found.view, last_result)
        return found

    def keep(self, found: _Found) -> None:
        """What a committed write found becomes this judge's memory."""
        self.verdicts.update(found.verdicts)
        self._remember(found.view)

    def verdict_for(self, iteration: int) -> Verdict:
        """The verdict given on result ``iteration`` in this judge's life (CONTINUE if none was
        needed)."""
        return self.verdicts.get(iteration) or Verdict(iteration, Decision.CONTINUE)

    def _open(self, state: SchedulerState) -> Any:
        raise NotImplementedError

    def _remember(self, view: Any) -> None:
        raise NotImplementedError

    def _end(self, view: Any, last_result: Mapping[str, Any]) -> None:
        raise NotImplementedError

    def _judge_one(self, view: Any, result: Mapping[str, Any]) -> Verdict:
        raise NotImplementedError

    def _judged(self, result: Mapping[str, Any] | None) -> bool:
        """Does ``result`` carry what the scheduler judges by? (A trial that ended before it
        reported anything has nothing to record, Ray Tune alike.)"""
        return bool(result) and self.metric in result and self.time_attr in result  # type: ignore[operator]

    def _read(self, result: Mapping[str, Any]) -> tuple[int, float, float]:
        """The result's iteration, time and value; MissingSchedulerKey names what it lacks."""
        iteration = result.get(R.TRAINING_ITERATION)
        missing = [key for key in (self.time_attr, self.metric) if key not in result]
        if missing or not isinstance(iteration, int):
            lacks = " and no ".join(map(repr, missing or ["training_iteration"]))
            raise MissingSchedulerKey(
                f"result {iteration} of trial {self.trial_id} has no {lacks}, which {self.name} "
                f"judges by (metric={self.metric!r}, time_attr={self.time_attr!r}); make the "
                f"trainable report it in every result, or give the scheduler a metric it reports"
            )
        return iteration, _number(result[self.time_attr]), _number(result[self.metric])


class _RungsJudge(_Judge):
    """What ASHA's and MOASHA's judges share: the trial's rungs, remembered between writes."""

    def __init__(self, bracket: int, experiment_run_id: int, trial_id: str) -> None:
        super().__init__()
        self.bracket = bracket
        self.experiment_run_id = experiment_run_id
        self.trial_id = trial_id
        self._known: KnownRungs = {}

    def _remember(self, view: StoredRungs | StoredVectorRungs) -> None:
        self._known.update(view.trials)


class RungJudge(_RungsJudge):
    """One trial's ASHA verdicts:
    :meth:`AshaRungs.judge <airflow_trials.schedulers.asha.asha_rungs.AshaRungs.judge>` over the
    run's rungs in the trials store
    (:class:`~airflow_trials.schedulers.asha.stored_rungs.StoredRungs`).

    :param rungs: ASHA's rule.
    :param bracket: the trial's bracket, drawn once per trial.
    :param experiment_run_id: the run whose trials share the rungs.
    :param trial_id: the trial.
    """

    name = "ASHAScheduler"

    def __init__(
        self, rungs: AshaRungs, bracket: int, experiment_run_id: int, trial_id: str
    ) -> None:
        super().__init__(bracket, experiment_run_id, trial_id)
        self.rungs = rungs
        self.metric, self.time_attr = rungs.metric, rungs.time_attr

    def _open(self, state: SchedulerState) -> StoredRungs:
        return StoredRungs(state, self.experiment_run_id, self._known)

    def _end(self, view: StoredRungs, last_result: Mapping[str, Any]) -> None:
        iteration, time, value = self._read(last_result)
        self.rungs.judge(
            view,
            self.trial_id,
            self.bracket,
            time=time,
            value=value,
            iteration=iteration,
            at_end=True,
        )

    def _judge_one(self, view: StoredRungs, result: Mapping[str, Any]) -> Verdict:
        iteration, time, value = self._read(result)
        decision, reason = self.rungs.judge(
            view, self.trial_id, self.bracket, time=time, value=value, iteration=iteration
        )
        return Verdict(iteration, decision, reason, _kind(decision, self.rungs.reached_max_t(time)))


class VectorRungJudge(_RungsJudge):
    """One trial's MOASHA verdicts:
    :meth:`MOASHARungs.judge <airflow_trials.schedulers.moasha.moasha_scheduler.MOASHARungs.judge>`
    over the run's rungs in the trials store
    (:class:`~airflow_trials.schedulers.asha.stored_rungs.StoredVectorRungs`), each result's metrics
    read by :meth:`~airflow_trials.schedulers.moasha.moasha_scheduler.MOASHARungs.values_of`.

    :param rungs: MOASHA's rule.
    :param bracket: the trial's bracket, drawn once per trial.
    :param experiment_run_id: the run whose trials share the rungs.
    :param trial_id: the trial.
    """

    name = "MOASHA"

    def __init__(
        self, rungs: MOASHARungs, bracket: int, experiment_run_id: int, trial_id: str
    ) -> None:
        super().__init__(bracket, experiment_run_id, trial_id)
        self.rungs = rungs
        self.time_attr = rungs.time_attr

    def _open(self, state: SchedulerState) -> StoredVectorRungs:
        return StoredVectorRungs(state, self.experiment_run_id, self._known)

    def _end(self, view: StoredVectorRungs, last_result: Mapping[str, Any]) -> None:
        iteration, time, values = self._read_vector(last_result)
        self.rungs.judge(
            view,
            self.trial_id,
            self.bracket,
            time=time,
            values=values,
            iteration=iteration,
            at_end=True,
        )

    def _judge_one(self, view: StoredVectorRungs, result: Mapping[str, Any]) -> Verdict:
        iteration, time, values = self._read_vector(result)
        decision, reason = self.rungs.judge(
            view, self.trial_id, self.bracket, time=time, values=values, iteration=iteration
        )
        return Verdict(iteration, decision, reason, _kind(decision, self.rungs.reached_max_t(time)))

    def _judged(self, result: Mapping[str, Any] | None) -> bool:
        keys = (self.time_attr, *self.rungs.metric)
        return bool(result) and all(key in result for key in keys)  # type: ignore[operator]

    def _read_vector(self, result: Mapping[str, Any]) -> tuple[int, float, MetricVector]:
        """The result's iteration, time and metric values; MissingSchedulerKey names what it
        lacks or what is not a number."""
        iteration = result.get(R.TRAINING_ITERATION)
        if not isinstance(iteration, int):
            raise MissingSchedulerKey(
                f"result {iteration} of trial {self.trial_id} has no 'training_iteration', which "
                f"MOASHA orders a trial's results by; report results through "
                f"airflow_trials.report, which numbers them"
            )
        try:
            values = self.rungs.values_of(self.trial_id, result)
        except ValueError as e:
            raise MissingSchedulerKey(f"result {iteration}: {e}") from e
        return iteration, float(result[self.time_attr]), values


@dataclass
class _MeansView:
    """The median rule's state in one write, and the trial's best value so far."""

    state: SchedulerState
    means: StoredMeans
    best: float | None


class MedianJudge(_Judge):
    """One trial's median-rule verdicts: :meth:`MedianRule.judge
    <airflow_trials.schedulers.median.median_rule.MedianRule.judge>` over the run's running means in
    the trials store (:class:`~airflow_trials.store.median.StoredMeans`).

    The trial's best so far (over all its results) is kept here, read once from its stored
    results when this judge first judges (after a triggerer restart, say).

    :param rule: the rule.
    :param experiment_run_id: the run whose trials the rule compares.
    :param trial_id: the trial.
    """

    name = "MedianStoppingRule"

    def __init__(self, rule: MedianRule, experiment_run_id: int, trial_id: str) -> None:
        super().__init__()
        self.rule = rule
        self.metric, self.time_attr = rule.metric, rule.time_attr
        self.experiment_run_id = experiment_run_id
        self.trial_id = trial_id
        self._best: float | None = None  # the best value of the results judged so far

    def _open(self, state: SchedulerState) -> _MeansView:
        return _MeansView(state, StoredMeans(state, self.experiment_run_id), self._best)

    def _remember(self, view: _MeansView) -> None:
        self._best = view.best

    def _end(self, view: _MeansView, last_result: Mapping[str, Any]) -> None:
        """Add the trial's last result again, as Ray Tune's rule does (not acted on)."""
        iteration, time, value = self._read(last_result)
        try:
            self.rule.at_end(view.means, self.trial_id, iteration=iteration, time=time, value=value)
        except ValueError:
            # A replayed last result, before the trial's latest time: the rule adds nothing
            # (Ray alike).
            return

    def _judge_one(self, view: _MeansView, result: Mapping[str, Any]) -> Verdict:
        iteration, time, value = self._read(result)
        best = self._best_after(view, iteration, value)
        try:
            verdict = self.rule.judge(
                view.means, self.trial_id, iteration=iteration, time=time, value=value, best=best
            )
        except ValueError as e:  # its time went back: the rule cannot judge it
            raise MissingSchedulerKey(f"trial {self.trial_id}: {e}") from e
        return Verdict(iteration, verdict.decision, verdict.reason)

    def _best_after(self, view: _MeansView, iteration: int, value: float) -> float:
        if view.best is None:
            earlier = view.state.results_before(self.trial_id, iteration)
            best = math.nan
            for index, previous in enumerate(earlier):
                number = _number(previous.get(self.metric))
                best = number if index == 0 else better_of(best, number, self.rule.mode)
            view.best = value if not earlier else better_of(best, value, self.rule.mode)
        else:
            view.best = better_of(view.best, value, self.rule.mode)
        return view.best


#: The judge of one trial: ASHA's, MOASHA's or the median rule's.
Judge = RungJudge | VectorRungJudge | MedianJudge


def judge_for(
    settings: Mapping[str, Any], bracket: int, experiment_run_id: int, trial_id: str
) -> Judge:
    """The judge of a trigger's ``scheduler`` settings (``AshaRungs``, ``MOASHARungs`` or
    ``MedianRule``, as dicts)."""
    scheduler = judged_from_dict(dict(settings))
    if isinstance(scheduler, MedianRule):
        return MedianJudge(scheduler, experiment_run_id, trial_id)
    if isinstance(scheduler, MOASHARungs):
        return VectorRungJudge(scheduler, bracket, experiment_run_id, trial_id)
    return RungJudge(scheduler, bracket, experiment_run_id, trial_id)


def _number(value: Any) -> float:
    """A result value as ASHA compares it: NaN when it is not a number (it stops nothing)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return math.nan
    return float(value)
