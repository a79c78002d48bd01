"""The median stopping rule (Google Vizier), deciding as Ray Tune 2.60's MedianStoppingRule."""

from __future__ import annotations

import math
from dataclasses import dataclass

from airflow_trials.core.result import Result
from airflow_trials.core.scheduler import (
    Decision,
    MetricScheduler,
    experiment_metric_and_mode,
    format_number,
)
from airflow_trials.core.status import TrialStatus
from airflow_trials.core.trial import Trial
from airflow_trials.schedulers.median.median_rule import (
    MeanList,
    MeanSample,
    MedianRule,
    MedianState,
    MemoryMeans,
    better_of,
)

# The scheduler; the rule's running means, which tests and benchmarks import from here as well.
__all__ = ["MeanList", "MeanSample", "MedianStoppingRule", "MemoryMeans"]

_WAITING = (TrialStatus.PENDING, TrialStatus.PAUSED)


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
