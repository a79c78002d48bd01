"""Contract of TrialStore.record_progress (many trials' progress in one transaction), run
unchanged against in-memory SQLite, a SQLite file and PostgreSQL."""

from __future__ import annotations

import pytest
from sqlalchemy import event

from airflow_trials import InvalidTransitionError, StoreError, TrialNotFoundError
from airflow_trials.core.fate import Transition
from airflow_trials.core.status import TrialStatus
from airflow_trials.core.update import KeptCheckpoint, TrialUpdate
from airflow_trials.store import TrialStore
from airflow_trials.store.models import CheckpointRow, ResultRow
from tests.contract.conftest import MEMORY, POSTGRESQL, SQLITE_FILE
from tests.contract.test_store import count, register, results
from tests.factories import add_checkpoint


def commits(store: TrialStore) -> list[int]:
    """A list that counts the store's commits from now on."""
    seen: list[int] = []
    event.listen(store._engine, "commit", lambda connection: seen.append(1))
    return seen


class ProgressContract:
    backend: str

    def test_writes_many_trials_in_one_transaction(self, store):
        run = store.create_experiment_run("exp", "r1")
        store.ensure_experiment("exp", metric="loss", mode="min")
        for trial_id in ("a", "b", "c"):
            register(store, trial_id, run)
        add_checkpoint(store, "b", "/ck/b/1", 1, 9.0)
        committed = commits(store)
        new = store.record_progress(
            [
                TrialUpdate("c", results=results([1, 2]), status=TrialStatus.RUNNING),
                TrialUpdate(
                    "a",
                    results=results([1]),
                    kept_checkpoints=[KeptCheckpoint("/ck/a/1", 1, 9.0)],
                    status=TrialStatus.RUNNING,
                ),
                TrialUpdate(
                    "b",
                    results=results([2, 3]),
                    kept_checkpoints=[KeptCheckpoint("/ck/b/3", 3, 7.0)],
                    dropped_checkpoints=["/ck/b/1"],
                ),
            ]
        )
        assert new == 5 and len(committed) == 1
        assert [store.reader.get_trial(t).status.value for t in ("a", "b", "c")] == [
            "RUNNING",
            "PENDING",
            "RUNNING",
        ]
        assert store.reader.get_trial("a").started_at is not None
        assert store.reader.get_trial("c").last_result["training_iteration"] == 2
        assert store.reader.latest_checkpoint("a").path == "/ck/a/1"
        assert store.reader.latest_checkpoint("b").path == "/ck/b/3"
        assert count(store, CheckpointRow, trial_id="b", deleted=True) == 1
        # The best value is kept current as add_results keeps it.
        best = {
            row.trial_id: row.best_value for row in store.reader.leaderboard(run, "loss", "min")
        }
        assert best == {"b": 7.0, "c": 8.0, "a": 9.0}

    def test_is_idempotent_like_add_results(self, store):
        register(store, "a")
        register(store, "b")
        batch = [
            TrialUpdate(
                "a",
                results=results([1, 2]),
                kept_checkpoints=[KeptCheckpoint("/ck/a/2", 2, None)],
                status=TrialStatus.RUNNING,
            ),
            TrialUpdate("b", results=results([1]), status=TrialStatus.RUNNING),
        ]
        assert store.record_progress(batch) == 3
        assert (
            store.record_progress(batch) == 0
        )  # a poll answered twice (a re-run trigger) adds nothing
        assert count(store, ResultRow, trial_id="a") == 2 and count(store, CheckpointRow) == 1
        assert store.reader.get_trial("a").status.value == "RUNNING"

    def test_one_bad_trial_writes_nothing_of_the_batch(self, store):
        register(store, "good")
        register(store, "ended")
        store.record_transition("ended", Transition.STOPPED)
        with pytest.raises(InvalidTransitionError, match="ended"):
            store.record_progress(
                [
                    TrialUpdate("good", results=results([1]), status=TrialStatus.RUNNING),
                    TrialUpdate("ended", status=TrialStatus.RUNNING),
                ]
            )
        assert (
            count(store, ResultRow) == 0
            and store.reader.get_trial("good").status.value == "PENDING"
        )
        with pytest.raises(TrialNotFoundError, match="nope"):
            store.record_progress([TrialUpdate("good", results=results([1])), TrialUpdate("nope")])
        with pytest.raises(StoreError, match="no checkpoint at /missing"):
            store.record_progress([TrialUpdate("good", dropped_checkpoints=["/missing"])])
        assert count(store, ResultRow) == 0

    def test_a_batch_takes_as_many_statements_for_30_trials_as_for_3(self, store):
        # The triggerer's poller writes one batch per tick for every trial it watches: the
        # statements of a batch do not grow with its trials (they did: about four per trial).
        run = store.create_experiment_run("exp", "r1")
        store.ensure_experiment("exp", metric="loss", mode="min")
        statements = []

        def count_statements(trial_ids):
            for trial_id in trial_ids:
                register(store, trial_id, run)
            statements.clear()
            listener = lambda *args: statements.append(1)  # noqa: E731
            event.listen(store._engine, "before_cursor_execute", listener)
            try:
                new = store.record_progress(
                    [
                        TrialUpdate(t, results=results([1, 2]), status=TrialStatus.RUNNING)
                        for t in trial_ids
                    ]
                )
            finally:
                event.remove(store._engine, "before_cursor_execute", listener)
            assert new == 2 * len(trial_ids)
            return len(statements)

        few = count_statements([f"few-{i}" for i in range(3)])
        many = count_statements([f"many-{i:02d}" for i in range(30)])
        assert many == few, (few, many)
        assert [store.reader.get_trial(f"many-{i:02d}").status.value for i in (0, 29)] == [
            "RUNNING"
        ] * 2
        assert store.reader.get_trial("many-17").last_result["training_iteration"] == 2

    def test_refuses_a_trial_named_twice(self, store):
        register(store, "a")
        with pytest.raises(ValueError, match=r"\['a'\] more than once"):
            store.record_progress([TrialUpdate("a", results=results([1])), TrialUpdate("a")])

    def test_an_empty_batch_writes_nothing(self, store):
        assert store.record_progress([]) == 0


class TestInMemorySQLite(ProgressContract):
    backend = MEMORY


class TestSQLiteFile(ProgressContract):
    backend = SQLITE_FILE


@pytest.mark.postgres
class TestPostgreSQL(ProgressContract):
    backend = POSTGRESQL
