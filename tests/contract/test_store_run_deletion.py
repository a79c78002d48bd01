"""Contract of ``TrialStore.delete_experiment_run`` (``airflow-trials db delete-run``): one run and
every row of it go in one transaction, other runs keep theirs, and a RUNNING run is refused;
run unchanged against in-memory SQLite, a SQLite file and PostgreSQL."""

from __future__ import annotations

import datetime

import pytest
from sqlalchemy import func, select

from airflow_trials.core.end import TrialEnd
from airflow_trials.core.fate import Transition
from airflow_trials.core.scheduler import Decision
from airflow_trials.core.status import TrialStatus
from airflow_trials.exceptions import OutsideStorageRootError
from airflow_trials.schedulers.asha.rung_math import RungVerdict
from airflow_trials.storage.storage_root import resolve_inside
from airflow_trials.store import TrialStore
from airflow_trials.store.models import (
    CheckpointRow,
    ExperimentRunRow,
    ResultRow,
    RunApprovalRow,
    RunExtensionRow,
    TrialExploitRow,
    TrialMedianPointRow,
    TrialRow,
    TrialRungRow,
)
from airflow_trials.store.run_deletion import RunStillRunningError
from tests.contract.conftest import MEMORY, POSTGRESQL, SQLITE_FILE, fail_setting_last_result
from tests.contract.test_store import register, results
from tests.factories import add_checkpoint, add_results
from tests.scheduler_writes import OneWriteEach

TABLES = (
    ResultRow,
    CheckpointRow,
    TrialRungRow,
    TrialMedianPointRow,
    TrialExploitRow,
    TrialRow,
    RunExtensionRow,
    RunApprovalRow,
    ExperimentRunRow,
)


def rows_per_table(store: TrialStore) -> dict[str, int]:
    with store._engine.connect() as connection:
        return {
            model.__tablename__: connection.execute(
                select(func.count()).select_from(model)
            ).scalar_one()
            for model in TABLES
        }


def full_run(store: TrialStore, run_key: str, prefix: str) -> int:
    """A finished run of two trials, each with results, checkpoints (one marked deleted), a rung
    and a median point, and one PBT exploit: a row in every table that names a run or a trial."""
    store.ensure_experiment("exp", metric="loss", mode="min")
    run = store.create_experiment_run("exp", run_key)
    a, b = f"{prefix}-a", f"{prefix}-b"
    for trial_id in (a, b):
        register(store, trial_id, run)
        store.record_transition(trial_id, Transition.PLACED)
        add_results(store, trial_id, results(range(1, 4)))
        add_checkpoint(store, trial_id, f"/ckpt/{trial_id}/checkpoint_000001", 1)
        add_checkpoint(store, trial_id, f"/ckpt/{trial_id}/checkpoint_000002", 2)
        OneWriteEach(store).record_rung(
            run,
            trial_id,
            bracket=0,
            milestone=1,
            value=0.5,
            iteration=1,
            decide=lambda values: RungVerdict(Decision.CONTINUE, None),
        )
        OneWriteEach(store).record_median_point(
            run,
            trial_id,
            iteration=1,
            time=1.0,
            value=0.5,
            decide=lambda means: (Decision.CONTINUE, None),
        )
    for trial_id in (a, b):
        store.record_end(TrialEnd(trial_id, "exp", TrialStatus.TERMINATED))
    store.mark_checkpoint_deleted(a, f"/ckpt/{a}/checkpoint_000001")
    store.record_exploit(
        b,
        iteration=2,
        donor_trial_id=a,
        donor_checkpoint=f"/ckpt/{a}/checkpoint_000002",
        old_config={"x": 1},
        new_config={"x": 2},
        operations={"x": "resample (test)"},
    )
    store.finish_experiment_run(run, "SUCCESS")
    # Extended once (airflow-trials extend): its record goes with the run.
    store.begin_run_extension(
        run,
        f"extend-{run_key}",
        num_samples_added=1,
        stop_before=None,
        stop_after=None,
        trials_continued=[],
        trials_added=[],
    )
    store.end_run_extension(run, f"extend-{run_key}", "SUCCESS")
    store.finish_experiment_run(run, "SUCCESS")
    store.record_approval(
        run,
        run_key,
        trial_id=f"{prefix}-a",
        outcome="APPROVED",
        responded_by_id="bob",
        responded_by_name="bob",
        responded_at=datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC),
        reason="",
        triggered_by="alice",
    )
    return run


class RunDeletionContract:
    backend: str

    def test_deletes_the_run_and_every_row_of_it_and_leaves_other_runs(self, store):
        old = full_run(store, "old", "o")
        kept = full_run(store, "kept", "k")
        before = rows_per_table(store)

        plan = store.delete_experiment_run(old, dry_run=True)

        assert rows_per_table(store) == before  # a dry run deletes nothing
        deletion = store.delete_experiment_run(old)

        assert deletion.rows == plan.rows and not deletion.dry_run and plan.dry_run
        # Half of every table was the old run's: a's 3 results and b's 2 (its exploit at iteration
        # 2 moved its third into the exploit's row), and so on.
        assert deletion.rows == {
            "at_results": 5,
            "at_checkpoints": 4,
            "at_trial_rungs": 2,
            "at_trial_median_points": 2,
            "at_trial_exploits": 1,
            "at_trials": 2,
            "at_run_extensions": 1,
            "at_run_approvals": 1,
            "at_experiment_runs": 1,
        }
        assert rows_per_table(store) == {
            table: count - deletion.rows[table] for table, count in before.items()
        }
        assert (deletion.experiment_name, deletion.run_key, deletion.status) == (
            "exp",
            "old",
            "SUCCESS",
        )
        assert deletion.trial_ids == ["o-a", "o-b"]
        # Only the live checkpoints: the one marked deleted is gone from the storage already.
        assert deletion.checkpoint_paths == [
            "/ckpt/o-a/checkpoint_000002",
            "/ckpt/o-b/checkpoint_000001",
            "/ckpt/o-b/checkpoint_000002",
        ]
        assert [r.run_key for r in store.reader.list_experiment_runs("exp")] == ["kept"]
        assert [t.trial_id for t in store.reader.list_trials(experiment_run_id=kept)] == [
            "k-a",
            "k-b",
        ]
        assert (
            len(store.reader.get_results("k-a")) == 3
            and len(store.reader.trial_exploits("k-b")) == 1
        )

    def test_refuses_a_running_run_and_deletes_nothing(self, store):
        run = full_run(store, "live", "l")
        store.finish_experiment_run(run, "RUNNING")
        before = rows_per_table(store)

        with pytest.raises(
            RunStillRunningError, match=r"run \d+ \(live\) of experiment exp is RUNNING"
        ):
            store.delete_experiment_run(run)

        assert rows_per_table(store) == before

    def test_refuses_a_run_with_a_trial_not_ended_and_names_it(self, store):
        run = full_run(store, "stale", "s")
        register(store, "s-pending", run)  # its task never ran, or may still run
        register(store, "s-running", run)
        store.record_transition("s-running", Transition.PLACED)
        before = rows_per_table(store)

        with pytest.raises(RunStillRunningError) as refused:
            store.delete_experiment_run(run)

        message = str(refused.value)
        assert "s-pending (PENDING)" in message and "s-running (RUNNING)" in message
        assert "s-a" not in message and "nothing was deleted" in message
        assert rows_per_table(store) == before

    def test_a_path_check_that_refuses_deletes_nothing(self, store, tmp_path):
        root = "/ckpt"  # full_run's checkpoints are there
        precious = tmp_path / "precious"  # named by a checkpoint row, outside the storage root
        precious.mkdir()
        run = full_run(store, "r", "p")
        add_checkpoint(store, "p-a", str(precious), 3)
        before = rows_per_table(store)

        def inside_root(paths):
            for path in paths:
                resolve_inside(path, root)

        with pytest.raises(OutsideStorageRootError, match=str(precious)):
            store.delete_experiment_run(run, check_paths=inside_root)

        assert rows_per_table(store) == before and precious.is_dir()

    def test_a_failure_midway_deletes_nothing(self, store):
        run = full_run(store, "r", "f")
        before = rows_per_table(store)
        fail_setting_last_result(store, self.backend)  # unrelated trigger: the store still works
        with store._engine.begin() as connection:  # the trials' delete fails, after the results'
            if self.backend == POSTGRESQL:
                connection.exec_driver_sql(
                    "CREATE TRIGGER at_test_no_delete BEFORE DELETE ON at_trials "
                    "FOR EACH ROW EXECUTE FUNCTION at_test_fail()"
                )
            else:
                connection.exec_driver_sql(
                    "CREATE TRIGGER at_test_no_delete BEFORE DELETE ON at_trials "
                    "BEGIN SELECT RAISE(ABORT, 'forced failure'); END"
                )

        with pytest.raises(Exception, match="forced failure"):
            store.delete_experiment_run(run)

        assert rows_per_table(store) == before

    def test_an_unknown_run_is_an_error(self, store):
        with pytest.raises(Exception, match="experiment run 999 is not in the trial store"):
            store.delete_experiment_run(999)


class TestInMemorySQLite(RunDeletionContract):
    backend = MEMORY


class TestSQLiteFile(RunDeletionContract):
    backend = SQLITE_FILE


class TestPostgreSQL(RunDeletionContract):
    backend = POSTGRESQL
