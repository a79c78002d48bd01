"""Contract of a trial's ``stopped_from_airflow`` in the trials store (migration 0009), on every
backend: the stop from Airflow sets it, a later try's registration keeps it, whatever starts the
trial again clears it, and an upgrade reads the stops older versions wrote as messages."""

from __future__ import annotations

import pytest
from sqlalchemy import inspect, text

from airflow_trials.core.end import TrialEnd
from airflow_trials.core.fate import Transition
from airflow_trials.core.status import TrialStatus
from airflow_trials.core.update import TrialUpdate
from airflow_trials.store import RestartFromScratch, StopForTry, TrialStore
from airflow_trials.store.engine import create_store_engine
from airflow_trials.store.migration import current_revision, upgrade_engine
from tests.contract.conftest import MEMORY, POSTGRESQL, SQLITE_FILE
from tests.contract.test_store import HEAD_REVISION, register, results, schema_differences
from tests.contract.test_store_stop_reason import _migrate
from tests.factories import add_results

OLD_STOP_MESSAGE = "Stopped because its Airflow task was cleared or marked while deferred."


def running(store: TrialStore, trial_id: str, try_number: int = 1) -> None:
    register(store, trial_id, try_number=try_number)
    store.record_transition(trial_id, Transition.PLACED)


def finished(trial_id: str) -> TrialEnd:
    update = TrialUpdate(
        trial_id,
        status=TrialStatus.TERMINATED,
        num_results=3,
        last_result={"training_iteration": 3},
    )
    return update.end("exp", released=True)


class StoppedFromAirflowContract:
    """Every backend must pass these; subclasses name the backend for the ``store`` fixture."""

    backend: str

    def test_a_stop_for_a_try_sets_it_and_the_next_try_s_registration_keeps_it(self, store):
        running(store, "t1")
        assert not store.reader.get_trial("t1").stopped_from_airflow
        recorded = store.record_transition("t1", StopForTry("stopped from Airflow", 1))
        assert recorded.applied and recorded.status is TrialStatus.TERMINATED
        stopped = store.reader.get_trial("t1")
        assert (stopped.status, stopped.stopped_from_airflow, stopped.error_msg) == (
            TrialStatus.TERMINATED,
            True,
            "stopped from Airflow",
        )
        register(store, "t1", try_number=2)  # the next try registers, then reads it
        assert store.reader.get_trial("t1").stopped_from_airflow

    def test_a_stop_fenced_off_by_a_later_try_sets_nothing(self, store):
        running(store, "t1", try_number=2)
        assert not store.record_transition("t1", StopForTry("stopped from Airflow", 1)).applied
        record = store.reader.get_trial("t1")
        assert (record.status, record.stopped_from_airflow) == (TrialStatus.RUNNING, False)

    def test_a_trial_that_ended_keeps_its_end_and_is_not_marked_stopped(self, store):
        running(store, "t1")
        store.record_end(finished("t1"))
        assert store.record_transition("t1", StopForTry("stopped from Airflow", 1)).applied
        record = store.reader.get_trial("t1")
        assert (record.status, record.stopped_from_airflow, record.error_msg) == (
            TrialStatus.TERMINATED,
            False,
            None,
        )

    def test_a_plain_stopped_transition_sets_it(self, store):
        running(store, "t1")
        store.record_transition("t1", Transition.STOPPED, why="Stopped from Airflow.")
        assert store.reader.get_trial("t1").stopped_from_airflow

    @pytest.mark.parametrize("start", [Transition.QUEUED, Transition.RESET, "restart"])
    def test_starting_the_trial_again_clears_it(self, store, start):
        running(store, "t1")
        store.record_transition("t1", StopForTry("stopped from Airflow", 1))
        again = RestartFromScratch(try_number=2) if start == "restart" else start
        store.record_transition("t1", again)
        record = store.reader.get_trial("t1")
        assert (record.status, record.stopped_from_airflow) == (TrialStatus.PENDING, False)
        store.record_transition("t1", Transition.PLACED)
        store.record_end(finished("t1"))
        assert not store.reader.get_trial("t1").stopped_from_airflow

    # -- migration 0009 ------------------------------------------------------------------------

    def test_upgrade_from_0008_reads_the_old_stop_message_as_the_field(self, store_url):
        if self.backend == MEMORY:
            pytest.skip("sqlite:// is a new, empty database per engine: nothing to upgrade")
        engine = create_store_engine(store_url)
        try:
            _migrate(engine, "0008", upgrade=True)
            with engine.begin() as connection:
                for trial_id, status, error in (
                    ("cleared", "TERMINATED", OLD_STOP_MESSAGE),
                    ("restarted", "PENDING", OLD_STOP_MESSAGE),
                    ("ended", "TERMINATED", None),
                ):
                    connection.execute(
                        text(
                            "INSERT INTO at_trials (trial_id, trainable, config, resources, "
                            "status, "
                            "max_failures, error_msg, created_at, updated_at) VALUES (:trial_id, "
                            "'m:f', '{}', '{}', :status, 0, :error, CURRENT_TIMESTAMP, "
                            "CURRENT_TIMESTAMP)"
                        ),
                        {"trial_id": trial_id, "status": status, "error": error},
                    )
            upgrade_engine(engine)
            assert current_revision(engine) == HEAD_REVISION
        finally:
            engine.dispose()
        store = TrialStore(store_url)
        try:
            assert {t.trial_id: t.stopped_from_airflow for t in store.reader.list_trials()} == {
                "cleared": True,
                "restarted": False,
                "ended": False,
            }
            assert schema_differences(store) == []
        finally:
            store.dispose()

    def test_downgrade_to_0008_drops_the_column_and_keeps_the_rows(self, store, store_url):
        if self.backend == MEMORY:
            pytest.skip("sqlite:// is a new, empty database per engine: nothing to downgrade")
        running(store, "t1")
        add_results(store, "t1", results([1, 2]))
        store.record_transition("t1", StopForTry("stopped from Airflow", 1))
        engine = create_store_engine(store_url)
        try:
            _migrate(engine, "0008", upgrade=False)
            with engine.connect() as connection:
                columns = {c["name"] for c in inspect(connection).get_columns("at_trials")}
                kept = [
                    connection.execute(text(f"SELECT count(*) FROM {table}")).scalar_one()
                    for table in ("at_trials", "at_results")
                ]
            assert "stopped_from_airflow" not in columns
            assert kept == [1, 2]  # no rebuild of at_trials cascaded into its results
            _migrate(engine, "head", upgrade=True)
        finally:
            engine.dispose()
        record = store.reader.get_trial("t1")
        assert (record.status, record.stopped_from_airflow) == (TrialStatus.TERMINATED, False)


class TestInMemorySQLite(StoppedFromAirflowContract):
    backend = MEMORY


class TestSQLiteFile(StoppedFromAirflowContract):
    backend = SQLITE_FILE


@pytest.mark.postgres
class TestPostgreSQL(StoppedFromAirflowContract):
    backend = POSTGRESQL
