"""Contract of a trial's stop kind in the trials store (migration 0017), on every backend: the end
records the kind its path said, nothing reads it back from the stop reason's text, the one status
setter refuses it on a trial that is not TERMINATED and clears it when the trial starts again, and
an upgrade gives the rows it finds the kind their text gave until then."""

from __future__ import annotations

import pytest
from sqlalchemy import text
from sqlalchemy.orm import Session

from airflow_trials.core.end import TrialEnd
from airflow_trials.core.fate import CRITERION_MET, TRAINABLE_FINISHED, Transition
from airflow_trials.core.status import TrialStatus
from airflow_trials.core.status_cause import StatusCause
from airflow_trials.core.stop_kind import StopKind
from airflow_trials.core.update import TrialUpdate
from airflow_trials.schedulers.asha.rung_math import max_t_stop_reason
from airflow_trials.store import StopForTry, TrialStore
from airflow_trials.store.engine import create_store_engine
from airflow_trials.store.migration import current_revision, upgrade_engine
from airflow_trials.store.models import TrialRow
from airflow_trials.store.run_history import stopped_early_counts_query
from airflow_trials.store.trial_writes import change_status
from tests.contract.conftest import MEMORY, POSTGRESQL, SQLITE_FILE
from tests.contract.test_store import HEAD_REVISION, register, schema_differences
from tests.contract.test_store_stop_reason import _migrate
from tests.factories import add_results

ASHA_STOP = (
    "stopped by ASHA at training_iteration=3 (rung 1 of 4): loss 0.41 above the rung's cutoff 0.35"
)
# A user's scheduler, whose sentence happens to hold the words ASHA's max_t stop was told by.
PLATEAU_STOP = (
    "stopped by PlateauRule at training_iteration=4: it reached max_t=4 of its patience window "
    "without improving loss"
)


def ended_by_actor(
    store: TrialStore, trial_id: str, run: int | None, reason: str | None, kind: StopKind | None
) -> None:
    """A trial registered, placed, and ended as the trigger reads its actor's last poll."""
    register(store, trial_id, run)
    store.record_transition(trial_id, Transition.PLACED)
    add_results(store, trial_id, [{"training_iteration": 1, "loss": 1.0}])
    update = TrialUpdate(
        trial_id,
        status=TrialStatus.TERMINATED,
        last_result={"training_iteration": 1, "loss": 1.0},
        num_results=1,
        stop_reason=reason,
        stop_kind=kind,
    )
    store.record_end(update.end("exp", released=True))


def early_by_every_read(store: TrialStore, run: int) -> dict[str, object]:
    """The early-stopped trials of ``run`` as each read sees them: the batch read, the ranked
    page's filter (and its total) and the history's count."""
    reader = store.reader
    early = reader.ranked_page(run, "loss", "min", stopped="early")
    not_early = reader.ranked_page(run, "loss", "min", stopped="not_early")
    with store._engine.connect() as connection:
        counted = dict(connection.execute(stopped_early_counts_query([run])).all())
    return {
        "batch": reader.early_stopped_trials(run),
        "page": {t.trial_id for _, t in early.rows},
        "page_total": early.total,
        "not_early": {t.trial_id for _, t in not_early.rows},
        "history": counted.get(run, 0),
    }


class StopKindContract:
    """Every backend must pass these; subclasses name the backend for the ``store`` fixture."""

    backend: str

    def test_the_end_records_the_kind_its_path_said(self, store):
        for trial_id, kind in (("asha", StopKind.SCHEDULER), ("done", StopKind.FINISHED)):
            ended_by_actor(store, trial_id, None, ASHA_STOP, kind)
        records = {t.trial_id: t for t in store.reader.list_trials()}
        assert {t: (r.stop_kind, r.stop_reason) for t, r in records.items()} == {
            "asha": (StopKind.SCHEDULER, ASHA_STOP),
            "done": (StopKind.FINISHED, ASHA_STOP),
        }
        stops = store.reader.stops_of(["asha", "done", "unknown"])
        assert {t: (s.kind, s.reason) for t, s in stops.items()} == {
            "asha": (StopKind.SCHEDULER, ASHA_STOP),
            "done": (StopKind.FINISHED, ASHA_STOP),
        }
        # A stored end carries no kind: the one recorded stays.
        store.record_end(TrialEnd.stored("asha", "exp", {"training_iteration": 1}, None))
        assert store.reader.get_trial("asha").stop_kind is StopKind.SCHEDULER

    def test_every_read_of_early_stopped_goes_by_the_kind_not_the_words(self, store):
        """The defect: "stopped early" was parsed from the stop reason, so a user's scheduler
        whose sentence held ": it reached max_t=" was not early-stopped, and any sentence at all
        (the experiment's own end) was."""
        store.ensure_experiment("exp", metric="loss", mode="min")
        run = store.create_experiment_run("exp", "r1")
        ended_by_actor(store, "plateau", run, PLATEAU_STOP, StopKind.SCHEDULER)
        ended_by_actor(store, "ended-by-run", run, "stopped by the sweep", StopKind.EXPERIMENT)
        ended_by_actor(
            store,
            "at-max-t",
            run,
            max_t_stop_reason("training_iteration", 4, 4),
            StopKind.MAX_T,
        )
        ended_by_actor(store, "criterion", run, CRITERION_MET, StopKind.CRITERION)
        register(store, "running", run)
        assert early_by_every_read(store, run) == {
            "batch": {"plateau"},
            "page": {"plateau"},
            "page_total": 1,
            "not_early": {"ended-by-run", "at-max-t", "criterion", "running"},
            "history": 1,
        }

    def test_the_setter_takes_a_kind_only_for_a_terminated_trial(self, store):
        register(store, "t1")
        store.record_transition("t1", Transition.PLACED)
        with store._write_engine.begin() as connection:
            with Session(bind=connection) as session:
                row = session.get_one(TrialRow, "t1")
                with pytest.raises(ValueError, match="t1 would be RUNNING: only a TERMINATED"):
                    change_status(row, None, {}, cause=None, stop_kind=StopKind.SCHEDULER)
                with pytest.raises(ValueError, match="stop kind of trial t1 as a field"):
                    change_status(
                        row,
                        TrialStatus.TERMINATED,
                        {"stop_kind": "scheduler"},
                        cause=StatusCause.END,
                    )
        assert store.reader.get_trial("t1").stop_kind is None

    @pytest.mark.parametrize("start", [Transition.QUEUED, Transition.RESET])
    def test_starting_the_trial_again_clears_its_kind(self, store, start):
        ended_by_actor(store, "t1", None, ASHA_STOP, StopKind.SCHEDULER)
        store.record_transition("t1", start)
        record = store.reader.get_trial("t1")
        assert (record.status, record.stop_kind, record.stop_reason) == (
            TrialStatus.PENDING,
            None,
            None,
        )

    def test_a_stop_from_airflow_is_of_its_own_kind(self, store):
        for trial_id in ("fenced", "plain"):
            register(store, trial_id, try_number=1)
            store.record_transition(trial_id, Transition.PLACED)
        store.record_transition("fenced", StopForTry("stopped from Airflow", 1))
        store.record_transition("plain", Transition.STOPPED, why="Stopped from Airflow.")
        kinds = {t.trial_id: t.stop_kind for t in store.reader.list_trials()}
        assert kinds == {"fenced": StopKind.AIRFLOW, "plain": StopKind.AIRFLOW}

    # -- migration 0017 ------------------------------------------------------------------------

    def test_upgrade_from_0016_gives_each_trial_the_kind_its_text_gave(self, store_url):
        if self.backend == MEMORY:
            pytest.skip("sqlite:// is a new, empty database per engine: nothing to upgrade")
        engine = create_store_engine(store_url)
        old = {
            # trial_id: (status, stop_reason, stopped_from_airflow) -> the kind expected
            "finished": ("TERMINATED", TRAINABLE_FINISHED, False),
            "criterion": ("TERMINATED", CRITERION_MET, False),
            "asha": ("TERMINATED", ASHA_STOP, False),
            "max-t": ("TERMINATED", max_t_stop_reason("training_iteration", 9, 9), False),
            "airflow": ("TERMINATED", None, True),
            "silent": ("TERMINATED", None, False),
            "empty": ("TERMINATED", "", False),
            "failed": ("ERROR", None, False),
            "running": ("RUNNING", None, False),
        }
        try:
            _migrate(engine, "0016", upgrade=True)
            with engine.begin() as connection:
                connection.execute(
                    text(
                        "INSERT INTO at_experiments (name, created_at) "
                        "VALUES ('exp', CURRENT_TIMESTAMP)"
                    )
                )
                connection.execute(
                    text(
                        "INSERT INTO at_experiment_runs (experiment_id, run_key, status, "
                        "created_at) VALUES (1, 'r1', 'SUCCESS', CURRENT_TIMESTAMP)"
                    )
                )
                for trial_id, (status, reason, from_airflow) in old.items():
                    connection.execute(
                        text(
                            "INSERT INTO at_trials (trial_id, experiment_run_id, trainable, "
                            "config, resources, status, max_failures, stop_reason, "
                            "stopped_from_airflow, created_at, updated_at) VALUES (:trial_id, 1, "
                            "'m:f', '{}', '{}', :status, 0, :reason, :from_airflow, "
                            "CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)"
                        ),
                        {
                            "trial_id": trial_id,
                            "status": status,
                            "reason": reason,
                            "from_airflow": from_airflow,
                        },
                    )
            upgrade_engine(engine)
            assert current_revision(engine) == HEAD_REVISION
        finally:
            engine.dispose()
        store = TrialStore(store_url)
        try:
            kinds = {t.trial_id: t.stop_kind for t in store.reader.list_trials()}
            assert kinds == {
                "finished": StopKind.FINISHED,
                "criterion": StopKind.CRITERION,
                "asha": StopKind.SCHEDULER,
                "max-t": StopKind.MAX_T,
                "airflow": StopKind.AIRFLOW,
                "silent": None,
                "empty": None,
                "failed": None,
                "running": None,
            }
            (run,) = store.reader.list_experiment_runs("exp")
            assert store.reader.early_stopped_trials(run.id) == {"asha"}
            assert schema_differences(store) == []
        finally:
            store.dispose()

    def test_downgrade_to_0016_and_back_keeps_the_trials(self, store, store_url):
        if self.backend == MEMORY:
            pytest.skip("sqlite:// is a new, empty database per engine: nothing to downgrade")
        ended_by_actor(store, "t1", None, ASHA_STOP, StopKind.SCHEDULER)
        engine = store._write_engine
        _migrate(engine, "0016", upgrade=False)
        with engine.connect() as connection:
            kept = connection.execute(text("SELECT count(*) FROM at_results")).scalar_one()
        assert kept == 1  # no rebuild of at_trials cascaded into its results
        _migrate(engine, "head", upgrade=True)
        record = store.reader.get_trial("t1")
        # Upgraded again, the kind comes back from the reason by the old rule.
        assert (record.stop_reason, record.stop_kind) == (ASHA_STOP, StopKind.SCHEDULER)
        assert schema_differences(store) == []


class TestInMemorySQLite(StopKindContract):
    backend = MEMORY


class TestSQLiteFile(StopKindContract):
    backend = SQLITE_FILE


@pytest.mark.postgres
class TestPostgreSQL(StopKindContract):
    backend = POSTGRESQL
