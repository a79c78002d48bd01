"""A run's trials at once, slim: their ids, configs and where each stands, read in one query
without their results, as a sweep's driver, its trigger and ``select_best`` read 100,000 of them."""

from __future__ import annotations

from typing import Any, NamedTuple

from sqlalchemy import select
from sqlalchemy.orm import Session

from airflow_trials.core.status import TrialStatus
from airflow_trials.store.models import TrialRow


class TrialState(NamedTuple):
    """One trial of a run, as :meth:`~airflow_trials.store.TrialReader.run_trial_states` reads it.

    :param trial_id: the trial. :param config: its config. :param status: its status.
    :param started: whether it ever went RUNNING. :param num_failures: failures so far.
    :param try_number: the Airflow try it is registered with; None outside Airflow.
    """

    trial_id: str
    config: dict[str, Any]
    status: TrialStatus
    started: bool
    num_failures: int
    try_number: int | None

    @property
    def never_started(self) -> bool:
        """Registered and never run: PENDING, never RUNNING, no failure (a sweep registers all
        its trials before its driver starts any)."""
        return self.status is TrialStatus.PENDING and not self.started and not self.num_failures


def run_trial_states(session: Session, experiment_run_id: int) -> list[TrialState]:
    """The trials of the run, ordered as ``list_trials`` orders them (registered, then id)."""
    query = (
        select(
            TrialRow.trial_id,
            TrialRow.config,
            TrialRow.status,
            TrialRow.started_at.is_not(None),
            TrialRow.num_failures,
            TrialRow.try_number,
        )
        .where(TrialRow.experiment_run_id == experiment_run_id)
        .order_by(TrialRow.created_at, TrialRow.trial_id)
    )
    # In batches, each config kept as decoded: 100,000 rows are never all buffered twice.
    rows = session.execute(query.execution_options(yield_per=2000))
    return [
        TrialState(trial_id, config or {}, TrialStatus(status), bool(started), failures, tn)
        for trial_id, config, status, started, failures, tn in rows
    ]
