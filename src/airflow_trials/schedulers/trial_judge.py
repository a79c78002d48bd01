"""Judge: the Airflow path's one adapter over a slice's :class:`TrialJudging`, one trial at a time.

Each trial task is watched by its own trigger, so a scheduler's state lives in the trials DB (the
slice's trials-DB backend: ``asha/stored_rungs.py``, ``median/stored_means.py``), and the rule is
the one the runner's scheduler judges with. A slice says how to judge one trial's results through
:class:`TrialJudging` (``asha/asha_judging.py``, ``moasha/moasha_judging.py``,
``median/median_judging.py``); :class:`Judge` walks a trial's new results through it, in order,
within the transaction that writes them (``record_progress``'s judges:
``store/scheduler_state.py``), so a result and its verdict commit together. It remembers the
verdicts for the trigger's life once that write committed. A result processed again (a triggerer
restart re-reads the trial's results) reaches the row its first processing recorded and so the
same verdict: a decision is never taken twice, nor lost.

Example::

    judge = judge_for(AshaRungs(metric="loss", mode="min", max_t=16).to_dict(), bracket=0,
                      experiment_run_id=run_pk, trial_id="t1")   # schedulers/registry.py
    call = judge.call()
    store.record_progress([update], judges={"t1": call})
    judged = call.settle()         # judged.stop: the first STOP among the results, or None
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from airflow_trials.core import result as R
from airflow_trials.core.scheduler import Decision
from airflow_trials.core.stop_kind import StopKind
from airflow_trials.core.update import TrialUpdate
from airflow_trials.store.scheduler_state import SchedulerState

__all__ = [
    "JudgeCall",
    "Judged",
    "JudgedSettings",
    "JudgedSlice",
    "Judge",
    "MissingSchedulerKey",
    "TrialJudging",
    "Verdict",
    "number",
    "read_result",
    "stop_kind",
]


@dataclass(frozen=True)
class Verdict:
    """What the scheduler decided about one of a trial's results.

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


def stop_kind(decision: Decision, reached_max_t: bool) -> StopKind:
    """The stop kind of a rung rule's verdict: MAX_T for a STOP at ``max_t``."""
    return StopKind.MAX_T if decision is Decision.STOP and reached_max_t else StopKind.SCHEDULER


class MissingSchedulerKey(ValueError):  # noqa: N818 - reads as what went wrong with the result
    """A result lacks the metric or ``time_attr`` the scheduler judges by, or its time went back:
    the trial's own fault."""


def number(value: Any) -> float:
    """A result value as the rules compare it: NaN when it is not a number (it stops nothing)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return math.nan
    return float(value)


def read_result(
    result: Mapping[str, Any], trial_id: str, name: str, metric: str, time_attr: str
) -> tuple[int, float, float]:
    """The result's iteration, time and value; MissingSchedulerKey names what it lacks."""
    iteration = result.get(R.TRAINING_ITERATION)
    missing = [key for key in (time_attr, metric) if key not in result]
    if missing or not isinstance(iteration, int):
        lacks = " and no ".join(map(repr, missing or ["training_iteration"]))
        raise MissingSchedulerKey(
            f"result {iteration} of trial {trial_id} has no {lacks}, which {name} "
            f"judges by (metric={metric!r}, time_attr={time_attr!r}); make the "
            f"trainable report it in every result, or give the scheduler a metric it reports"
        )
    return iteration, number(result[time_attr]), number(result[metric])


class TrialJudging(Protocol):
    """How a slice judges one trial's results on the Airflow path: what :class:`Judge` asks.

    A *view* is the slice's trials-DB state within one write (``open``); what a committed write's
    view learned is kept (``remember``) for the next write.
    """

    name: str  # the scheduler's name in messages, e.g. "ASHAScheduler"
    trial_id: str
    experiment_run_id: int

    def open(self, state: SchedulerState) -> Any:
        """The trial's view of the run's state in this write."""

    def remember(self, view: Any) -> None:
        """Keep what a committed write's ``view`` learned."""

    def carries(self, result: Mapping[str, Any]) -> bool:
        """Does ``result`` carry what the scheduler judges by?"""

    def judge(self, view: Any, result: Mapping[str, Any]) -> Verdict:
        """The verdict on one result; MissingSchedulerKey for one it cannot judge."""

    def end(self, view: Any, last_result: Mapping[str, Any]) -> None:
        """Record the finished trial's last result as the rule does (not acted on)."""


class JudgedSettings(Protocol):
    """A slice's Airflow-path settings (``AshaRungs``, ``MOASHARungs``, ``MedianRule``): what an
    operator serialises for the trigger and what the trial's actor holds at."""

    def to_dict(self) -> dict[str, Any]: ...

    def draw_bracket(self, uniform: float) -> int: ...

    def hold_spec(self, bracket: int) -> dict[str, Any]: ...


@dataclass(frozen=True)
class JudgedSlice:
    """A slice that judges on the Airflow path, as :mod:`~airflow_trials.schedulers.registry` finds
    it (a module-level ``SLICE`` in a slice's ``*_judging`` module).

    :param name: the scheduler's public name (``"ASHAScheduler"``).
    :param scheduler: the runner's scheduler class users pass (``AsyncHyperBandScheduler``).
    :param settings_type: its Airflow-path settings class (``AshaRungs``).
    :param rule_key: the value of ``RULE_KEY`` in its ``to_dict()``; None for ASHA's (which has
        none).
    :param settings: the scheduler's settings for the experiment's metric and mode (ValueError
        for a scheduler the Airflow path cannot run).
    :param judge: a trial's :class:`Judge` for (settings, bracket, run id, trial id).
    """

    name: str
    scheduler: type
    settings_type: type
    rule_key: str | None
    settings: Callable[[Any, Any, Any], JudgedSettings]
    judge: Callable[[Any, int, int, str], Judge]


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
        self, judge: Judge, last_result: Mapping[str, Any] | None = None, at_end: bool = False
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


class Judge:
    """One trial's verdicts on the Airflow path, over its slice's :class:`TrialJudging`: the
    verdicts given in this judge's life, and the writes that judge.

    :param judging: how the trial's scheduler judges it (its slice's).
    """

    def __init__(self, judging: TrialJudging) -> None:
        self.judging = judging
        self.verdicts: dict[int, Verdict] = {}

    @property
    def trial_id(self) -> str:
        return self.judging.trial_id

    @property
    def experiment_run_id(self) -> int:
        return self.judging.experiment_run_id

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
        found = _Found(self.judging.open(state))
        try:
            for result in results:
                verdict = self.judging.judge(found.view, result)
                found.verdicts[verdict.iteration] = verdict
                if found.stop is None and verdict.decision is Decision.STOP:
                    found.stop = verdict
        except MissingSchedulerKey as e:
            found.error = e
        return found

    def find_end(self, state: SchedulerState, last_result: Mapping[str, Any] | None) -> _Found:
        """Record the finished trial's last result (a trial that ended before it reported
        anything has nothing to record, Ray Tune alike)."""
        found = _Found(self.judging.open(state))
        if last_result and self.judging.carries(last_result):
            self.judging.end(found.view, last_result)
        return found

    def keep(self, found: _Found) -> None:
        """What a committed write found becomes this judge's memory."""
        self.verdicts.update(found.verdicts)
        self.judging.remember(found.view)

    def verdict_for(self, iteration: int) -> Verdict:
        """The verdict given on result ``iteration`` in this judge's life (CONTINUE if none was
        needed)."""
        return self.verdicts.get(iteration) or Verdict(iteration, Decision.CONTINUE)
