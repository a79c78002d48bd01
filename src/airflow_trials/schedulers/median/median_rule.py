"""The median stopping rule written once (MedianRule), over running means behind MedianState."""

# MemoryMeans holds the running means for the runner's MedianStoppingRule
# (schedulers/median/median_stopping.py, the rule plus Ray Tune's hooks and pauses); the trials
# store holds them for the Airflow path (schedulers/median/stored_means.py StoredMeans), where each
# trial's trigger judges its own results.

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol, cast

from airflow_trials.core.scheduler import RULE_KEY, Decision, RecordedVerdict, format_number
from airflow_trials.core.verdicts import MEDIAN_AT_END_REASON as AT_END_REASON
from airflow_trials.core.verdicts import MeanList, MeanSample, MedianDecide


def better_of(best: float, value: float, mode: str) -> float:
    """A trial's best so far after ``value``: ``max``/``min`` keep ``best`` unless ``value`` beats
    it, as Ray's max over the list does, NaNs included."""
    return max(best, value) if mode == "max" else min(best, value)


def median_stop_reason(
    *,
    time_attr: str,
    time: float,
    metric: str,
    mode: str,
    best: float,
    median: float,
    samples: int,
    hard_stop: bool = True,
) -> str:
    """``stopped by the median stopping rule at training_iteration=4: best score 0.3 below the
    median 0.5 of 3 other trials' running means``."""
    verb = "stopped" if hard_stop else "paused"
    side = "below" if mode == "max" else "above"
    return (
        f"{verb} by the median stopping rule at {time_attr}={format_number(time)}: best "
        f"{metric} {format_number(best)} {side} the median {format_number(median)} of "
        f"{samples} other trials' running means"
    )


def as_sample(means: MeanSample | Iterable[float]) -> MeanSample:
    """``means`` as a :class:`MeanSample` (a :class:`MeanList` of an iterable)."""
    # Asked at every result: an attribute test, not a runtime Protocol check (which is slow).
    if hasattr(means, "median"):
        return cast(MeanSample, means)
    return MeanList(cast(Iterable[float], means))


def median_rule_verdict(
    best: float, means: MeanSample | Iterable[float], *, min_samples_required: int, mode: str
) -> tuple[bool, float] | None:
    """The median rule's verdict on a trial whose best so far is ``best``, against the other
    trials' running means at this time (finite ones only): ``(stop, median)``; None when there are
    fewer than ``min_samples_required`` of them. A best strictly worse than the median stops; as
    Ray compares, a NaN best counts as worse than any median."""
    sample = as_sample(means)
    if sample.count < min_samples_required:
        return None
    median = sample.median()
    keep = (best >= median) if mode == "max" else (best <= median)
    return (not keep, median)


class MedianState(Protocol):
    """Where the median stopping rule keeps its running means: one per trial and result from
    grace_period, each judged once. :class:`MedianRule` goes through this one method, so the rule
    is the same in memory (:class:`MemoryMeans`, the runner's) and in the trials DB
    (``store/median.py`` ``StoredMeans``, the Airflow path's)."""

    def record(
        self,
        trial_id: str,
        *,
        iteration: int,
        time: float,
        value: float,
        decide: MedianDecide | None = None,
        at_end: bool = False,
    ) -> RecordedVerdict:
        """Add result ``iteration`` (at ``time``) to the trial's running mean and return
        ``decide``'s verdict on it, given the running means at ``time`` of the other trials whose
        latest result is at or past it; judged once: a result recorded already returns its
        stored verdict, and ``decide`` is not called. ``at_end``: the trial's last result, added
        again when it ended, with no ``decide`` (CONTINUE, :data:`AT_END_REASON`). ValueError for
        a time before the trial's last."""


@dataclass(frozen=True)
class MemoryPoint:
    """A verdict :class:`MemoryMeans` stored for one result."""

    decision: Decision
    reason: str | None


@dataclass
class _Means:
    """One trial's points: the time of each result from grace_period, and the running sum of the
    metric up to it; a running mean up to any time is one bisection away."""

    times: list[float] = field(default_factory=list)
    sums: list[float] = field(default_factory=list)
    verdicts: dict[tuple[int, bool], MemoryPoint] = field(default_factory=dict)

    def mean_until(self, time: float) -> float:
        count = bisect.bisect_right(self.times, time)
        return self.sums[count - 1] / count if count else math.nan


class MemoryMeans:
    """:class:`MedianState` in memory, for the runner's
    :class:`~airflow_trials.schedulers.median.median_stopping.MedianStoppingRule`."""

    def __init__(self) -> None:
        self._trials: dict[str, _Means] = {}

    def record(
        self,
        trial_id: str,
        *,
        iteration: int,
        time: float,
        value: float,
        decide: MedianDecide | None = None,
        at_end: bool = False,
    ) -> MemoryPoint:
        points = self._trials.setdefault(trial_id, _Means())
        stored = points.verdicts.get((iteration, at_end))
        if stored is not None:
            return stored
        if points.times and time < points.times[-1]:
            raise ValueError(
                f"Cannot record result {iteration} of trial {trial_id} for the median rule: its "
                f"time {time!r} is before the trial's last recorded {points.times[-1]!r}; the "
                "median stopping rule needs a time_attr that never decreases within a trial "
                "(training_iteration or time_total_s)."
            )
        reason: str | None = AT_END_REASON
        decision = Decision.CONTINUE
        if decide is not None:
            decision, reason = decide(MeanList(self._means_at(trial_id, time)))
        if decision not in (Decision.CONTINUE, Decision.STOP):
            raise ValueError(
                f"Cannot record result {iteration} of trial {trial_id} for the median rule: "
                f"decide returned {decision!r}, not CONTINUE or STOP."
            )
        points.times.append(time)
        points.sums.append(points.sums[-1] + value if points.sums else value)
        point = points.verdicts[(iteration, at_end)] = MemoryPoint(decision, reason)
        return point

    def _means_at(self, trial_id: str, time: float) -> list[float]:
        return [
            other.mean_until(time)
            for other_id, other in self._trials.items()
            if other_id != trial_id and other.times and other.times[-1] >= time
        ]


@dataclass(frozen=True)
class MedianVerdict:
    """The rule's verdict on one result.

    :param decision: CONTINUE or STOP.
    :param reason: why it stops; None for CONTINUE.
    :param samples: how many other trials' means it was judged against; None when it was not
        judged here (before grace_period, or a verdict stored before).
    """

    decision: Decision
    reason: str | None = None
    samples: int | None = None


@dataclass(frozen=True)
class MedianRule:
    """The median stopping rule, written once, over running means kept in a :class:`MedianState`.

    At each result with ``time_attr >= grace_period`` it compares the trial's best so far with
    the median of the other trials' running means at that time (:meth:`judge`). The runner's
    :class:`~airflow_trials.schedulers.median.median_stopping.MedianStoppingRule` judges with it
    over :class:`MemoryMeans`, and adds Ray Tune's pauses; a trial's trigger on the Airflow path
    judges with it over the trials store, as ``hard_stop=True`` decides when no trial waits to
    run: where too few other trials have a mean, Ray Tune pauses the trial if others wait to run,
    so that they start; a deferred task cannot be paused and frees no Ray resource by waiting,
    so there the trial continues.

    :param metric: the result key judged.
    :param mode: ``"min"`` or ``"max"``.
    :param time_attr: the result key measuring progress; default ``"time_total_s"`` (Ray's).
    :param grace_period: no result before it is judged or averaged; default 60.0.
    :param min_samples_required: the fewest other trials' means to take a median of; default 3.
    """

    metric: str
    mode: str
    time_attr: str = "time_total_s"
    grace_period: float = 60.0
    min_samples_required: int = 3

    def __post_init__(self) -> None:
        if self.mode not in ("min", "max"):
            raise ValueError(
                f"MedianStoppingRule's mode must be 'min' or 'max', got {self.mode!r}."
            )
        if not self.min_samples_required >= 1:
            raise ValueError(
                f"MedianStoppingRule got min_samples_required={self.min_samples_required}: "
                "use 1 or more."
            )

    def to_dict(self) -> dict[str, Any]:
        """Plain values (an operator's argument, a trigger's serialized field);
        ``core.judged.judged_from_dict`` reads them."""
        return {RULE_KEY: MEDIAN, **asdict(self)}

    def draw_bracket(self, uniform: float) -> int:  # noqa: ARG002 - the rule has no brackets
        return 0

    def hold_spec(self, bracket: int) -> dict[str, Any]:  # noqa: ARG002
        """The actor waits for a verdict at every result from ``grace_period``: each is judged."""
        return {"time_attr": self.time_attr, "points": [], "every_from": float(self.grace_period)}

    def verdict(
        self,
        best: float,
        time: float,
        means: MeanSample | Iterable[float],
        *,
        hard_stop: bool = True,
    ) -> tuple[Decision, str | None]:
        """The verdict on a result at ``time`` of a trial whose best so far is ``best``, given the
        other trials' running means there (non-finite ones are left out, as Ray leaves them);
        ``hard_stop=False`` only words the reason as a pause."""
        sample = as_sample(means)
        verdict = median_rule_verdict(
            best, sample, min_samples_required=self.min_samples_required, mode=self.mode
        )
        if verdict is None or not verdict[0]:
            return Decision.CONTINUE, None
        return Decision.STOP, median_stop_reason(
            time_attr=self.time_attr,
            time=time,
            metric=self.metric,
            mode=self.mode,
            best=best,
            median=verdict[1],
            samples=sample.count,
            hard_stop=hard_stop,
        )

    def judge(
        self,
        state: MedianState,
        trial_id: str,
        *,
        iteration: int,
        time: float,
        value: float,
        best: float,
        hard_stop: bool = True,
    ) -> MedianVerdict:
        """The rule on result ``iteration`` of ``trial_id`` at ``time`` with ``value``, the trial's
        best so far (this result's value included) being ``best``: it is added to the trial's
        running mean in ``state`` (from grace_period on) and judged there, once."""
        if time < self.grace_period:
            return MedianVerdict(Decision.CONTINUE)
        samples: list[int] = []

        def decide(means: MeanSample) -> tuple[Decision, str | None]:
            samples.append(means.count)
            return self.verdict(best, time, means, hard_stop=hard_stop)

        point = state.record(trial_id, iteration=iteration, time=time, value=value, decide=decide)
        reason = point.reason if point.decision is Decision.STOP else None
        return MedianVerdict(point.decision, reason, samples[0] if samples else None)

    def at_end(
        self, state: MedianState, trial_id: str, *, iteration: int, time: float, value: float
    ) -> None:
        """The trial ended: its last result is added again, as Ray Tune's ``on_trial_complete``
        adds it (not judged). ValueError for a time before the trial's last."""
        if time >= self.grace_period:
            state.record(trial_id, iteration=iteration, time=time, value=value, at_end=True)


MEDIAN = "median"
