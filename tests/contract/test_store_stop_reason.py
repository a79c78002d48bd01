"""Contract of a trial's stop reason in the trials store (migration 0005), on every backend: the
end records it, whatever starts the trial again clears it, and an upgrade keeps the rows it
finds."""

from __future__ import annotations

import pytest
from alembic import command
from sqlalchemy import inspect, text

from airflow_trials import Trial, TrialsDbCallback
from airflow_trials.core.end import TrialEnd
from airflow_trials.core.fate import Transition, after_failure
from airflow_trials.core.status import TrialStatus
from airflow_trials.core.stop_kind import StopKind
from airflow_trials.core.update import TrialUpdate
from airflow_trials.store import RestartFromScratch, TrialStore
from airflow_trials.store.engine import WRITE_OPTION, create_store_engine
from airflow_trials.store.migration import alembic_config, current_revision, upgrade_engine
from tests.contract.conftest import MEMORY, POSTGRESQL, SQLITE_FILE
from tests.contract.test_store import HEAD_REVISION, register, results, schema_differences
from tests.factories import add_checkpoint, add_results, update_trial

ASHA_STOP = (
    "stopped by ASHA at training_iteration=3 (rung 1 of 4): loss 0.41 above the rung's cutoff 0.35"
)
CRITERION = "it met its stopping criterion"


def finished(trial_id: str, stop_reason: str | None, stop_kind: StopKind | None = None) -> TrialEnd:
    """A TERMINATED end as the trigger reads it from the actor's last poll."""
    update = TrialUpdate(
        trial_id,
        status=TrialStatus.TERMINATED,
        last_result={"training_iteration": 3},
        num_results=3,
        stop_reason=stop_reason,
        stop_kind=stop_kind,
    )
    return update.end("exp", released=True)


def ended(store: TrialStore, trial_id: str, stop_reason: str | None = ASHA_STOP) -> None:
    register(store, trial_id)
    store.record_transition(trial_id, Transition.PLACED)
    assert store.record_end(finished(trial_id, stop_reason)) is TrialStatus.TERMINATED


class StopReasonContract:
    """Every backend must pass these; subclasses name the backend for the ``store`` fixture."""

    backend: str

    def test_record_end_keeps_the_stop_reason_of_a_terminated_end(self, store):
        ended(store, "t1")
        record = store.reader.get_trial("t1")
        assert (record.status, record.stop_reason, record.error_msg) == (
            TrialStatus.TERMINATED,
            ASHA_STOP,
            None,
        )
        assert [t.stop_reason for t in store.reader.list_trials()] == [ASHA_STOP]
        # execute_complete records the end the trigger recorded; a stored end carries no reason.
        store.record_end(TrialEnd.stored("t1", "exp", {"training_iteration": 3}, None))
        assert store.reader.get_trial("t1").stop_reason == ASHA_STOP
        store.record_end(finished("t1", CRITERION))
        assert store.reader.get_trial("t1").stop_reason == CRITERION

    def test_a_failed_end_records_no_stop_reason(self, store):
        register(store, "t1")
        store.record_transition("t1", Transition.PLACED)
        lost = TrialEnd.lost("t1", "exp", "its Ray actor died")
        assert store.record_end(lost, after_failure("t1", 0, 0)) is TrialStatus.ERROR
        assert store.reader.get_trial("t1").stop_reason is None

    @pytest.mark.parametrize("transition", [Transition.RESET, Transition.QUEUED])
    def test_starting_a_stopped_trial_again_clears_its_stop_reason(self, store, transition):
        ended(store, "t1")
        ended_at = store.reader.get_trial("t1").ended_at
        assert ended_at is not None
        assert store.record_transition("t1", transition).status is TrialStatus.PENDING
        pending = store.reader.get_trial("t1")
        assert (pending.stop_reason, pending.ended_at) == (None, None)
        store.record_transition("t1", Transition.PLACED)
        store.record_transition("t1", Transition.STOPPED, why="Stopped from Airflow.")
        stopped = store.reader.get_trial(
            "t1"
        )  # a stop from outside gives no reason: none left over
        assert (stopped.status, stopped.stop_reason) == (TrialStatus.TERMINATED, None)

    def test_restart_from_scratch_clears_the_stop_reason(self, store):
        ended(store, "t1")
        add_results(store, "t1", results([1, 2, 3]))
        store.record_transition("t1", RestartFromScratch(try_number=2))
        again = store.reader.get_trial("t1")
        assert (again.status, again.stop_reason, again.last_result) == (
            TrialStatus.PENDING,
            None,
            None,
        )

    def test_only_a_terminated_trial_takes_a_stop_reason(self, store):
        register(store, "t1")
        store.record_transition("t1", Transition.PLACED)
        before = store.reader.get_trial("t1")
        with pytest.raises(
            ValueError, match="t1 would be RUNNING: only a TERMINATED trial has a stop reason"
        ):
            update_trial(store, "t1", stop_reason=ASHA_STOP)
        assert store.reader.get_trial("t1") == before
        store.record_transition("t1", Transition.QUEUED)
        before = store.reader.get_trial("t1")
        with pytest.raises(ValueError, match="t1 would be PENDING"):
            update_trial(store, "t1", num_failures=1, stop_reason=ASHA_STOP)
        assert store.reader.get_trial("t1") == before
        store.record_transition("t1", Transition.PLACED)
        store.record_end(finished("t1", CRITERION))
        assert store.reader.get_trial("t1").stop_reason == CRITERION

    def test_a_page_reads_the_stop_reasons_of_its_trials_only(self, store):
        ended(store, "stopped")
        ended(store, "criterion", CRITERION)
        ended(store, "silent", None)
        register(store, "pending")
        reader = store.reader
        stops = reader.stops_of(["stopped", "criterion", "silent", "pending", "unknown"])
        assert {trial_id: stop.reason for trial_id, stop in stops.items()} == {
            "stopped": ASHA_STOP,
            "criterion": CRITERION,
        }
        assert reader.stops_of([]) == {}

    def test_a_run_s_early_stopped_trials_are_those_its_scheduler_stopped(self, store):
        run = store.create_experiment_run("exp", "r1")
        other = store.create_experiment_run("exp", "r2")
        at_max_t = "stopped by ASHA at training_iteration=9: it reached max_t=9"
        for trial_id, reason, kind, run_pk in (
            ("asha", ASHA_STOP, StopKind.SCHEDULER, run),
            ("criterion", CRITERION, StopKind.CRITERION, run),
            ("at-max-t", at_max_t, StopKind.MAX_T, run),
            ("elsewhere", ASHA_STOP, StopKind.SCHEDULER, other),
        ):
            register(store, trial_id, run_pk)
            store.record_transition(trial_id, Transition.PLACED)
            store.record_end(finished(trial_id, reason, kind))
        register(store, "running", run)
        assert store.reader.early_stopped_trials(run) == {"asha"}
        assert store.reader.early_stopped_trials(other) == {"elsewhere"}

    def test_the_runner_path_records_the_trial_s_stop_reason(self, store):
        recorder = TrialsDbCallback(store=store, run_key="engine-1")
        trials = [
            Trial("tests.trainables:quadratic", {"x": i}, trial_id=f"r{i}", experiment_name="exp")
            for i in range(2)
        ]
        for trial in trials:
            recorder.on_trial_start(trial)
            trial.record_result({"training_iteration": 1, "loss": 1.0})
            recorder.on_trial_result(trial, dict(trial.last_result))
        recorder.on_step_end(trials)
        trials[0].stop_reason = ASHA_STOP  # as TrialRunner._stopping sets it
        recorder.on_trial_complete(trials[0])
        trials[1].error_msg = "Traceback ...: boom"
        trials[1].num_failures = 1
        recorder.on_trial_error(trials[1])
        records = {t.trial_id: t for t in store.reader.list_trials()}
        assert (records["r0"].status, records["r0"].stop_reason) == (
            TrialStatus.TERMINATED,
            ASHA_STOP,
        )
        assert (records["r1"].status, records["r1"].stop_reason) == (TrialStatus.ERROR, None)

    # -- migration 0005
    # ------------------------------------------------------------------------------

    def test_upgrade_from_0004_keeps_the_trials_and_their_rows(self, store_url):
        if self.backend == MEMORY:
            pytest.skip("sqlite:// is a new, empty database per engine: nothing to upgrade")
        engine = create_store_engine(store_url)
        try:
            _migrate(engine, "0004", upgrade=True)
            _insert_old_trial(engine)
            upgrade_engine(engine)
            assert current_revision(engine) == HEAD_REVISION
        finally:
            engine.dispose()
        store = TrialStore(store_url)
        try:
            old = store.reader.get_trial("t-old")
            assert (old.status, old.stop_reason, old.error_msg) == (
                TrialStatus.TERMINATED,
                None,
                "kept",
            )
            assert [r["training_iteration"] for r in store.reader.get_results("t-old")] == [1]
            store.record_end(finished("t-old", ASHA_STOP))
            assert store.reader.get_trial("t-old").stop_reason == ASHA_STOP
            assert schema_differences(store) == []
        finally:
            store.dispose()

    def test_downgrade_to_0004_drops_the_column_and_keeps_every_trial_s_rows(self, store):
        ended(store, "t1")
        add_results(store, "t1", results([1, 2]))
        add_checkpoint(store, "t1", "/ckpt/t1/2", 2)
        engine = store._write_engine
        _migrate(engine, "0004", upgrade=False)
        with engine.connect() as connection:
            columns = {c["name"] for c in inspect(connection).get_columns("at_trials")}
            kept = [
                connection.execute(
                    text(f"SELECT count(*) FROM {table} WHERE trial_id = 't1'")
                ).scalar_one()
                for table in ("at_trials", "at_results", "at_checkpoints")
            ]
        assert "stop_reason" not in columns
        assert kept == [1, 2, 1]  # no rebuild of at_trials cascaded into its children
        _migrate(engine, "head", upgrade=True)
        assert (
            store.reader.get_trial("t1").stop_reason is None
            and len(store.reader.get_results("t1")) == 2
        )


def _migrate(engine, revision: str, *, upgrade: bool) -> None:
    with engine.execution_options(**{WRITE_OPTION: True}).begin() as connection:
        (command.upgrade if upgrade else command.downgrade)(alembic_config(connection), revision)


def _insert_old_trial(engine) -> None:
    """A finished trial with a result, written as a store at revision 0004 wrote it."""
    with engine.begin() as connection:
        connection.execute(
            text(
                "INSERT INTO at_trials (trial_id, trainable, config, resources, status, "
                "max_failures, error_msg, "
                "created_at, updated_at, ended_at) VALUES ('t-old', 'm:f', '{}', '{}', "
                "'TERMINATED', 0, 'kept', "
                "CURRENT_TIMESTAMP, CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)"
            )
        )
        connection.execute(
            text(
                "INSERT INTO at_results (trial_id, iteration, timestamp, metrics) "
                "VALUES ('t-old', 1, 1700000000.0, '{\"training_iteration\": 1}')"
            )
        )


class TestInMemorySQLite(StopReasonContract):
    backend = MEMORY


class TestSQLiteFile(StopReasonContract):
    backend = SQLITE_FILE


@pytest.mark.postgres
class TestPostgreSQL(StopReasonContract):
    backend = POSTGRESQL
