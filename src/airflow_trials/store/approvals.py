"""ApprovalWriter: the answer to each DAG run's ``approve_best``, recorded beside the experiment
run; a rejection is final."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from airflow_trials.core.approval_rule import ApprovalOutcome
from airflow_trials.store.base import StoreBase
from airflow_trials.store.database import check_id, parse_enum
from airflow_trials.store.mapping import from_row
from airflow_trials.store.models import AIRFLOW_ID_LENGTH, RunApprovalRow, utcnow
from airflow_trials.store.records import RunApprovalRecord


def approval_record(row: RunApprovalRow) -> RunApprovalRecord:
    """The plain record of an approval row."""
    return from_row(
        RunApprovalRecord,
        row,
        outcome=parse_enum(ApprovalOutcome, row.outcome, f"approval {row.id}"),
    )


class ApprovalWriter(StoreBase):
    """Answers to ``approve_best``: :meth:`record_approval`."""

    def record_approval(
        self,
        experiment_run_id: int,
        dag_run_id: str,
        *,
        trial_id: str,
        outcome: ApprovalOutcome | str,
        responded_by_id: str,
        responded_by_name: str,
        responded_at: datetime,
        reason: str,
        triggered_by: str | None,
    ) -> RunApprovalRecord:
        """Record the answer DAG run ``dag_run_id``'s ``approve_best`` got about the run's best
        trial, under the run's row lock; returns the record that stands.

        A later answer of the same DAG run (``approve_best`` cleared and asked again) replaces an
        earlier one, except a rejection: a REJECTED record is final and is returned unchanged. It
        stands for its trial in every DAG run of the experiment run too, so an extension's DAG
        run cannot approve a trial another one rejected.
        """
        check_id("dag_run_id", dag_run_id, max_length=AIRFLOW_ID_LENGTH)
        new = parse_enum(ApprovalOutcome, str(outcome), f"the approval of DAG run {dag_run_id}")
        operation = f"record the approval of experiment run {experiment_run_id} by {dag_run_id}"

        def work(session: Session) -> RunApprovalRecord:
            self._find_run_or_raise(session, experiment_run_id, operation, lock=True)
            rows = list(
                session.execute(
                    select(RunApprovalRow).where(
                        RunApprovalRow.experiment_run_id == experiment_run_id,
                        or_(
                            RunApprovalRow.dag_run_id == dag_run_id,
                            RunApprovalRow.trial_id == trial_id,
                        ),
                    )
                ).scalars()
            )
            # This DAG run's rejection, or any DAG run's of this trial, stands.
            rejection = next((r for r in rows if ApprovalOutcome(r.outcome).is_final()), None)
            if rejection is not None:
                return approval_record(rejection)
            row = next((r for r in rows if r.dag_run_id == dag_run_id), None)
            if row is None:
                row = RunApprovalRow(experiment_run_id=experiment_run_id, dag_run_id=dag_run_id)
                session.add(row)
            row.trial_id = trial_id
            row.outcome = new.value
            row.responded_by_id = responded_by_id
            row.responded_by_name = responded_by_name
            row.responded_at = responded_at
            row.reason = reason
            row.triggered_by = triggered_by
            row.recorded_at = utcnow()
            session.flush()
            return approval_record(row)

        return self._transaction(operation, work)


def list_run_approvals(session: Session, experiment_run_id: int) -> list[RunApprovalRecord]:
    """The recorded answers about one run, one per DAG run that asked, oldest first."""
    query = (
        select(RunApprovalRow)
        .where(RunApprovalRow.experiment_run_id == experiment_run_id)
        .order_by(RunApprovalRow.responded_at, RunApprovalRow.id)
    )
    return [approval_record(row) for row in session.execute(query).scalars()]
