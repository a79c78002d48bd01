"""The median stopping rule (Google Vizier), deciding exactly as Ray Tune 2.60's MedianStoppingRule."""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from airflow_trials.core.result import Result
from airflow_trials.core.scheduler import Decision, MetricScheduler, format_number
from airflow_trials.core.status import TrialStatus
from airflow_trials.core.trial import Trial

_WAITING = (TrialStatus.PENDING, TrialStatus.PAUSED)


@dataclass
class _History:
    """What the rule keeps of one trial: no results, only what its decisions read."""

    last_time: float
    best: float
    # The time of each result at or after grace_period, and the running sum of the metric up to
    # it: a running mean up to any time is one bisection away.
    times: list[float] = field(default_factory=list)
    sums: list[float] = field(default_factory=list)

    def mean_until(self, time: float) -> float:
        """The mean of the metric over the results from grace_period to ``time``; NaN if none."""
        count = bisect.bisect_right(self.times, time)
        return self.sums[count - 1] / count if count else math.nan


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
    *, time_attr: str, time: float, metric: str, mode: str, best: float, median: float, samples: int,
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
    """:class:`MeanSample` over means held in memory; NaNs and infinities are left out, as Ray leaves them."""

    def __init__(self, means: Iterable[float]) -> None:
        self._sorted = sorted(m for m in means if math.isfinite(m))
        self.count = len(self._sorted)

    def median(self) -> float:
        return _median(self._sorted)


def median_rule_verdict(
    best: float, means: MeanSample | Iterable[float], *, min_samples_required: int, mode: str
) -> tuple[bool, float] | None:
    """The median rule's verdict on a trial whose best so far is ``best``, against the other
    trials' running means at this time (finite ones only): ``(stop, median)``; None when there are
    fewer than ``min_samples_required`` of them. A best strictly worse than the median stops; as
    Ray compares, a NaN best counts as worse than any median."""
    sample = means if isinstance(means, MeanSample) else MeanList(means)
    if sample.count < min_samples_required:
        return None
    median = sample.median()
    keep = (best >= median) if mode == "max" else (best <= median)
    return (not keep, median)


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

    The rule keeps, per trial, its best value, its latest time and a running sum per result; it
    never re-reads results. So ``time_attr`` must not decrease within a trial (Ray Tune asks the
    same): a result whose time goes back raises ValueError.

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
    ) -> None:
        super().__init__(metric, mode)
        if min_samples_required < 1:
            raise ValueError(
                f"MedianStoppingRule got min_samples_required={min_samples_required}: a median needs at "
                f"least one other trial's mean; use 1 or more (default 3)."
            )
        self.time_attr = time_attr
        self.grace_period = grace_period
        self.min_samples_required = min_samples_required
        self.min_time_slice = min_time_slice
        self.hard_stop = hard_stop
        self._histories: dict[str, _History] = {}
        self._stopped: set[str] = set()
        self._last_pause: dict[str, float] = {}
        self._live: dict[str, Trial] = {}  # added and not ended: their statuses tell who waits

    def on_trial_add(self, trial: Trial) -> None:
        self._check_ready(trial)
        self._live[trial.trial_id] = trial

    def on_trial_result(self, trial: Trial, result: Result) -> Decision:
        time = self._number(trial, result, self.time_attr, "time_attr")
        value = self._number(trial, result, str(self.metric), "metric")
        if trial.trial_id in self._stopped:
            return Decision.CONTINUE  # it was paused by the rule and resumed: it runs on, FIFO
        self._check_time(trial, time)
        self._record(trial.trial_id, time, value)
        if time < self.grace_period:
            return Decision.CONTINUE
        means = [
            mean
            for trial_id, history in self._histories.items()
            if trial_id != trial.trial_id and history.last_time >= time
            for mean in (history.mean_until(time),)
            if math.isfinite(mean)
        ]
        best = self._histories[trial.trial_id].best
        verdict = median_rule_verdict(best, means, min_samples_required=self.min_samples_required, mode=str(self.mode))
        if verdict is None:
            return self._on_insufficient_samples(trial, time, len(means))
        stop, median = verdict
        if not stop:
            return Decision.CONTINUE
        self._stopped.add(trial.trial_id)
        self._reasons[trial.trial_id] = median_stop_reason(
            time_attr=self.time_attr, time=time, metric=str(self.metric), mode=str(self.mode), best=best,
            median=median, samples=len(means), hard_stop=self.hard_stop,
        )
        return Decision.STOP if self.hard_stop else Decision.PAUSE

    def _check_time(self, trial: Trial, time: float) -> None:
        history = self._histories.get(trial.trial_id)
        if history is not None and time < history.last_time:
            raise ValueError(
                f"Trial {trial.trial_id} reported {self.time_attr}={format_number(time)} after "
                f"{format_number(history.last_time)}: MedianStoppingRule needs a time_attr that never "
                f"decreases within a trial; use training_iteration or time_total_s."
            )

    def _record(self, trial_id: str, time: float, value: float) -> None:
        history = self._histories.get(trial_id)
        if history is None:
            history = self._histories[trial_id] = _History(time, value)
        else:
            history.last_time = time
            history.best = better_of(history.best, value, str(self.mode))
        if time >= self.grace_period:
            history.times.append(time)
            history.sums.append(history.sums[-1] + value if history.sums else value)

    def _on_insufficient_samples(self, trial: Trial, time: float, samples: int) -> Decision:
        waiting = any(other.status in _WAITING for other in self._live.values())
        if not waiting or time - self._last_pause.get(trial.trial_id, -math.inf) <= self.min_time_slice:
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
        history = self._histories.get(trial.trial_id)
        # A trial can end before it reported anything, or with a replayed result: nothing to add.
        if time is None or value is None or (history is not None and time < history.last_time):
            return
        self._record(trial.trial_id, time, value)

    def on_trial_remove(self, trial: Trial) -> None:
        self._live.pop(trial.trial_id, None)

    def on_trial_error(self, trial: Trial) -> None:
        self._live.pop(trial.trial_id, None)

    def debug_string(self) -> str:
        return f"Using MedianStoppingRule: num_stopped={len(self._stopped)}."
