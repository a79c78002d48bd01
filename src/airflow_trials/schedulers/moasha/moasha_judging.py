"""MOASHA on the Airflow path: how a trial's trigger judges its results (:class:`MoashaJudging`,
:meth:`MOASHARungs.judge <airflow_trials.schedulers.moasha.moasha_scheduler.MOASHARungs.judge>`
over the run's rungs in the trials DB), and the slice the registry finds (``SLICE``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from airflow_trials.core import result as R
from airflow_trials.schedulers.asha.stored_rungs import KnownRungs, StoredVectorRungs
from airflow_trials.schedulers.moasha.moasha_scheduler import (
    MOASHA,
    MOASHA_RULE,
    MetricVector,
    MOASHARungs,
)
from airflow_trials.schedulers.trial_judge import (
    Judge,
    JudgedSlice,
    MissingSchedulerKey,
    Verdict,
    stop_kind,
)
from airflow_trials.store.scheduler_state import SchedulerState

__all__ = ["SLICE", "MoashaJudging", "VectorRungJudge"]


class MoashaJudging:
    """One trial's MOASHA verdicts over the run's rungs in the trials store
    (:class:`~airflow_trials.schedulers.asha.stored_rungs.StoredVectorRungs`), each result's
    metrics read by ``MOASHARungs.values_of``.

    :param rungs: MOASHA's rule.
    :param bracket: the trial's bracket, drawn once per trial.
    :param experiment_run_id: the run whose trials share the rungs.
    :param trial_id: the trial.
    """

    name = "MOASHA"

    def __init__(
        self, rungs: MOASHARungs, bracket: int, experiment_run_id: int, trial_id: str
    ) -> None:
        self.rungs, self.bracket = rungs, bracket
        self.experiment_run_id, self.trial_id = experiment_run_id, trial_id
        self._known: KnownRungs = {}

    def open(self, state: SchedulerState) -> StoredVectorRungs:
        return StoredVectorRungs(state, self.experiment_run_id, self._known)

    def remember(self, view: StoredVectorRungs) -> None:
        self._known.update(view.trials)

    def carries(self, result: Mapping[str, Any]) -> bool:
        return all(key in result for key in (self.rungs.time_attr, *self.rungs.metric))

    def judge(self, view: StoredVectorRungs, result: Mapping[str, Any]) -> Verdict:
        iteration, time, values = self._read(result)
        decision, reason = self.rungs.judge(
            view, self.trial_id, self.bracket, time=time, values=values, iteration=iteration
        )
        kind = stop_kind(decision, self.rungs.reached_max_t(time))
        return Verdict(iteration, decision, reason, kind)

    def end(self, view: StoredVectorRungs, last_result: Mapping[str, Any]) -> None:
        iteration, time, values = self._read(last_result)
        self.rungs.judge(
            view,
            self.trial_id,
            self.bracket,
            time=time,
            values=values,
            iteration=iteration,
            at_end=True,
        )

    def _read(self, result: Mapping[str, Any]) -> tuple[int, float, MetricVector]:
        """The result's iteration, time and metric values; MissingSchedulerKey names what it
        lacks or what is not a number."""
        iteration = result.get(R.TRAINING_ITERATION)
        if not isinstance(iteration, int):
            raise MissingSchedulerKey(
                f"result {iteration} of trial {self.trial_id} has no 'training_iteration', which "
                f"MOASHA orders a trial's results by; report results through "
                f"airflow_trials.report, which numbers them"
            )
        try:
            values = self.rungs.values_of(self.trial_id, result)
        except ValueError as e:
            raise MissingSchedulerKey(f"result {iteration}: {e}") from e
        return iteration, float(result[self.rungs.time_attr]), values


class VectorRungJudge(Judge):
    """The :class:`~airflow_trials.schedulers.trial_judge.Judge` of one trial under MOASHA."""

    def __init__(
        self, rungs: MOASHARungs, bracket: int, experiment_run_id: int, trial_id: str
    ) -> None:
        super().__init__(MoashaJudging(rungs, bracket, experiment_run_id, trial_id))


def _settings(scheduler: MOASHA, metric: Any, mode: Any) -> MOASHARungs:
    return scheduler.rule(metric, mode)


#: MOASHA's slice, as :mod:`~airflow_trials.schedulers.registry` finds it.
SLICE = JudgedSlice(
    name="MOASHA",
    scheduler=MOASHA,
    settings_type=MOASHARungs,
    rule_key=MOASHA_RULE,
    settings=_settings,
    judge=VectorRungJudge,
)
