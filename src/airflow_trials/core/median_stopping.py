"""The median stopping rule (Google Vizier), deciding as Ray Tune 2.60's MedianStoppingRule."""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol, cast, runtime_checkable

from airflow_trials.core.result import Result
from airflow_trials.core.scheduler import (
    Decision,
    MetricScheduler,
    RecordedVerdict,
    experiment_metric_and_mode,
    format_number,
)
from airflow_trials.core.status import TrialStatus
from airflow_trials.core.trial import Trial

_WAITING = (TrialStatus.PENDING, TrialStatus.PAUSED)


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[middle]
    return (ordered[middle - 1] + ordered[middle]) / 2


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


@runtime_checkable
class MeanSample(Protocol):
    """The other trials' finite running means at a time, as much as the rule reads of them.

    :class:`MeanList` holds them all (in memory); the trials store answers from SQL, counting them
    and reading only the one or two in the middle.
    """

    @property
    def count(self) -> int:
        """How many finite means."""

    def median(self) -> float:
        """Their median (the mean of the two middle ones for an even count); count >= 1."""


class MeanList:
    """:class:`MeanSample` over means held in memory; NaNs and infinities are left out, as Ray
    leaves them."""

    def __init__(self, means: Iterable[float]) -> None:
        self._sorted = sorted(m for m in means if math.isfinite(m))
        self.count = len(self._sorted)

    def median(self) -> float:
        return _median(self._sorted)


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


#: The reason stored with a trial's last result, added again when it ends (not a verdict).
AT_END_REASON = (
    "recorded when the trial ended, as the median stopping rule keeps a trial's last result"
)

MedianDecide = Callable[[MeanSample], tuple[Decision, str | None]]
"""Judges a result from the other trials' running means at its time (``MedianRule.verdict``)."""


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
    """:class:`MedianState` in memory, for the runner's :class:`MedianStoppingRule`."""

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
    :class:`MedianStoppingRule` judges with it over :class:`MemoryMeans`, and adds Ray Tune's
    pauses; a trial's trigger on the Airflow path judges with it over the trials store, as
    ``hard_stop=True`` decides when no trial waits to run: where too few other trials have a
    mean, Ray Tune pauses the trial if others wait to run, so that they start; a deferred task
    cannot be paused and frees no Ray resource by waiting, so there the trial continues.

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


#: The key a serialized :class:`MedianRule` carries (AshaRungs' dicts have none, as before it).
RULE_KEY = "rule"
MEDIAN = "median"


@dataclass
class _Seen:
    """What the scheduler keeps of a trial besides its running means: its latest time and best."""

    last_time: float
    best: float


class MedianStoppingRule(MetricScheduler):
    """The median stopping rule of Google Vizier (https://research.google.com/pubs/pub46180.html),
    as Ray Tune 2.60's.

    At each result with ``time_attr >= grace_period``, the trial's best metric so far is compared
    with the median of the other trials' running means: for each trial whose latest result is at
    or past this time, the mean of its metric over its results from ``grace_period`` to this time
    (means that are NaN or infinite are left out). Strictly worse than the median, the trial is
    stopped (paused with ``hard_stop=False``; after that the rule lets it run). When fewer than
    ``min_samples_required`` means exist and other trials wait to run (PENDING or PAUSED), the
    trial is paused to yield its resources, at most once every ``min_time_slice``; note that this
    happens with ``hard_stop=True`` too, as in Ray Tune. :meth:`decision_reason` tells why.

    The rule is :class:`MedianRule`'s ``judge``, the one a trial's trigger judges with on the
    Airflow path; this class adds the hooks and the pauses. It keeps, per trial, its best value
    and its latest time, and the running means in ``state`` (in memory by default); it never
    re-reads results. So ``time_attr`` must not decrease within a trial (Ray Tune asks the same):
    a result whose time goes back raises ValueError.

    Example::

        scheduler = MedianStoppingRule(metric="loss", mode="min", time_attr="training_iteration",
                                       grace_period=5)

    :param time_attr: the result key measuring progress; default ``"time_total_s"``.
    :param metric: the result key judged; default None (then set_search_properties must set it).
    :param mode: ``"min"`` or ``"max"``; default None (likewise).
    :param grace_period: no trial is judged before this much ``time_attr``, and running means start
        here; default 60.0.
    :param min_samples_required: the fewest other trials' means to take a median of; default 3.
    :param min_time_slice: the least ``time_attr`` a trial runs between two pauses for lack of
        samples; default 0.
    :param hard_stop: stop trials worse than the median; False pauses them instead. Default True.
    :param state: where the running means live; default a new :class:`MemoryMeans`. The trials
        DB's (``store.median.StoredMeans``) decides the same.
    """

    def __init__(
        self,
        time_attr: str = "time_total_s",
        metric: str | None = None,
        mode: str | None = None,
        grace_period: float = 60.0,
        min_samples_required: int = 3,
        min_time_slice: float = 0,
        hard_stop: bool = True,
        *,
        state: MedianState | None = None,
    ) -> None:
        super().__init__(metric, mode)
        if min_samples_required < 1:
            raise ValueError(
                f"MedianStoppingRule got min_samples_required={min_samples_required}: a median "
                f"needs at least one other trial's mean; use 1 or more (default 3)."
            )
        self.time_attr = time_attr
        self.grace_period = grace_period
        self.min_samples_required = min_samples_required
        self.min_time_slice = min_time_slice
        self.hard_stop = hard_stop
        self.state: MedianState = state if state is not None else MemoryMeans()
        self._rule: MedianRule | None = None  # made once metric and mode are known
        self._seen: dict[str, _Seen] = {}
        self._iterations: dict[str, int] = {}  # orders a trial's results for the state
        self._stopped: set[str] = set()
        self._last_pause: dict[str, float] = {}
        self._live: dict[str, Trial] = {}  # added and not ended: their statuses tell who waits

    def rule(self, metric: str | None = None, mode: str | None = None) -> MedianRule:
        """The rule this scheduler judges by: its settings, with its metric and mode or, where it
        has none, the experiment's ``metric`` and ``mode`` (ValueError where they disagree)."""
        chosen = experiment_metric_and_mode(self, metric, mode, "MedianStoppingRule")
        return MedianRule(
            metric=chosen[0],
            mode=chosen[1],
            time_attr=self.time_attr,
            grace_period=self.grace_period,
            min_samples_required=self.min_samples_required,
        )

    def on_trial_add(self, trial: Trial) -> None:
        self._check_ready(trial)
        if self._rule is None:
            self._rule = self.rule()
        self._live[trial.trial_id] = trial

    def on_trial_result(self, trial: Trial, result: Result) -> Decision:
        time = self._number(trial, result, self.time_attr, "time_attr")
        value = self._number(trial, result, str(self.metric), "metric")
        if trial.trial_id in self._stopped:
            return Decision.CONTINUE  # it was paused by the rule and resumed: it runs on, FIFO
        self._check_time(trial, time)
        best = self._record(trial.trial_id, time, value)
        verdict = self._judged_rule(trial).judge(
            self.state,
            trial.trial_id,
            iteration=self._next_iteration(trial.trial_id),
            time=time,
            value=value,
            best=best,
            hard_stop=self.hard_stop,
        )
        if verdict.samples is not None and verdict.samples < self.min_samples_required:
            return self._on_insufficient_samples(trial, time, verdict.samples)
        if verdict.decision is not Decision.STOP:
            return Decision.CONTINUE
        self._stopped.add(trial.trial_id)
        self._reasons[trial.trial_id] = str(verdict.reason)
        return Decision.STOP if self.hard_stop else Decision.PAUSE

    def _judged_rule(self, trial: Trial) -> MedianRule:
        if self._rule is None:
            self._check_ready(trial)  # raises without metric or mode
            self._rule = self.rule()
        return self._rule

    def _next_iteration(self, trial_id: str) -> int:
        iteration = self._iterations[trial_id] = self._iterations.get(trial_id, 0) + 1
        return iteration

    def _check_time(self, trial: Trial, time: float) -> None:
        seen = self._seen.get(trial.trial_id)
        if seen is not None and time < seen.last_time:
            raise ValueError(
                f"Trial {trial.trial_id} reported {self.time_attr}={format_number(time)} after "
                f"{format_number(seen.last_time)}: MedianStoppingRule needs a time_attr that "
                f"never decreases within a trial; use training_iteration or time_total_s."
            )

    def _record(self, trial_id: str, time: float, value: float) -> float:
        """Note the trial's latest time and best after ``value``; returns that best."""
        seen = self._seen.get(trial_id)
        if seen is None:
            seen = self._seen[trial_id] = _Seen(time, value)
        else:
            seen.last_time = time
            seen.best = better_of(seen.best, value, str(self.mode))
        return seen.best

    def _on_insufficient_samples(self, trial: Trial, time: float, samples: int) -> Decision:
        waiting = any(other.status in _WAITING for other in self._live.values())
        last_pause = self._last_pause.get(trial.trial_id, -math.inf)
        if not waiting or time - last_pause <= self.min_time_slice:
            return Decision.CONTINUE
        self._last_pause[trial.trial_id] = time
        self._reasons[trial.trial_id] = (
            f"paused by the median stopping rule at {self.time_attr}={format_number(time)}: "
            f"{samples} other trials have a running mean there (min_samples_required="
            f"{self.min_samples_required}) and trials wait to run; it yields its resources to them"
        )
        return Decision.PAUSE

    def on_trial_complete(self, trial: Trial, result: Result) -> None:
        self._live.pop(trial.trial_id, None)
        time = self._optional_number(result, self.time_attr)
        value = self._optional_number(result, str(self.metric))
        seen = self._seen.get(trial.trial_id)
        # A trial can end before it reported anything, or with a replayed result: nothing to add.
        if time is None or value is None or (seen is not None and time < seen.last_time):
            return
        self._record(trial.trial_id, time, value)
        self._judged_rule(trial).at_end(
            self.state,
            trial.trial_id,
            iteration=self._iterations.get(trial.trial_id, 0),
            time=time,
            value=value,
        )

    def on_trial_remove(self, trial: Trial) -> None:
        self._live.pop(trial.trial_id, None)

    def on_trial_error(self, trial: Trial) -> None:
        self._live.pop(trial.trial_id, None)

    def debug_string(self) -> str:
        return f"Using MedianStoppingRule: num_stopped={len(self._stopped)}."
