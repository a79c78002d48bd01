"""ASHA's rule, written once (:class:`AshaRungs`), over its rungs behind :class:`RungState`."""

# The rule reads and writes its rungs only through RungState, as Ray Tune's scheduler goes
# through its _Bracket: MemoryRungs holds them for the runner's AsyncHyperBandScheduler, the
# trials store holds them for the Airflow path (store/rungs.py StoredRungs, one row per trial and
# rung), where each trial's trigger judges its own results. Values are kept in the metric's own
# units; ``mode`` turns them into scores (higher is better) only to judge, which is exact (a
# negation), so both states compare the very same numbers.

from __future__ import annotations

import bisect
import functools
import math
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any, Protocol, cast, runtime_checkable

from airflow_trials.core.scheduler import Decision, RecordedVerdict, format_number


def nan_percentile(values: Iterable[float], percent: float) -> float:
    """``numpy.nanpercentile(values, percent)`` (its default linear method), to the last bit.

    NaNs are left out; NaN when nothing is left. ASHA compares scores against this cutoff with
    ``<``, so a cutoff off by one unit in the last place would change decisions on ties.
    """
    data = sorted(v for v in values if not math.isnan(v))
    if not data:
        return math.nan
    below, above, weight = percentile_ranks(len(data), percent)
    return interpolate(data[below], data[above], weight)


def percentile_ranks(count: int, percent: float) -> tuple[int, int, float]:
    """The ranks (0-based, ascending) of the two of ``count`` sorted values that NumPy's linear
    percentile interpolates between, and the weight of the higher one; ``count`` >= 1."""
    last = count - 1
    index = last * (percent / 100)
    if index >= last:
        # numpy takes the last value from both sides, with the weight counted from index -1.
        return last, last, index + 1
    below = math.floor(index)
    return below, below + 1, index - below


def interpolate(low: float, high: float, weight: float) -> float:
    """NumPy's linear interpolation between two sorted values, rounding as NumPy rounds."""
    diff = high - low
    if weight >= 0.5:
        return high - diff * (1 - weight)
    return low + diff * weight


@runtime_checkable
class RungValues(Protocol):
    """The values recorded at a rung before a new one, as much as a cutoff needs of them.

    :class:`ValueList` holds them all (in memory); the trials store answers from SQL, reading two
    values however many there are.
    """

    @property
    def total(self) -> int:
        """How many values, NaNs included."""

    @property
    def numeric(self) -> int:
        """How many values are not NaN."""

    def ranked(self, first: int, last: int, descending: bool) -> Sequence[float]:
        """The non-NaN values of ranks ``first`` to ``last`` (0-based, both included) in
        ascending order, or in descending order with ``descending``, listed in that order."""


class ValueList:
    """:class:`RungValues` over values held in memory (NaN for NaN)."""

    def __init__(self, values: Iterable[float]) -> None:
        values = list(values)
        self.total = len(values)
        self._sorted = sorted(v for v in values if not math.isnan(v))
        self.numeric = len(self._sorted)

    def ranked(self, first: int, last: int, descending: bool) -> Sequence[float]:
        ordered = self._sorted[::-1] if descending else self._sorted
        return ordered[first : last + 1]


def rung_cutoff(values: RungValues, reduction_factor: float, mode: str) -> float | None:
    """A rung's cutoff score (``sign * value``, higher is better): the ``(1 - 1/reduction_factor)``
    percentile of the scores before, as :func:`nan_percentile` gives it; None when there were
    none."""
    if values.total == 0:
        return None
    if values.numeric == 0:
        return math.nan
    sign = mode_sign(mode)
    below, above, weight = percentile_ranks(values.numeric, rung_percent(reduction_factor))
    # Scores ascending are values ascending for "max" and values descending for "min".
    picked = values.ranked(below, above, descending=sign < 0)
    return interpolate(sign * picked[0], sign * picked[-1], weight)


def rung_milestones(
    grace_period: float, max_t: float, reduction_factor: float, bracket: int = 0
) -> tuple[float, ...]:
    """The milestones of bracket ``bracket``'s rungs, highest first (as Ray Tune keeps them):
    ``grace_period * reduction_factor**k`` for ``k`` from ``bracket`` up to the last below
    ``max_t``."""
    # math.log gives the same rung count as Ray's np.log (checked over 176,924 settings).
    count = int(math.log(max_t / grace_period) / math.log(reduction_factor) - bracket + 1)
    return tuple(grace_period * reduction_factor ** (k + bracket) for k in reversed(range(count)))


def rung_to_judge(
    milestones: Sequence[float], time: float, judged: Collection[float], stop_last_trials: bool
) -> float | None:
    """The milestone at which a result at ``time`` is judged, or None when none is due.

    That is the highest milestone ``time`` reached at which the trial has no value yet
    (``judged``: the milestones where it has one). Without ``stop_last_trials`` a trial that has a
    value at a reached rung is never judged again; with it (Ray Tune's quirk, kept) it is judged at
    a lower rung it skipped, on its next result.
    """
    for milestone in milestones:
        reached = time >= milestone
        if reached and milestone in judged and not stop_last_trials:
            return None
        if not reached or milestone in judged:
            continue
        return milestone
    return None


def rung_percent(reduction_factor: float) -> float:
    """The percentile of the scores recorded at a rung that a new score must reach to go on."""
    return (1 - 1 / reduction_factor) * 100


def mode_sign(mode: str) -> float:
    """Turns a value of the metric into a score where higher is better."""
    if mode not in ("min", "max"):
        raise ValueError(f"ASHA's mode must be 'min' or 'max', got {mode!r}.")
    return 1.0 if mode == "max" else -1.0


@dataclass(frozen=True)
class RungVerdict:
    """ASHA's verdict on a value that first reached a rung.

    :param decision: STOP when the value fell below the rung's cutoff, else CONTINUE.
    :param cutoff: the cutoff, in the metric's units; None when the rung had no value before (NaN
        when it had only NaNs, which stops nothing).
    :param reason: why it was stopped, as the scheduler says it; default None (no context given).
    """

    decision: Decision
    cutoff: float | None
    reason: str | None = None


RungDecide = Callable[[RungValues], RungVerdict]
"""Judges one value from the values recorded at its rung before it."""


def asha_rung_decision(
    values_before: RungValues | Iterable[float], value: float, reduction_factor: float, mode: str
) -> RungVerdict:
    """ASHA's verdict on ``value`` at a rung where ``values_before`` were recorded before it.

    The cutoff is the ``(1 - 1/reduction_factor)`` percentile of the scores before (NumPy's
    ``nanpercentile``: NaNs are left out); a score strictly below it stops the trial. A tie goes on.
    """
    sign = mode_sign(mode)
    # Asked at every rung a result reaches: an attribute test, not a runtime Protocol check.
    values = (
        cast(RungValues, values_before)
        if hasattr(values_before, "ranked")
        else ValueList(cast(Iterable[float], values_before))
    )
    cutoff = rung_cutoff(values, reduction_factor, mode)
    if cutoff is None:
        return RungVerdict(Decision.CONTINUE, None)
    decision = Decision.STOP if sign * value < cutoff else Decision.CONTINUE
    return RungVerdict(decision, sign * cutoff)


def draw_bracket(rung_counts: Sequence[int], uniform: float) -> int:
    """The bracket ``numpy.random.choice(len(rung_counts), p=softmax(rung_counts))`` picks for
    the uniform draw ``uniform`` in [0, 1), as Ray Tune's ASHA places a new trial."""
    # Normalise, cumulate, normalise by the last sum, then the first bucket above the draw.
    weights = [math.e ** (size - max(rung_counts)) for size in rung_counts]
    total = 0.0
    for weight in weights:
        total += weight
    cdf, running = [], 0.0
    for weight in weights:
        running += weight / total
        cdf.append(running)
    cdf = [value / cdf[-1] for value in cdf]
    return min(bisect.bisect_right(cdf, uniform), len(cdf) - 1)


@dataclass(frozen=True)
class RungStop:
    """Where a trial fell below a rung's cutoff, for :func:`rung_stop_reason`."""

    rung_number: int  # 1 for the lowest rung of its bracket
    rung_count: int
    milestone: float
    cutoff: float
    bracket: int = 0
    brackets: int = 1


def rung_stop_reason(
    stop: RungStop, *, time_attr: str, time: float, metric: str, mode: str, value: float
) -> str:
    """``stopped by ASHA at training_iteration=3 (rung 1 of 4): score 0.41 below the rung's
    cutoff 0.55``."""
    where = f"rung {stop.rung_number} of {stop.rung_count}"
    if stop.milestone != time:
        where += f", milestone {format_number(stop.milestone)}"
    if stop.brackets > 1:
        where = f"bracket {stop.bracket + 1} of {stop.brackets}, {where}"
    side = "below" if mode == "max" else "above"
    return (
        f"stopped by ASHA at {time_attr}={format_number(time)} ({where}): {metric} "
        f"{format_number(value)} {side} the rung's cutoff {format_number(stop.cutoff)}"
    )


#: The reason stored with a trial's last value, recorded when it ended (not a verdict).
AT_END_REASON = "recorded when the trial ended, as ASHA records a trial's last value"

#: What ASHA's reason for stopping a trial at ``max_t`` says: it ran its whole budget, not
#: stopped early.
REACHED_MAX_T = ": it reached max_t="


def max_t_stop_reason(time_attr: str, time: float, max_t: float) -> str:
    return (
        f"stopped by ASHA at {time_attr}={format_number(time)}{REACHED_MAX_T}{format_number(max_t)}"
    )


def check_asha_settings(
    name: str, max_t: Any, grace_period: Any, reduction_factor: Any, brackets: Any
) -> None:
    """ValueErrors, naming ``name`` and the fix, for settings ASHA cannot work with."""
    if not max_t > 0:
        raise ValueError(
            f"{name} got max_t={max_t}: it must be > 0, the most time_attr a trial runs for."
        )
    if not grace_period > 0:
        raise ValueError(
            f"{name} got grace_period={grace_period}: it must be > 0 (the first rung is at "
            f"grace_period)."
        )
    if grace_period > max_t:
        raise ValueError(
            f"{name} got grace_period={grace_period} > max_t={max_t}: no rung fits below max_t; "
            f"lower grace_period or raise max_t."
        )
    if not reduction_factor > 1:
        raise ValueError(
            f"{name} got reduction_factor={reduction_factor}: it must be > 1 (each rung keeps the "
            f"top 1/reduction_factor of its trials); 2 to 4 is usual."
        )
    if not brackets > 0:
        raise ValueError(f"{name} got brackets={brackets}: use 1 or more.")


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


class MemoryRungs:
    """:class:`RungState` in memory: the rungs of the runner's ASHA, like Ray's ``_Bracket``."""

    def __init__(self) -> None:
        self._values: dict[tuple[int, float], dict[str, float]] = {}
        self._trials: dict[str, list[MemoryRung]] = {}

    def trial_rungs(self, trial_id: str) -> list[MemoryRung]:
        return self._trials.get(trial_id, [])

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
        recorded = self._trials.setdefault(trial_id, [])
        for rung in recorded:
            if rung.milestone == milestone:
                return rung
        values = self._values.setdefault((bracket, milestone), {})
        verdict = decide(ValueList(values.values()))
        values[trial_id] = value
        rung = MemoryRung(bracket, milestone, iteration, at_end, verdict.decision, verdict.reason)
        recorded.append(rung)
        return rung

    def rung_values(self, bracket: int, milestone: float) -> ValueList:
        return ValueList(self._values.get((bracket, milestone), {}).values())


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
    second one. The runner's :class:`~airflow_trials.core.asha.AsyncHyperBandScheduler` judges
    with it over :class:`MemoryRungs`, a trial's trigger over the trials store.

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
        judged = {
            r.milestone
            for r in recorded
            if not r.at_end
            and (
                r.iteration is None
                or r.iteration < iteration
                or (at_end and r.iteration == iteration)
            )
        }
        return self.rung_to_judge(bracket, time, judged)

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
