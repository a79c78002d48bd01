"""ASHA's rule, written once (:class:`AshaRungs`), over its rungs behind :class:`RungState`."""

# The rule reads and writes its rungs only through RungState, as Ray Tune's scheduler goes
# through its _Bracket: MemoryRungs holds them for the runner's AsyncHyperBandScheduler, the
# trials store holds them for the Airflow path (store/rungs.py StoredRungs, one row per trial and
# rung), where each trial's trigger judges its own results. Values are kept in the metric's own
# units; ``mode`` turns them into scores (higher is better) only to judge, which is exact (a
# negation), so both states compare the very same numbers. The pure functions the rule judges
# with are in schedulers/asha/rung_math.py.

from __future__ import annotations

import functools
from collections.abc import Callable, Collection, Iterable
from dataclasses import asdict, dataclass, replace
from typing import Any, Generic, Protocol, TypeVar

from airflow_trials.core.scheduler import Decision, RecordedVerdict
from airflow_trials.core.verdicts import RungDecide, RungValues, RungVerdict, ValueList
from airflow_trials.schedulers.asha.rung_math import (
    AT_END_REASON,
    RungStop,
    asha_rung_decision,
    check_asha_settings,
    draw_bracket,
    max_t_stop_reason,
    mode_sign,
    nan_percentile,
    rung_cutoff,
    rung_milestones,
    rung_percent,
    rung_stop_reason,
    rung_to_judge,
)

V = TypeVar("V")

# The rule and its state; the pure functions that tests and callers import from here as well.
__all__ = [
    "AshaRungs",
    "MemoryRung",
    "MemoryRungs",
    "MemoryRungsOf",
    "RecordedRung",
    "RungState",
    "RungVerdict",
    "ValueList",
    "asha_rung_decision",
    "judged_milestones",
    "nan_percentile",
    "rung_cutoff",
    "rung_milestones",
    "rung_percent",
    "rung_to_judge",
]


class RecordedRung(Protocol):
    """A trial's recorded rung, as far as choosing its next one goes (the store's RungDecision)."""

    @property
    def milestone(self) -> float: ...

    @property
    def iteration(self) -> int | None: ...

    @property
    def at_end(self) -> bool: ...


class RungState(Protocol):
    """Where ASHA's rungs live: what every trial recorded at each rung, one verdict per trial and
    rung.

    :class:`AshaRungs` reads and writes them through these three methods only, so the rule is the
    same in memory (:class:`MemoryRungs`, the runner's) and in the trials DB
    (``store/rungs.py`` ``StoredRungs``, the Airflow path's).
    """

    def trial_rungs(self, trial_id: str) -> Iterable[RecordedRung]:
        """The rungs ``trial_id`` recorded a value at, in any order."""

    def record(
        self,
        trial_id: str,
        *,
        bracket: int,
        milestone: float,
        value: float,
        iteration: int,
        at_end: bool,
        decide: RungDecide,
    ) -> RecordedVerdict:
        """Record ``value`` at the rung and return ``decide``'s verdict on it, judged once: when
        the trial has a value at ``milestone`` already, its stored verdict, and ``decide`` is not
        called. ``decide`` gets the values recorded at (``bracket``, ``milestone``) before."""

    def rung_values(self, bracket: int, milestone: float) -> RungValues:
        """The values recorded at a rung (for ``debug_string``)."""


@dataclass(frozen=True)
class MemoryRung:
    """A trial's record at one rung, held by :class:`MemoryRungs`."""

    bracket: int
    milestone: float
    iteration: int | None
    at_end: bool
    decision: Decision
    reason: str | None


class MemoryRungsOf(Generic[V]):
    """Rungs in memory, each trial's value of type ``V`` at each rung in the order recorded (a
    dict keeps it, as Ray's ``_Bracket`` and Syne Tune's rungs do), one verdict per trial and
    rung: the runner's ASHA (:class:`MemoryRungs`, one value) and MOASHA
    (``schedulers/moasha/moasha_scheduler.py`` ``MemoryVectorRungs``, a vector)."""

    def __init__(self) -> None:
        self._values: dict[tuple[int, float], dict[str, V]] = {}
        self._trials: dict[str, list[MemoryRung]] = {}

    def trial_rungs(self, trial_id: str) -> list[MemoryRung]:
        return self._trials.get(trial_id, [])

    def _record(
        self,
        trial_id: str,
        bracket: int,
        milestone: float,
        value: V,
        iteration: int,
        at_end: bool,
        decide: Callable[[list[V]], RungVerdict],
    ) -> MemoryRung:
        """Record ``value`` and return ``decide``'s verdict on the values recorded before it;
        a trial with a value at ``milestone`` already gets its recorded verdict."""
        recorded = self._trials.setdefault(trial_id, [])
        for rung in recorded:
            if rung.milestone == milestone:
                return rung
        values = self._values.setdefault((bracket, milestone), {})
        verdict = decide(list(values.values()))
        values[trial_id] = value
        rung = MemoryRung(bracket, milestone, iteration, at_end, verdict.decision, verdict.reason)
        recorded.append(rung)
        return rung

    def _recorded(self, bracket: int, milestone: float) -> list[V]:
        return list(self._values.get((bracket, milestone), {}).values())


class MemoryRungs(MemoryRungsOf[float]):
    """:class:`RungState` in memory: the rungs of the runner's ASHA, like Ray's ``_Bracket``."""

    def record(
        self,
        trial_id: str,
        *,
        bracket: int,
        milestone: float,
        value: float,
        iteration: int,
        at_end: bool,
        decide: RungDecide,
    ) -> MemoryRung:
        return self._record(
            trial_id,
            bracket,
            milestone,
            value,
            iteration,
            at_end,
            lambda before: decide(ValueList(before)),
        )

    def rung_values(self, bracket: int, milestone: float) -> ValueList:
        return ValueList(self._recorded(bracket, milestone))


def judged_milestones(
    recorded: Iterable[RecordedRung], iteration: int, at_end: bool = False
) -> set[float]:
    """The milestones where result ``iteration`` of a trial finds a value already: those of its
    earlier results (at the end, also its last result's own), whatever was recorded after it.
    Rows without an iteration count as earlier; values recorded when the trial ended do not
    count."""
    return {
        r.milestone
        for r in recorded
        if not r.at_end
        and (
            r.iteration is None or r.iteration < iteration or (at_end and r.iteration == iteration)
        )
    }


@dataclass(frozen=True)
class AshaRungs:
    """ASHA's rule (Ray Tune 2.60's AsyncHyperBandScheduler), over rungs in a :class:`RungState`.

    :meth:`judge` is the whole rule for one result of a trial at ``time`` (its ``time_attr``) with
    ``value`` (its ``metric``, NaN when not a number):

    1. :meth:`stop_at_max_t` gives a reason: the trial stops (no rung is judged).
    2. Otherwise :meth:`milestone_for` picks the rung from the trial's recorded ones; None: it
       continues.
    3. Otherwise ``state.record(...)`` records the value there, judged once by :meth:`decide`,
       and returns the verdict.

    When the trial ends (for any reason, after its last result), steps 2 and 3 run once more with
    that result and ``at_end=True``: ASHA records a trial's last value as Ray Tune's
    ``on_trial_complete`` does, and that verdict is not acted on. Processing a result again (a
    triggerer restart, a retry) gives the same milestone and so the stored verdict: never a
    second one. The runner's
    :class:`~airflow_trials.schedulers.asha.async_hyperband.AsyncHyperBandScheduler` judges with it
    over :class:`MemoryRungs`, a trial's trigger over the trials store.

    Example::

        rungs = AshaRungs(metric="loss", mode="min", max_t=81, grace_period=1, reduction_factor=3)
        rungs.milestones(0)  # (81, 27, 9, 3, 1)
        rungs.judge(MemoryRungs(), "t1", 0, time=1, value=0.5, iteration=1)  # (CONTINUE, None)

    :param metric: the result key judged.
    :param mode: ``"min"`` or ``"max"``.
    :param time_attr: the result key measuring progress; default ``"training_iteration"``.
    :param max_t: default 100; ``grace_period`` default 1; ``reduction_factor`` default 4;
        ``brackets`` default 1; ``stop_last_trials`` default True: as in AsyncHyperBandScheduler.
    """

    metric: str
    mode: str
    time_attr: str = "training_iteration"
    max_t: float = 100
    grace_period: float = 1
    reduction_factor: float = 4
    brackets: int = 1
    stop_last_trials: bool = True

    def __post_init__(self) -> None:
        mode_sign(self.mode)
        check_asha_settings(
            type(self).__name__, self.max_t, self.grace_period, self.reduction_factor, self.brackets
        )

    def milestones(self, bracket: int) -> tuple[float, ...]:
        """Bracket ``bracket``'s milestones, highest first."""
        if not 0 <= bracket < self.brackets:
            raise ValueError(
                f"Bracket {bracket} is not one of ASHA's {self.brackets} "
                f"(0 to {self.brackets - 1})."
            )
        return self._milestones[bracket]

    @functools.cached_property
    def _milestones(self) -> tuple[tuple[float, ...], ...]:
        # Asked at every result: computed once (a frozen dataclass still has a __dict__).
        return tuple(
            rung_milestones(self.grace_period, self.max_t, self.reduction_factor, bracket)
            for bracket in range(self.brackets)
        )

    def to_dict(self) -> dict[str, Any]:
        """Plain values (an operator's argument, a trigger's serialized field);
        ``AshaRungs(**d)`` reads them."""
        return asdict(self)

    def hold_points(self, bracket: int) -> list[float]:
        """Where a trial of ``bracket`` waits for its verdict: its milestones, and ``max_t`` when
        trials stop there (see :mod:`airflow_trials.execution.worker.holds`)."""
        points = set(self.milestones(bracket))
        if self.stop_last_trials:
            points.add(float(self.max_t))
        return sorted(float(p) for p in points)

    def hold_spec(self, bracket: int) -> dict[str, Any]:
        """Where a trial of ``bracket`` waits for its verdict, as the actor takes it."""
        return {"time_attr": self.time_attr, "points": self.hold_points(bracket)}

    def draw_bracket(self, uniform: float) -> int:
        """The bracket of a new trial for one uniform draw in [0, 1); draw it once per trial and
        keep it."""
        return draw_bracket([len(self.milestones(b)) for b in range(self.brackets)], uniform)

    def stop_at_max_t(self, time: float) -> str | None:
        """The reason to stop a trial whose result reached ``max_t`` (with
        ``stop_last_trials``), else None."""
        if self.stop_last_trials and time >= self.max_t:
            return max_t_stop_reason(self.time_attr, time, self.max_t)
        return None

    def reached_max_t(self, time: float) -> bool:
        """Does a result at ``time`` stop its trial at ``max_t`` (:meth:`stop_at_max_t`; stop
        kind MAX_T)?"""
        return self.stop_at_max_t(time) is not None

    def rung_to_judge(self, bracket: int, time: float, judged: Collection[float]) -> float | None:
        """See :func:`rung_to_judge`."""
        return rung_to_judge(self.milestones(bracket), time, judged, self.stop_last_trials)

    def milestone_for(
        self,
        bracket: int,
        time: float,
        iteration: int,
        recorded: Iterable[RecordedRung],
        *,
        at_end: bool = False,
    ) -> float | None:
        """The milestone result ``iteration`` (at ``time``) is recorded at, or None: it continues.

        ``recorded`` are the trial's stored rungs. Only those of its earlier results count (at the
        end, also its last result's own), so the answer is the one the result got when it was
        first processed, whatever was recorded after it: a result processed again (a triggerer
        restart, a retry) reaches the same row, and ``record_rung`` returns its stored verdict.
        Rows without an iteration count as earlier.
        """
        return self.rung_to_judge(bracket, time, judged_milestones(recorded, iteration, at_end))

    def decide(
        self, bracket: int, time: float, milestone: float, value: float, *, at_end: bool = False
    ) -> RungDecide:
        """The ``decide`` of ``RungState.record`` for ``value`` reaching ``milestone`` at
        ``time``."""
        milestones = self.milestones(bracket)
        rung_number = len(milestones) - milestones.index(milestone)

        def judge(values_before: RungValues) -> RungVerdict:
            verdict = asha_rung_decision(values_before, value, self.reduction_factor, self.mode)
            if at_end:
                return replace(verdict, reason=AT_END_REASON)
            if verdict.decision is not Decision.STOP or verdict.cutoff is None:
                return verdict
            stop = RungStop(
                rung_number, len(milestones), milestone, verdict.cutoff, bracket, self.brackets
            )
            reason = rung_stop_reason(
                stop,
                time_attr=self.time_attr,
                time=time,
                metric=self.metric,
                mode=self.mode,
                value=value,
            )
            return replace(verdict, reason=reason)

        return judge

    def judge(
        self,
        state: RungState,
        trial_id: str,
        bracket: int,
        *,
        time: float,
        value: float,
        iteration: int,
        at_end: bool = False,
    ) -> tuple[Decision, str | None]:
        """The rule on one result of ``trial_id`` (of ``bracket``): CONTINUE or STOP, and why it
        stops. ``iteration`` orders a trial's results (training_iteration); with ``at_end`` the
        trial ended and this is its last result, recorded and not acted on (CONTINUE)."""
        if not at_end:
            reason = self.stop_at_max_t(time)
            if reason is not None:
                return Decision.STOP, reason
        recorded = state.trial_rungs(trial_id)
        milestone = self.milestone_for(bracket, time, iteration, recorded, at_end=at_end)
        if milestone is None:
            return Decision.CONTINUE, None
        verdict = state.record(
            trial_id,
            bracket=bracket,
            milestone=milestone,
            value=value,
            iteration=iteration,
            at_end=at_end,
            decide=self.decide(bracket, time, milestone, value, at_end=at_end),
        )
        if at_end or verdict.decision is not Decision.STOP:
            return Decision.CONTINUE, None
        return Decision.STOP, verdict.reason
