"""The median stopping rule on the Airflow path: how a trial's trigger judges its results
(:class:`MedianJudging`, :meth:`MedianRule.judge
<airflow_trials.schedulers.median.median_rule.MedianRule.judge>` over the run's running means in
the trials DB), and the slice the registry finds (``SLICE``)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from airflow_trials.schedulers.median.median_rule import MEDIAN, MedianRule, better_of
from airflow_trials.schedulers.median.median_stopping import MedianStoppingRule
from airflow_trials.schedulers.median.stored_means import StoredMeans
from airflow_trials.schedulers.trial_judge import (
    Judge,
    JudgedSlice,
    MissingSchedulerKey,
    Verdict,
    number,
    read_result,
)
from airflow_trials.store.scheduler_state import SchedulerState

__all__ = ["SLICE", "MedianJudge", "MedianJudging"]


@dataclass
class MeansView:
    """The median rule's state in one write, and the trial's best value so far."""

    state: SchedulerState
    means: StoredMeans
    best: float | None


class MedianJudging:
    """One trial's median-rule verdicts over the run's running means in the trials store
    (:class:`~airflow_trials.schedulers.median.stored_means.StoredMeans`).

    The trial's best so far (over all its results) is kept here, read once from its stored
    results when it first judges (after a triggerer restart, say).

    :param rule: the rule.
    :param experiment_run_id: the run whose trials the rule compares.
    :param trial_id: the trial.
    """

    name = "MedianStoppingRule"

    def __init__(self, rule: MedianRule, experiment_run_id: int, trial_id: str) -> None:
        self.rule = rule
        self.experiment_run_id, self.trial_id = experiment_run_id, trial_id
        self._best: float | None = None  # the best value of the results judged so far

    def open(self, state: SchedulerState) -> MeansView:
        return MeansView(state, StoredMeans(state, self.experiment_run_id), self._best)

    def remember(self, view: MeansView) -> None:
        self._best = view.best

    def carries(self, result: Mapping[str, Any]) -> bool:
        return self.rule.metric in result and self.rule.time_attr in result

    def _read(self, result: Mapping[str, Any]) -> tuple[int, float, float]:
        return read_result(result, self.trial_id, self.name, self.rule.metric, self.rule.time_attr)

    def judge(self, view: MeansView, result: Mapping[str, Any]) -> Verdict:
        iteration, time, value = self._read(result)
        best = self._best_after(view, iteration, value)
        try:
            verdict = self.rule.judge(
                view.means, self.trial_id, iteration=iteration, time=time, value=value, best=best
            )
        except ValueError as e:  # its time went back: the rule cannot judge it
            raise MissingSchedulerKey(f"trial {self.trial_id}: {e}") from e
        return Verdict(iteration, verdict.decision, verdict.reason)

    def end(self, view: MeansView, last_result: Mapping[str, Any]) -> None:
        """Add the trial's last result again, as Ray Tune's rule does (not acted on)."""
        iteration, time, value = self._read(last_result)
        try:
            self.rule.at_end(view.means, self.trial_id, iteration=iteration, time=time, value=value)
        except ValueError:
            # A replayed last result, before the trial's latest time: the rule adds nothing
            # (Ray alike).
            return

    def _best_after(self, view: MeansView, iteration: int, value: float) -> float:
        if view.best is None:
            earlier = view.state.results_before(self.trial_id, iteration)
            best = math.nan
            for index, previous in enumerate(earlier):
                found = number(previous.get(self.rule.metric))
                best = found if index == 0 else better_of(best, found, self.rule.mode)
            view.best = value if not earlier else better_of(best, value, self.rule.mode)
        else:
            view.best = better_of(view.best, value, self.rule.mode)
        return view.best


class MedianJudge(Judge):
    """The :class:`~airflow_trials.schedulers.trial_judge.Judge` of one trial under the median
    stopping rule."""

    def __init__(self, rule: MedianRule, experiment_run_id: int, trial_id: str) -> None:
        super().__init__(MedianJudging(rule, experiment_run_id, trial_id))


def _settings(scheduler: MedianStoppingRule, metric: Any, mode: Any) -> MedianRule:
    rule = scheduler.rule(metric, mode)
    if not scheduler.hard_stop:
        raise ValueError(
            "MedianStoppingRule(hard_stop=False) pauses the trials it judges worse, to resume "
            "them later; a deferred trial task cannot be paused on the Airflow path. Use "
            "hard_stop=True (the default), or run the rule on the TrialRunner (docs/engine.md)."
        )
    return rule


def _judge(rule: MedianRule, bracket: int, experiment_run_id: int, trial_id: str) -> MedianJudge:
    del bracket  # the rule has no brackets
    return MedianJudge(rule, experiment_run_id, trial_id)


#: The median stopping rule's slice, as :mod:`~airflow_trials.schedulers.registry` finds it.
SLICE = JudgedSlice(
    name="MedianStoppingRule",
    scheduler=MedianStoppingRule,
    settings_type=MedianRule,
    rule_key=MEDIAN,
    settings=_settings,
    judge=_judge,
)
