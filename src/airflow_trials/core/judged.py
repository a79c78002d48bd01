"""The schedulers the Airflow path can run, as the plain settings a trial's trigger judges by.

Each trial task is watched by a trigger of its own, so a scheduler that compares trials keeps
what it compares in the trials store, and the trigger judges each of its trial's results against
it. Two of Ray Tune's schedulers decide that way, one result of one trial at a time:

- ``ASHAScheduler`` / ``AsyncHyperBandScheduler``: :class:`~airflow_trials.core.rungs.AshaRungs`
  (one row per trial and rung);
- ``MedianStoppingRule``: :class:`MedianRule` (one running mean per trial and result from
  ``grace_period``).

:func:`judged_scheduler` turns the user's scheduler into one of them, checked against the
experiment's metric and mode; :func:`judged_from_dict` reads one back from an operator's or a
trigger's serialized settings. HyperBand and PBT pause and resume trials together, or clone one
trial into another: a deferred task cannot be paused, so they run on the TrialRunner.

Example::

    rule = judged_scheduler(MedianStoppingRule(time_attr="training_iteration", grace_period=3),
                            metric="loss", mode="min")
    rule.hold_spec(bracket=0)   # {"time_attr": "training_iteration", "points": [], "every_from": 3.0}
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

from airflow_trials.core.median_stopping import (
    MeanList,
    MeanSample,
    MedianStoppingRule,
    median_rule_verdict,
    median_stop_reason,
)
from airflow_trials.core.rungs import AshaRungs
from airflow_trials.core.scheduler import Decision, experiment_metric_and_mode

#: The key a serialized :class:`MedianRule` carries (AshaRungs' dicts have none, as before it).
RULE_KEY = "rule"
MEDIAN = "median"


@dataclass(frozen=True)
class MedianRule:
    """The median stopping rule judged from running means kept in the trials store.

    Decides as :class:`~airflow_trials.core.median_stopping.MedianStoppingRule` with
    ``hard_stop=True`` decides when no trial waits to run: at each result with ``time_attr >=
    grace_period`` it compares the trial's best so far with the median of the other trials'
    running means at that time (:meth:`verdict`). Where too few other trials have a mean there,
    Ray Tune pauses the trial if others wait to run, so that they start; a deferred task cannot be
    paused and frees no Ray resource by waiting, so here the trial continues.

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
            raise ValueError(f"MedianStoppingRule's mode must be 'min' or 'max', got {self.mode!r}.")
        if not self.min_samples_required >= 1:
            raise ValueError(f"MedianStoppingRule got min_samples_required={self.min_samples_required}: use 1 or more.")

    @classmethod
    def from_scheduler(cls, scheduler: MedianStoppingRule, metric: str, mode: str) -> MedianRule:
        if not scheduler.hard_stop:
            raise ValueError(
                "MedianStoppingRule(hard_stop=False) pauses the trials it judges worse, to resume them later; "
                "a deferred trial task cannot be paused on the Airflow path. Use hard_stop=True (the default), "
                "or run the rule on the TrialRunner (docs/engine.md)."
            )
        return cls(metric=metric, mode=mode, time_attr=scheduler.time_attr, grace_period=scheduler.grace_period,
                   min_samples_required=scheduler.min_samples_required)

    def to_dict(self) -> dict[str, Any]:
        """Plain values (an operator's argument, a trigger's serialized field); :func:`judged_from_dict` reads them."""
        return {RULE_KEY: MEDIAN, **asdict(self)}

    def draw_bracket(self, uniform: float) -> int:  # noqa: ARG002 - the rule has no brackets
        return 0

    def hold_spec(self, bracket: int) -> dict[str, Any]:  # noqa: ARG002
        """The actor waits for a verdict at every result from ``grace_period``: each is judged."""
        return {"time_attr": self.time_attr, "points": [], "every_from": float(self.grace_period)}

    def verdict(self, best: float, time: float, means: MeanSample | Iterable[float]) -> tuple[Decision, str | None]:
        """The verdict on a result at ``time`` of a trial whose best so far is ``best``, given the
        other trials' running means there (non-finite ones are left out, as Ray leaves them)."""
        sample = means if isinstance(means, MeanSample) else MeanList(means)
        verdict = median_rule_verdict(best, sample, min_samples_required=self.min_samples_required, mode=self.mode)
        if verdict is None or not verdict[0]:
            return Decision.CONTINUE, None
        return Decision.STOP, median_stop_reason(
            time_attr=self.time_attr, time=time, metric=self.metric, mode=self.mode, best=best,
            median=verdict[1], samples=sample.count,
        )


JudgedScheduler = AshaRungs | MedianRule


def judged_scheduler(scheduler: Any, metric: str | None = None, mode: str | None = None) -> JudgedScheduler:
    """The Airflow path's settings of ``scheduler``: its metric and mode, or the experiment's where
    it has none (as Ray Tune's Tuner fills them from TuneConfig). ValueError, naming the fix, for a
    scheduler the Airflow path cannot run or one that disagrees with the experiment."""
    if not isinstance(scheduler, MedianStoppingRule):
        return AshaRungs.from_scheduler(scheduler, metric, mode)
    chosen_metric, chosen_mode = experiment_metric_and_mode(scheduler, metric, mode, "MedianStoppingRule")
    return MedianRule.from_scheduler(scheduler, chosen_metric, chosen_mode)


def judged_from_dict(settings: dict[str, Any]) -> JudgedScheduler:
    """A scheduler's settings back from :meth:`to_dict` (``AshaRungs``' or :class:`MedianRule`'s)."""
    values = dict(settings)
    if values.pop(RULE_KEY, None) == MEDIAN:
        return MedianRule(**values)
    return AshaRungs(**values)
