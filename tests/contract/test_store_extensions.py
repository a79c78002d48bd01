"""Contract of a run's extensions (``begin_run_extension``, ``end_run_extension``,
``list_run_extensions``) and of ContinueWithRaisedStop, on SQLite and PostgreSQL."""

from __future__ import annotations

import pytest

from airflow_trials.core.end import TrialEnd
from airflow_trials.core.fate import CRITERION_MET, Transition
from airflow_trials.core.scheduler import Decision
from airflow_trials.core.status import TrialStatus
from airflow_trials.exceptions import ExperimentStateError
from airflow_trials.schedulers.asha.asha_rungs import RungVerdict
from airflow_trials.store import ContinueWithRaisedStop
from tests.contract.conftest import MEMORY, POSTGRESQL, SQLITE_FILE
from tests.factories import add_checkpoint, add_results
from tests.scheduler_writes import OneWriteEach


def finished_run(store, trial_ids=("a", "b")) -> int:
    """A run whose trials trained 3 iterations, checkpointed at 3, and ended; the run SUCCESS."""
    store.ensure_experiment("ext", metric="score", mode="max")
    run = store.create_experiment_run("ext", "run-1", dag_id="ext", run_id="run-1")
    for trial_id in trial_ids:
        store.upsert_trial(
            trial_id,
            trainable="m:f",
            config={"x": 1},
            resources={"cpu": 1},
            max_failures=0,
            experiment_run_id=run,
        )
        store.record_transition(trial_id, Transition.PLACED)
        add_results(
            store, trial_id, [{"training_iteration": i, "score": float(i)} for i in (1, 2, 3)]
        )
        add_checkpoint(store, trial_id, f"/ckpt/{trial_id}/3", 3)
        OneWriteEach(store).record_rung(
            run,
            trial_id,
            bracket=0,
            milestone=1,
            value=1.0,
            iteration=1,
            decide=lambda values: RungVerdict(Decision.CONTINUE, None),
        )
        store.record_end(
            TrialEnd(
                trial_id,
                "ext",
                TrialStatus.TERMINATED,
                last_result={"training_iteration": 3, "score": 3.0},
                stop_reason=CRITERION_MET,
            )
        )
    store.finish_experiment_run(run, "SUCCESS")
    return run


class ExtensionContract:
    backend: str

    def test_an_extension_is_recorded_once_and_sets_its_run_running(self, store):
        run = finished_run(store)
        assert store.reader.experiment_history("ext")  # the ended run's history line is stored
        record = store.begin_run_extension(
            run,
            "extend-1",
            num_samples_added=2,
            stop_before={"training_iteration": 3},
            stop_after={"training_iteration": 5},
            trials_continued=["a", "b"],
            trials_added=["c", "d"],
        )
        (stored,) = store.reader.list_experiment_runs("ext")
        assert stored.status.value == "RUNNING" and stored.ended_at is None
        again = store.begin_run_extension(  # a retry of suggest_configs: the first record
            run,
            "extend-1",
            num_samples_added=9,
            stop_before=None,
            stop_after=None,
            trials_continued=[],
            trials_added=[],
        )
        assert again == record
        assert record.changes() == (
            "+2 samples, stop {'training_iteration': 3} -> {'training_iteration': 5}, "
            "2 trials continued"
        )
        assert (
            store.reader.list_run_extensions(run) == [record] == store.reader.list_run_extensions()
        )
        assert store.end_run_extension(run, "extend-1", "SUCCESS")
        assert not store.end_run_extension(run, "not-an-extension", "SUCCESS")
        (ended,) = store.reader.list_run_extensions(run)
        assert ended.status.value == "SUCCESS" and ended.ended_at is not None

    def test_an_extension_clears_the_reason_the_run_was_ended_by_hand(self, store):
        run = finished_run(store)
        store.finish_experiment_run(run, "FAILED", reason="marked failed")
        store.begin_run_extension(
            run,
            "extend-1",
            num_samples_added=1,
            stop_before=None,
            stop_after=None,
            trials_continued=[],
            trials_added=["c"],
        )
        (record,) = store.reader.list_experiment_runs("ext")
        assert record.status.value == "RUNNING" and record.end_reason is None

    def test_a_running_run_is_not_extended_and_nothing_is_written(self, store):
        run = finished_run(store)
        store.finish_experiment_run(run, "RUNNING")
        with pytest.raises(
            ExperimentStateError, match="run-1 is still RUNNING.*nothing was written"
        ):
            store.begin_run_extension(
                run,
                "extend-1",
                num_samples_added=1,
                stop_before=None,
                stop_after=None,
                trials_continued=[],
                trials_added=["c"],
            )
        assert store.reader.list_run_extensions(run) == []

    def test_a_continued_trial_keeps_its_results_checkpoints_and_rungs(self, store):
        run = finished_run(store)
        recorded = store.record_transition("a", ContinueWithRaisedStop("extend-1"))
        assert recorded.status is TrialStatus.PENDING and recorded.applied
        trial = store.reader.get_trial("a")
        assert trial.status is TrialStatus.PENDING and trial.stop_reason is None
        assert trial.ended_at is None and trial.started_at is not None
        assert [r["training_iteration"] for r in store.reader.get_results("a")] == [1, 2, 3]
        assert store.reader.latest_checkpoint("a").path == "/ckpt/a/3"
        assert [r.milestone for r in store.reader.trial_rungs("a")] == [1.0]
        assert [r.best_value for r in store.reader.leaderboard(run, "score", "max")] == [3.0, 3.0]
        # Again (a retry of the extension's suggest_configs): not TERMINATED, left as it is.
        assert not store.record_transition("a", ContinueWithRaisedStop("extend-1")).applied
        assert store.reader.get_trial("b").status is TrialStatus.TERMINATED


class TestInMemorySQLite(ExtensionContract):
    backend = MEMORY


class TestSQLiteFile(ExtensionContract):
    backend = SQLITE_FILE


@pytest.mark.postgres
class TestPostgreSQL(ExtensionContract):
    backend = POSTGRESQL
