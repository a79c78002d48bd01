"""RunDeleter: deletes one experiment run and everything recorded of it, in one transaction.

What it deletes: the run's row, its trials, and every row that names the run or one of its trials
(results, checkpoints, ASHA's rungs, the median rule's points, PBT's exploits, its extensions).
It refuses a run that is still RUNNING, or that has a trial not ended (TERMINATED or ERROR), and
lets the caller refuse the checkpoint paths before anything is deleted. The checkpoint files are
not the store's: it returns their paths, and the caller (``airflow-trials db delete-run``) deletes
them through the storage once the rows are gone.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import delete, func, or_, select
from sqlalchemy.orm import Session

from airflow_trials.core.status import TrialStatus
from airflow_trials.store.base import StoreBase
from airflow_trials.store.models import (
    CheckpointRow,
    ExperimentRow,
    ExperimentRunRow,
    ResultRow,
    RunApprovalRow,
    RunExtensionRow,
    TrialExploitRow,
    TrialMedianPointRow,
    TrialRow,
    TrialRungRow,
)
from airflow_trials.store.records import ExperimentRunStatus


@dataclasses.dataclass(frozen=True)
class RunDeletion:
    """What deleting a run removes (or, with ``dry_run``, would remove)."""

    experiment_run_id: int
    experiment_name: str
    run_key: str
    status: str
    #: table name -> rows deleted from it (the run's own row included, in ``at_experiment_runs``)
    rows: dict[str, int]
    #: the live checkpoints' paths (not marked deleted): the caller deletes them from the storage
    checkpoint_paths: list[str]
    #: the run's trial ids
    trial_ids: list[str]
    dry_run: bool


class RunStillRunningError(ValueError):
    """The run is RUNNING, or one of its trials has not ended: they may still write, so it is not
    deleted."""


class RunDeleter(StoreBase):
    """Deletes a finished experiment run's rows (``airflow-trials db delete-run``)."""

    def delete_experiment_run(
        self,
        experiment_run_id: int,
        *,
        dry_run: bool = False,
        check_paths: Callable[[Sequence[str]], None] | None = None,
    ) -> RunDeletion:
        """Delete run ``experiment_run_id``, its trials and every row naming either, in one
        transaction; with ``dry_run`` count them and delete nothing.

        :param check_paths: called with the live checkpoints' paths before any row is deleted;
            what it raises ends the transaction, and nothing is deleted.
        :raises RunStillRunningError: the run is RUNNING or a trial of it has not ended; nothing
            is deleted.
        :raises StoreError: no such run.
        """
        operation = f"delete experiment run {experiment_run_id}"

        def work(session: Session) -> RunDeletion:
            run = self._find_run_or_raise(session, experiment_run_id, operation, lock=not dry_run)
            name = session.execute(
                select(ExperimentRow.name).where(ExperimentRow.id == run.experiment_id)
            ).scalar_one()
            _refuse_running(experiment_run_id, run.run_key, name, run.status)
            trials = session.execute(
                select(TrialRow.trial_id, TrialRow.status)
                .where(TrialRow.experiment_run_id == experiment_run_id)
                .order_by(TrialRow.trial_id)
            ).all()
            _refuse_unended(experiment_run_id, run.run_key, name, trials)
            of_trials = select(TrialRow.trial_id).where(
                TrialRow.experiment_run_id == experiment_run_id
            )
            paths = _live_checkpoint_paths(session, of_trials)
            if check_paths is not None:
                check_paths(paths)
            rows = _delete_or_count(session, _run_rows(experiment_run_id, of_trials), dry_run)
            return RunDeletion(
                experiment_run_id,
                name,
                run.run_key,
                run.status,
                rows,
                paths,
                [trial_id for trial_id, _ in trials],
                dry_run,
            )

        return self._transaction(operation, work, write=not dry_run)


def _live_checkpoint_paths(session: Session, of_trials: Any) -> list[str]:
    """The paths of the trials' checkpoints not marked deleted, oldest first."""
    return list(
        session.execute(
            select(CheckpointRow.path)
            .where(CheckpointRow.trial_id.in_(of_trials), CheckpointRow.deleted.is_(False))
            .order_by(CheckpointRow.id)
        ).scalars()
    )


def _run_rows(experiment_run_id: int, of_trials: Any) -> list[tuple[Any, Any]]:
    """Each table holding the run's rows, with the condition that picks them; children first:
    SQLite enforces no foreign keys unless asked, so none is left to a cascade."""
    return [
        (ResultRow, ResultRow.trial_id.in_(of_trials)),
        (CheckpointRow, CheckpointRow.trial_id.in_(of_trials)),
        (TrialRungRow, _of_run_or_trials(TrialRungRow, experiment_run_id, of_trials)),
        (
            TrialMedianPointRow,
            _of_run_or_trials(TrialMedianPointRow, experiment_run_id, of_trials),
        ),
        (TrialExploitRow, _of_run_or_trials(TrialExploitRow, experiment_run_id, of_trials)),
        (TrialRow, TrialRow.experiment_run_id == experiment_run_id),
        (RunExtensionRow, RunExtensionRow.experiment_run_id == experiment_run_id),
        (RunApprovalRow, RunApprovalRow.experiment_run_id == experiment_run_id),
        (ExperimentRunRow, ExperimentRunRow.id == experiment_run_id),
    ]


def _delete_or_count(
    session: Session, targets: Sequence[tuple[Any, Any]], dry_run: bool
) -> dict[str, int]:
    """Table name -> the rows deleted from it, or with ``dry_run`` counted and kept."""
    rows: dict[str, int] = {}
    for model, where in targets:
        table = model.__tablename__
        if dry_run:
            count = select(func.count()).select_from(model).where(where)
            rows[table] = session.execute(count).scalar_one()
        else:
            result = session.execute(
                delete(model).where(where).execution_options(synchronize_session=False)
            )
            rows[table] = result.rowcount  # type: ignore[attr-defined]
    return rows


def _refuse_running(experiment_run_id: int, run_key: str, name: str, status: str) -> None:
    if status == ExperimentRunStatus.RUNNING.value:
        raise RunStillRunningError(
            f"Experiment run {experiment_run_id} ({run_key}) of experiment {name} is "
            "RUNNING: its trials may still write to it, so nothing was deleted. Wait for "
            "its DAG run to end, then delete it. A DAG run marked failed in Airflow does not end "
            "the run (select_best never runs): end it with 'airflow-trials db end-run "
            f"{name} --run {run_key} --reason ...' first."
        )


def _of_run_or_trials(model: Any, experiment_run_id: int, of_trials: Any) -> Any:
    return or_(model.experiment_run_id == experiment_run_id, model.trial_id.in_(of_trials))


def _refuse_unended(experiment_run_id: int, run_key: str, name: str, trials: Sequence[Any]) -> None:
    unended = [f"{t} ({status})" for t, status in trials if not TrialStatus(status).is_terminal()]
    if unended:
        raise RunStillRunningError(
            f"Experiment run {experiment_run_id} ({run_key}) of experiment {name} has trials that "
            f"have not ended: {', '.join(unended)}. Their tasks may still start and write, so "
            "nothing was deleted. Let their tasks run to an end (clear them in Airflow if their "
            "DAG run is over), then delete the run."
        )
