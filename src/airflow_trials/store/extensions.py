"""ExtensionWriter: the extensions of finished experiment runs (``airflow-trials extend``),
recorded with the run set back to RUNNING in one transaction, and ended with it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from airflow_trials.core.jsonsafe import json_safe
from airflow_trials.exceptions import ExperimentStateError
from airflow_trials.store.base import StoreBase
from airflow_trials.store.database import check_id, parse_enum
from airflow_trials.store.mapping import from_row
from airflow_trials.store.models import RunExtensionRow, utcnow
from airflow_trials.store.records import ExperimentRunStatus, RunExtensionRecord


def extension_record(row: RunExtensionRow) -> RunExtensionRecord:
    """The plain record of an extension row."""
    return from_row(
        RunExtensionRecord,
        row,
        status=ExperimentRunStatus(row.status),
        trials_continued=list(row.trials_continued or []),
        trials_added=list(row.trials_added or []),
    )


class ExtensionWriter(StoreBase):
    """Extensions of finished runs: :meth:`begin_run_extension` and :meth:`end_run_extension`."""

    def begin_run_extension(
        self,
        experiment_run_id: int,
        dag_run_id: str,
        *,
        num_samples_added: int,
        stop_before: Mapping[str, Any] | None,
        stop_after: Mapping[str, Any] | None,
        trials_continued: Sequence[str],
        trials_added: Sequence[str],
    ) -> RunExtensionRecord:
        """Record that DAG run ``dag_run_id`` extends the run, and set the run back to RUNNING
        (its ``ended_at`` and stored history line cleared), in one transaction under the run's
        row lock. Idempotent on (run, DAG run): a retry gets the extension recorded first and
        changes nothing.

        :raises ExperimentStateError: the run is RUNNING and no extension of this DAG run is
            recorded (it is still running, or another DAG run extends it); nothing is written.
        """
        check_id("dag_run_id", dag_run_id, max_length=250)
        operation = f"extend experiment run {experiment_run_id} by DAG run {dag_run_id}"

        def work(session: Session) -> RunExtensionRecord:
            run = self._find_run_or_raise(session, experiment_run_id, operation, lock=True)
            found = session.execute(
                select(RunExtensionRow).where(
                    RunExtensionRow.experiment_run_id == experiment_run_id,
                    RunExtensionRow.dag_run_id == dag_run_id,
                )
            ).scalar_one_or_none()
            if found is not None:
                return extension_record(found)
            if run.status == ExperimentRunStatus.RUNNING.value:
                raise ExperimentStateError(
                    f"Cannot {operation}: run {run.run_key} is still RUNNING (or another DAG run "
                    "extends it); nothing was written. Wait for it to end, then extend it."
                )
            run.status = ExperimentRunStatus.RUNNING.value
            run.ended_at = None
            run.end_reason = None
            run.summary = None
            row = RunExtensionRow(
                experiment_run_id=experiment_run_id,
                dag_run_id=dag_run_id,
                created_at=utcnow(),
                num_samples_added=num_samples_added,
                stop_before=None if stop_before is None else json_safe(dict(stop_before)),
                stop_after=None if stop_after is None else json_safe(dict(stop_after)),
                trials_continued=list(trials_continued),
                trials_added=list(trials_added),
                status=ExperimentRunStatus.RUNNING.value,
            )
            session.add(row)
            session.flush()
            return extension_record(row)

        return self._transaction(operation, work)

    def end_run_extension(self, experiment_run_id: int, dag_run_id: str, status: str) -> bool:
        """End the extension of DAG run ``dag_run_id`` SUCCESS or FAILED (the run itself ends
        through ``finish_experiment_run``); whether that DAG run extends the run at all."""
        new = parse_enum(ExperimentRunStatus, status, f"extension {dag_run_id}")
        operation = f"end the extension {dag_run_id} of experiment run {experiment_run_id}"

        def work(session: Session) -> bool:
            row = session.execute(
                select(RunExtensionRow).where(
                    RunExtensionRow.experiment_run_id == experiment_run_id,
                    RunExtensionRow.dag_run_id == dag_run_id,
                )
            ).scalar_one_or_none()
            if row is None:
                return False
            if row.status != new.value or (new.is_terminal() and row.ended_at is None):
                row.ended_at = utcnow() if new.is_terminal() else None
            row.status = new.value
            return True

        return self._transaction(operation, work)


def list_run_extensions(
    session: Session, experiment_run_id: int | None
) -> list[RunExtensionRecord]:
    """The extensions of one run (None: of every run), oldest first."""
    query = select(RunExtensionRow).order_by(RunExtensionRow.created_at, RunExtensionRow.id)
    if experiment_run_id is not None:
        query = query.where(RunExtensionRow.experiment_run_id == experiment_run_id)
    return [extension_record(row) for row in session.execute(query).scalars()]
