"""An engine-only run recorded by TrialsDbCallback on a real local Ray, read back as a ResultGrid,
on a SQLite file and on PostgreSQL."""

from __future__ import annotations

import pytest

from airflow_trials import ResultGrid, Trial, TrialRunner, TrialsDbCallback, TrialStatus
from airflow_trials.store import ExperimentRunStatus, TrialStore
from tests.contract.conftest import postgres_schema_url  # noqa: F401 - the fixture


@pytest.fixture(params=["sqlite-file", pytest.param("postgresql", marks=pytest.mark.postgres)])
def db_url(request, tmp_path) -> str:
    if request.param == "postgresql":
        return request.getfixturevalue("postgres_schema_url")
    return f"sqlite:///{tmp_path / 'trials.db'}"


def test_a_runner_run_reads_back_like_a_dag_run(ray_cluster, storage, tmp_path, db_url):
    recorder = TrialsDbCallback(metric="score", mode="max", db_url=db_url, run_key="engine-1")
    runner = TrialRunner("engine-exp", storage_path=storage, callbacks=[recorder], wait_timeout_s=10.0)
    runner.add_trial(Trial("tests.trainables:peaked", {"x": 1}, trial_id="peaked", experiment_name="engine-exp",
                           resources={"cpu": 0.5}, keep_checkpoints_num=2, checkpoint_score_attr="score"))
    runner.add_trial(Trial("tests.trainables:counting", {"crash_at": 2, "marker": str(tmp_path / "crashed")},
                           trial_id="retried", experiment_name="engine-exp", resources={"cpu": 0.5},
                           stopping_criterion={"training_iteration": 3}, max_failures=1))
    runner.add_trial(Trial("tests.trainables:failing", trial_id="broken", experiment_name="engine-exp",
                           resources={"cpu": 0.5}))
    runner.run()

    grid = recorder.result_grid()
    assert (grid.experiment_name, grid.run_key, grid.metric, grid.mode) == ("engine-exp", "engine-1", "score", "max")
    by_id = {r.trial_id: r for r in grid}
    assert {t: r.status for t, r in by_id.items()} == {
        "peaked": TrialStatus.TERMINATED, "retried": TrialStatus.TERMINATED, "broken": TrialStatus.ERROR}
    # Scores 1, 5, 2, 3: the kept best (iteration 2) is not the latest (iteration 4).
    peaked = by_id["peaked"]
    assert peaked.best_checkpoint.endswith("checkpoint_000002")
    assert peaked.latest_checkpoint.endswith("checkpoint_000004")
    assert list(peaked.metrics_dataframe["score"]) == [1.0, 5.0, 2.0, 3.0]
    assert grid.get_best_result(scope="all").trial_id == "peaked"  # its 5 beats the retried trial's 3
    # The retried trial resumed from its checkpoint: each iteration recorded once.
    retried = by_id["retried"]
    assert retried.num_failures == 1
    assert list(retried.metrics_dataframe["training_iteration"]) == [1, 2, 3]
    assert "broken trainable" in by_id["broken"].error and grid.num_errors == 1

    store = TrialStore(db_url)
    try:
        (run,) = store.list_experiment_runs("engine-exp")
        assert run.status is ExperimentRunStatus.SUCCESS
        # The same rows the CLI and the dashboard read.
        assert [r.trial_id for r in store.leaderboard(run.id, "score", "max")][:1] == ["peaked"]
    finally:
        store.dispose()
    assert ResultGrid.from_db("engine-exp", db_url=db_url).run_key == "engine-1"
