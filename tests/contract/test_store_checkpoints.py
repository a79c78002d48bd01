"""Contract of a checkpoint recorded again at a path whose row is marked deleted (a PBT exploit's
trial saving anew under a dropped checkpoint's name), run unchanged against in-memory SQLite, a
SQLite file and PostgreSQL."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import select

from airflow_trials.core.update import KeptCheckpoint, TrialUpdate
from airflow_trials.store import TrialStore
from airflow_trials.store.models import CheckpointRow
from tests.contract.conftest import MEMORY, POSTGRESQL, SQLITE_FILE
from tests.contract.test_store import count, register, results
from tests.contract.test_store_exploits import exploit
from tests.factories import add_checkpoint, add_results

# Losses at iterations 1-4; the checkpoints are at 1 (a, 0.9) and 3 (b, 0.6).
LOSSES = [(1, 0.9), (2, 0.2), (3, 0.6), (4, 0.5)]


def row(store: TrialStore, trial_id: str, path: str) -> tuple[Any, ...]:
    """The checkpoint's stored row: id, iteration, score, deleted, created_at."""
    table = CheckpointRow.__table__
    with store._engine.connect() as connection:
        return tuple(
            connection.execute(
                select(
                    table.c.id,
                    table.c.iteration,
                    table.c.score,
                    table.c.deleted,
                    table.c.created_at,
                ).where(table.c.trial_id == trial_id, table.c.path == path)
            ).one()
        )


def ranked_run(store: TrialStore) -> int:
    """A run ranked by min loss with trial t: results LOSSES, checkpoint a at 1 marked deleted, b at
    3."""
    store.ensure_experiment("ck", metric="loss", mode="min")
    run = store.create_experiment_run("ck", "r1")
    register(store, "t", run)
    add_results(store, "t", [{"training_iteration": i, "loss": loss} for i, loss in LOSSES])
    add_checkpoint(store, "t", "/ck/t/a", 1, 0.9)
    add_checkpoint(store, "t", "/ck/t/b", 3, 0.6)
    store.mark_checkpoint_deleted("t", "/ck/t/a")
    return run


def assert_revived(store: TrialStore, run: int, before: tuple[Any, ...]) -> None:
    """/ck/t/a, deleted at iteration 1, is live at iteration 4 with score 0.5, in the same row."""
    after = row(store, "t", "/ck/t/a")
    assert after[:4] == (before[0], 4, 0.5, False)
    assert after[4] >= before[4]
    assert count(store, CheckpointRow, trial_id="t") == 2
    latest = store.reader.latest_checkpoint("t")
    assert (latest.path, latest.iteration, latest.score, latest.deleted) == (
        "/ck/t/a",
        4,
        0.5,
        False,
    )
    # Ranked by the result at its new iteration: loss 0.5 beats b's 0.6 (and loses for max).
    maintained = store.reader.leaderboard(run, "loss", "min")[0]
    assert (maintained.best_checkpoint, maintained.latest_checkpoint) == ("/ck/t/a", "/ck/t/a")
    assert store.reader.leaderboard(run, "loss", "max")[0].best_checkpoint == "/ck/t/b"
    assert store.reader.best_checkpoint_paths(["t"], "loss", "min") == {"t": "/ck/t/a"}


class CheckpointContract:
    backend: str

    def test_a_deleted_path_recorded_again_is_revived_with_the_new_iteration(self, store):
        run = ranked_run(store)
        before = row(store, "t", "/ck/t/a")
        assert store.reader.leaderboard(run, "loss", "min")[0].best_checkpoint == "/ck/t/b"
        add_checkpoint(store, "t", "/ck/t/a", 4, 0.5)
        assert_revived(store, run, before)

    def test_a_deleted_path_in_a_progress_batch_is_revived(self, store):
        run = ranked_run(store)
        before = row(store, "t", "/ck/t/a")
        batch = [
            TrialUpdate(
                "t", results=results([5]), kept_checkpoints=[KeptCheckpoint("/ck/t/a", 4, 0.5)]
            )
        ]
        store.record_progress(batch)
        revived = row(store, "t", "/ck/t/a")
        store.record_progress(batch)  # the same poll written twice: the live row stays as it is
        assert row(store, "t", "/ck/t/a") == revived
        assert_revived(store, run, before)

    @pytest.mark.parametrize("batched", [False, True], ids=["add_checkpoint", "record_progress"])
    def test_a_live_path_recorded_again_changes_nothing(self, store, batched):
        register(store, "t")
        add_checkpoint(store, "t", "/ck/t/a", 1, 0.9)
        before = row(store, "t", "/ck/t/a")
        if batched:
            store.record_progress(
                [TrialUpdate("t", kept_checkpoints=[KeptCheckpoint("/ck/t/a", 4, 0.1)])]
            )
        else:
            add_checkpoint(store, "t", "/ck/t/a", 4, 0.1)
        assert row(store, "t", "/ck/t/a") == before
        assert count(store, CheckpointRow) == 1

    def test_a_trial_ending_after_an_exploit_has_its_new_checkpoints(self, store):
        # b kept checkpoints 4-6, clones a at 4 (the copy goes to b's checkpoint_000004, whose
        # row is live), drops 5 and 6, and trains on to 6: its latest checkpoint is 6 again.
        store.ensure_experiment("pbt", metric="loss", mode="min")
        run = store.create_experiment_run("pbt", "r1")
        for trial_id in ("a", "b"):
            register(store, trial_id, run)
        paths = {i: f"/ckpt/b/checkpoint_{i:06d}" for i in (4, 5, 6)}
        store.record_progress(
            [
                TrialUpdate(
                    "b",
                    results=results(range(1, 7)),
                    kept_checkpoints=[KeptCheckpoint(paths[i], i, 10.0 - i) for i in (4, 5, 6)],
                )
            ]
        )
        exploit(store, "b", "a", 4, {"lr": 0.2})
        store.record_progress([TrialUpdate("b", dropped_checkpoints=[paths[5], paths[6]])])
        assert store.reader.latest_checkpoint("b").path == paths[4]
        store.record_progress(
            [
                TrialUpdate(
                    "b",
                    results=[
                        {"training_iteration": i, "loss": loss} for i, loss in [(5, 3.0), (6, 1.0)]
                    ],
                    kept_checkpoints=[
                        KeptCheckpoint(paths[5], 5, 3.0),
                        KeptCheckpoint(paths[6], 6, 1.0),
                    ],
                )
            ]
        )
        latest = store.reader.latest_checkpoint("b")
        assert (latest.path, latest.iteration, latest.score) == (paths[6], 6, 1.0)
        board = store.reader.leaderboard(run, "loss", "min")[0]
        assert (
            board.trial_id,
            board.best_value,
            board.best_checkpoint,
            board.latest_checkpoint,
        ) == ("b", 1.0, paths[6], paths[6])
        assert count(store, CheckpointRow, trial_id="b") == 3
        assert count(store, CheckpointRow, trial_id="b", deleted=True) == 0


class TestInMemorySQLite(CheckpointContract):
    backend = MEMORY


class TestSQLiteFile(CheckpointContract):
    backend = SQLITE_FILE


@pytest.mark.postgres
class TestPostgreSQL(CheckpointContract):
    backend = POSTGRESQL
