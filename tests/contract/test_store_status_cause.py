"""Contract of the one status setter's cause and try fence (issue 48, item 1), on every backend:
each path that changes a trial's status says why, and the trial keeps the cause of the change
that gave it its status (migration 0018); a write from an Airflow try older than the one the trial
is registered with (its end, its failure decision, its stop) changes nothing, and one from the
registered try goes through."""

from __future__ import annotations

import pytest
from sqlalchemy import text
from sqlalchemy.orm import Session

from airflow_trials.core.end import TrialEnd
from airflow_trials.core.fate import Transition, after_failure
from airflow_trials.core.status import TrialStatus
from airflow_trials.core.status_cause import StatusCause
from airflow_trials.core.update import TrialUpdate
from airflow_trials.store import ContinueWithRaisedStop, RestartFromScratch, StopForTry, TrialStore
from airflow_trials.store.migration import current_revision
from airflow_trials.store.models import TrialRow
from airflow_trials.store.trial_writes import change_status
from tests.contract.conftest import MEMORY, POSTGRESQL, SQLITE_FILE
from tests.contract.test_store import HEAD_REVISION, register, schema_differences
from tests.contract.test_store_stop_reason import _migrate
from tests.factories import add_results


def cause(store: TrialStore, trial_id: str) -> tuple[TrialStatus, StatusCause | None]:
    record = store.reader.get_trial(trial_id)
    return record.status, record.status_cause


def failed(trial_id: str, try_number: int | None, num_failures: int = 0) -> TrialUpdate:
    """The failed end a worker of try ``try_number`` records, with its decision (a retry)."""
    end = TrialEnd.lost(trial_id, "exp", "its Ray actor died")
    return TrialUpdate.of_end(end, after_failure(trial_id, num_failures, 3), try_number=try_number)


def finished(trial_id: str, try_number: int | None) -> TrialUpdate:
    """The finished end the trigger of try ``try_number`` records."""
    end = TrialUpdate(trial_id, status=TrialStatus.TERMINATED, last_result={"loss": 1.0})
    return TrialUpdate.of_end(end.end("exp", released=True), try_number=try_number)


def taken_over(store: TrialStore, trial_id: str) -> None:
    """Try 1 placed the trial; its task was cleared and try 2 registered and placed it again."""
    register(store, trial_id, try_number=1)
    store.record_transition(trial_id, Transition.PLACED, try_number=1)
    register(store, trial_id, try_number=2)
    store.record_transition(trial_id, Transition.PLACED, try_number=2)


class StatusCauseContract:
    """Every backend must pass these; subclasses name the backend for the ``store`` fixture."""

    backend: str

    def test_each_path_records_why_the_status_changed(self, store):
        register(store, "t1")
        assert cause(store, "t1") == (TrialStatus.PENDING, StatusCause.REGISTERED)
        store.record_transition("t1", Transition.PLACED)
        assert cause(store, "t1") == (TrialStatus.RUNNING, StatusCause.PLACED)
        store.record_progress([TrialUpdate("t1", status=TrialStatus.PAUSED)])
        assert cause(store, "t1") == (TrialStatus.PAUSED, StatusCause.PAUSED)
        store.record_progress([TrialUpdate("t1", status=TrialStatus.RUNNING)])
        assert cause(store, "t1") == (TrialStatus.RUNNING, StatusCause.PROGRESS)
        store.record_progress([failed("t1", None)])
        assert cause(store, "t1") == (TrialStatus.PENDING, StatusCause.FAILURE_DECISION)
        store.record_transition("t1", Transition.PLACED)
        store.record_progress([finished("t1", None)])
        assert cause(store, "t1") == (TrialStatus.TERMINATED, StatusCause.END)
        store.record_transition("t1", ContinueWithRaisedStop("ext-1"))
        assert cause(store, "t1") == (TrialStatus.PENDING, StatusCause.EXTENSION)
        store.record_transition("t1", Transition.PLACED)
        store.record_transition("t1", StopForTry("stopped from Airflow", None))
        assert cause(store, "t1") == (TrialStatus.TERMINATED, StatusCause.STOP_FROM_AIRFLOW)
        store.record_transition("t1", RestartFromScratch())
        assert cause(store, "t1") == (TrialStatus.PENDING, StatusCause.RESTART)
        store.record_transition("t1", Transition.ABANDONED, why="its task failed")
        assert cause(store, "t1") == (TrialStatus.ERROR, StatusCause.ABANDONED)

    def test_the_same_status_again_keeps_the_cause_that_gave_it(self, store):
        register(store, "t1")
        store.record_transition("t1", Transition.PLACED)
        add_results(store, "t1", [{"training_iteration": 1, "loss": 1.0}])
        store.record_progress([TrialUpdate("t1", status=TrialStatus.RUNNING)])
        assert cause(store, "t1") == (TrialStatus.RUNNING, StatusCause.PLACED)

    def test_a_failed_trial_says_whether_its_decision_or_its_run_failed_it(self, store):
        register(store, "decided")
        store.record_transition("decided", Transition.PLACED)
        end = TrialEnd.lost("decided", "exp", "boom")
        store.record_progress([TrialUpdate.of_end(end, after_failure("decided", 0, 0))])
        register(store, "abandoned")
        store.record_transition("abandoned", Transition.ABANDONED, why="its task failed")
        causes = {t.trial_id: (t.status, t.status_cause) for t in store.reader.list_trials()}
        assert causes == {
            "decided": (TrialStatus.ERROR, StatusCause.FAILURE_DECISION),
            "abandoned": (TrialStatus.ERROR, StatusCause.ABANDONED),
        }

    def test_the_setter_refuses_a_status_without_a_cause(self, store):
        register(store, "t1")
        with store._write_engine.begin() as connection:
            with Session(bind=connection) as session:
                row = session.get_one(TrialRow, "t1")
                with pytest.raises(ValueError, match="t1 to RUNNING without a cause"):
                    change_status(row, TrialStatus.RUNNING, {}, cause=None)
        assert cause(store, "t1") == (TrialStatus.PENDING, StatusCause.REGISTERED)

    # -- the try fence --------------------------------------------------------------------------

    @pytest.mark.parametrize("end", [failed, finished])
    def test_an_end_from_an_older_try_changes_nothing(self, store, end):
        taken_over(store, "t1")
        store.record_progress([end("t1", 1)])
        record = store.reader.get_trial("t1")
        assert (record.status, record.num_failures, record.error_msg, record.try_number) == (
            TrialStatus.RUNNING,
            0,
            None,
            2,
        )
        assert record.status_cause is StatusCause.PLACED

    def test_results_from_an_older_try_are_kept_though_its_end_is_not(self, store):
        taken_over(store, "t1")
        update = failed("t1", 1)
        batch = TrialUpdate(
            "t1",
            status=update.status,
            error=update.error,
            failure=update.failure,
            try_number=1,
            results=[{"training_iteration": 1, "loss": 0.5}],
        )
        assert store.record_progress([batch]) == 1
        assert store.reader.get_trial("t1").status is TrialStatus.RUNNING

    @pytest.mark.parametrize("end", [failed, finished])
    def test_an_end_from_the_registered_try_is_recorded(self, store, end):
        taken_over(store, "t1")
        store.record_progress([end("t1", 2)])
        expected = TrialStatus.PENDING if end is failed else TrialStatus.TERMINATED
        assert store.reader.get_trial("t1").status is expected

    def test_a_stop_from_an_older_try_is_fenced_by_the_setter_too(self, store):
        taken_over(store, "t1")
        recorded = store.record_transition("t1", StopForTry("stopped from Airflow", 1))
        assert (recorded.applied, recorded.status) == (False, TrialStatus.RUNNING)
        plain = store.record_transition("t1", Transition.STOPPED, why="x", try_number=1)
        assert (plain.applied, plain.status) == (False, TrialStatus.RUNNING)
        assert cause(store, "t1") == (TrialStatus.RUNNING, StatusCause.PLACED)

    def test_a_registration_from_an_older_try_changes_nothing_and_the_fence_holds(self, store):
        taken_over(store, "t1")
        add_results(store, "t1", [{"training_iteration": 1, "loss": 0.5}])
        before = store.reader.get_trial("t1")
        # Try 1, a zombie of the cleared task, runs execute again: it registers the trial anew.
        register(store, "t1", try_number=1, run_id="zombie", task_id="zombie", map_index=7)
        after = store.reader.get_trial("t1")
        assert after == before
        assert (after.try_number, after.run_id, after.map_index) == (2, None, -1)
        store.record_progress([finished("t1", 1)])
        assert cause(store, "t1") == (TrialStatus.RUNNING, StatusCause.PLACED)
        register(store, "t1", try_number=2, run_id="run-2")  # the registered try refreshes
        assert store.reader.get_trial("t1").run_id == "run-2"

    def test_a_restart_from_an_older_try_keeps_the_results_and_the_registered_try(self, store):
        taken_over(store, "t1")
        add_results(store, "t1", [{"training_iteration": 1, "loss": 0.5}])
        store.record_progress([finished("t1", 2)])
        recorded = store.record_transition("t1", RestartFromScratch(try_number=1))
        assert (recorded.applied, recorded.status) == (False, TrialStatus.TERMINATED)
        record = store.reader.get_trial("t1")
        assert (record.try_number, record.last_result) == (2, {"loss": 1.0})
        assert [r["loss"] for r in store.reader.get_results("t1")] == [0.5]
        recorded = store.record_transition("t1", RestartFromScratch(try_number=3))
        assert (recorded.applied, recorded.status) == (True, TrialStatus.PENDING)
        assert store.reader.get_trial("t1").try_number == 3

    # -- migration 0018 ------------------------------------------------------------------------

    def test_upgrade_from_0017_leaves_the_causes_unknown_and_downgrade_keeps_the_trials(
        self, store, store_url
    ):
        if self.backend == MEMORY:
            pytest.skip("sqlite:// is a new, empty database per engine: nothing to upgrade")
        register(store, "t1")
        add_results(store, "t1", [{"training_iteration": 1, "loss": 1.0}])
        engine = store._write_engine
        _migrate(engine, "0017", upgrade=False)
        with engine.connect() as connection:
            assert connection.execute(text("SELECT count(*) FROM at_results")).scalar_one() == 1
        _migrate(engine, "head", upgrade=True)
        assert current_revision(engine) == HEAD_REVISION
        assert cause(store, "t1") == (TrialStatus.PENDING, None)
        store.record_transition("t1", Transition.PLACED)
        assert cause(store, "t1") == (TrialStatus.RUNNING, StatusCause.PLACED)
        assert schema_differences(store) == []


class TestInMemorySQLite(StatusCauseContract):
    backend = MEMORY


class TestSQLiteFile(StatusCauseContract):
    backend = SQLITE_FILE


@pytest.mark.postgres
class TestPostgreSQL(StatusCauseContract):
    backend = POSTGRESQL
