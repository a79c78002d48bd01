"""Contract of the answers to ``approve_best`` (``record_approval``, ``run_approvals``): one per
DAG run, a later answer replaces an earlier one, and a rejection is final; on SQLite and
PostgreSQL."""

from __future__ import annotations

import datetime as dt

import pytest

from airflow_trials.core.approval_rule import ApprovalOutcome
from airflow_trials.exceptions import StoreError
from tests.contract.conftest import MEMORY, POSTGRESQL, SQLITE_FILE

AT = dt.datetime(2026, 11, 28, 9, 30, tzinfo=dt.UTC)


def answer(
    store, run: int, dag_run_id: str, outcome: str, who: str, minutes: int = 0, trial: str = "t-1"
):
    return store.record_approval(
        run,
        dag_run_id,
        trial_id=trial,
        outcome=outcome,
        responded_by_id=who,
        responded_by_name=who.title(),
        responded_at=AT + dt.timedelta(minutes=minutes),
        reason=f"{who} says {outcome.lower()}",
        triggered_by="alice",
    )


class ApprovalContract:
    backend: str

    def test_an_answer_is_recorded_beside_its_run_and_a_later_one_replaces_it(self, store):
        run = store.create_experiment_run("gate", "manual-1", dag_id="gate", run_id="manual-1")
        first = answer(store, run, "manual-1", "SELF_APPROVED", "alice")
        assert first.outcome is ApprovalOutcome.SELF_APPROVED and not first.outcome.publishes()
        assert (first.responded_by_name, first.triggered_by, first.trial_id) == (
            "Alice",
            "alice",
            "t-1",
        )
        assert first.responded_at == AT and first.reason == "alice says self_approved"
        # approve_best cleared and asked again: bob's approval replaces alice's own.
        second = answer(store, run, "manual-1", "APPROVED", "bob", minutes=5)
        assert store.reader.run_approvals(run) == [second]
        assert second.id == first.id and second.outcome.publishes()
        assert second.describe() == "approved by Bob (id bob); reason: bob says approved"

    def test_a_rejection_is_final(self, store):
        run = store.create_experiment_run("gate", "manual-1")
        rejected = answer(store, run, "manual-1", "REJECTED", "carol")
        assert answer(store, run, "manual-1", "APPROVED", "bob", minutes=5) == rejected
        assert store.reader.run_approvals(run) == [rejected]
        assert rejected.describe() == (
            "Carol (id carol) rejected it, and a rejection is final; reason: carol says rejected"
        )
        # An extension's DAG run may not approve the trial another DAG run rejected...
        assert answer(store, run, "extend-1", "APPROVED", "bob", minutes=9) == rejected
        assert store.reader.run_approvals(run) == [rejected]
        # ...but its answer about another best trial is its own.
        extended = answer(store, run, "extend-1", "APPROVED", "bob", minutes=9, trial="t-2")
        assert store.reader.run_approvals(run) == [rejected, extended]

    def test_an_unknown_run_or_outcome_is_refused_and_nothing_is_written(self, store):
        with pytest.raises(StoreError, match="experiment run 99"):
            answer(store, 99, "manual-1", "APPROVED", "bob")
        run = store.create_experiment_run("gate", "manual-1")
        with pytest.raises(ValueError, match="'MAYBE' of the approval of DAG run manual-1"):
            answer(store, run, "manual-1", "MAYBE", "bob")
        assert store.reader.run_approvals(run) == []


class TestInMemorySQLite(ApprovalContract):
    backend = MEMORY


class TestSQLiteFile(ApprovalContract):
    backend = SQLITE_FILE


@pytest.mark.postgres
class TestPostgreSQL(ApprovalContract):
    backend = POSTGRESQL
