"""ASHA on the Airflow path: how a trial's trigger judges its results (:class:`AshaJudging`,
``AshaRungs.judge`` over the run's rungs in the trials DB), and the slice the registry finds
(``SLICE``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from airflow_trials.schedulers.asha.asha_rungs import AshaRungs
from airflow_trials.schedulers.asha.async_hyperband import AsyncHyperBandScheduler
from airflow_trials.schedulers.asha.stored_rungs import KnownRungs, StoredRungs
from airflow_trials.schedulers.trial_judge import (
    Judge,
    JudgedSlice,
    Verdict,
    read_result,
    stop_kind,
)
from airflow_trials.store.scheduler_state import SchedulerState

__all__ = ["SLICE", "AshaJudging", "RungJudge"]


class AshaJudging:
    """One trial's ASHA verdicts over the run's rungs in the trials store
    (:class:`~airflow_trials.schedulers.asha.stored_rungs.StoredRungs`), the trial's rungs
    remembered between writes.

    :param rungs: ASHA's rule.
    :param bracket: the trial's bracket, drawn once per trial.
    :param experiment_run_id: the run whose trials share the rungs.
    :param trial_id: the trial.
    """

    name = "ASHAScheduler"

    def __init__(
        self, rungs: AshaRungs, bracket: int, experiment_run_id: int, trial_id: str
    ) -> None:
        self.rungs, self.bracket = rungs, bracket
        self.experiment_run_id, self.trial_id = experiment_run_id, trial_id
        self._known: KnownRungs = {}

    def open(self, state: SchedulerState) -> StoredRungs:
        return StoredRungs(state, self.experiment_run_id, self._known)

    def remember(self, view: StoredRungs) -> None:
        self._known.update(view.trials)

    def carries(self, result: Mapping[str, Any]) -> bool:
        return self.rungs.metric in result and self.rungs.time_attr in result

    def _read(self, result: Mapping[str, Any]) -> tuple[int, float, float]:
        return read_result(
            result, self.trial_id, self.name, self.rungs.metric, self.rungs.time_attr
        )

    def judge(self, view: StoredRungs, result: Mapping[str, Any]) -> Verdict:
        iteration, time, value = self._read(result)
        decision, reason = self.rungs.judge(
            view, self.trial_id, self.bracket, time=time, value=value, iteration=iteration
        )
        kind = stop_kind(decision, self.rungs.reached_max_t(time))
        return Verdict(iteration, decision, reason, kind)

    def end(self, view: StoredRungs, last_result: Mapping[str, Any]) -> None:
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


class RungJudge(Judge):
    """The :class:`~airflow_trials.schedulers.trial_judge.Judge` of one trial under ASHA."""

    def __init__(
        self, rungs: AshaRungs, bracket: int, experiment_run_id: int, trial_id: str
    ) -> None:
        super().__init__(AshaJudging(rungs, bracket, experiment_run_id, trial_id))


def _settings(scheduler: AsyncHyperBandScheduler, metric: Any, mode: Any) -> AshaRungs:
    return scheduler.rule(metric, mode)


#: ASHA's slice, as :mod:`~airflow_trials.schedulers.registry` finds it.
SLICE = JudgedSlice(
    name="ASHAScheduler",
    scheduler=AsyncHyperBandScheduler,
    settings_type=AshaRungs,
    rule_key=None,
    settings=_settings,
    judge=RungJudge,
)
