"""An engine-only run recorded by TrialsDbCallback on a real local Ray, read back as a ResultGrid,
on a SQLite file and on PostgreSQL."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from airflow_trials import (
    Callback,
    PopulationBasedTraining,
    ResultGrid,
    Trial,
    TrialNotFoundError,
    TrialRunner,
    TrialsDbCallback,
    TrialStatus,
)
from airflow_trials.store import ExperimentRunStatus, TrialStore
from tests.contract.conftest import postgres_schema_url  # noqa: F401 - the fixture


@pytest.fixture(params=["sqlite-file", pytest.param("postgresql", marks=pytest.mark.postgres)])
def db_url(request, tmp_path) -> str:
    if request.param == "postgresql":
        return request.getfixturevalue("postgres_schema_url")
    return f"sqlite:///{tmp_path / 'trials.db'}"


# write_behind: as a sweep's driver records (its writes on a thread of their own, in order).
WRITE_BEHIND = pytest.mark.parametrize(
    "write_behind", [False, True], ids=["direct", "write-behind"]
)


@WRITE_BEHIND
def test_a_runner_run_reads_back_like_a_dag_run(
    ray_cluster, storage, tmp_path, db_url, write_behind
):
    recorder = TrialsDbCallback(
        metric="score", mode="max", db_url=db_url, run_key="engine-1", write_behind=write_behind
    )
    runner = TrialRunner(
        "engine-exp", storage_path=storage, callbacks=[recorder], wait_timeout_s=10.0
    )
    runner.add_trial(
        Trial(
            "tests.trainables:peaked",
            {"x": 1},
            trial_id="peaked",
            experiment_name="engine-exp",
            resources={"cpu": 0.5},
            keep_checkpoints_num=2,
            checkpoint_score_attr="score",
        )
    )
    runner.add_trial(
        Trial(
            "tests.trainables:counting",
            {"crash_at": 2, "marker": str(tmp_path / "crashed")},
            trial_id="retried",
            experiment_name="engine-exp",
            resources={"cpu": 0.5},
            stopping_criterion={"training_iteration": 3},
            max_failures=1,
        )
    )
    runner.add_trial(
        Trial(
            "tests.trainables:failing",
            trial_id="broken",
            experiment_name="engine-exp",
            resources={"cpu": 0.5},
        )
    )
    runner.run()

    grid = recorder.result_grid()
    assert (grid.experiment_name, grid.run_key, grid.metric, grid.mode) == (
        "engine-exp",
        "engine-1",
        "score",
        "max",
    )
    by_id = {r.trial_id: r for r in grid}
    assert {t: r.status for t, r in by_id.items()} == {
        "peaked": TrialStatus.TERMINATED,
        "retried": TrialStatus.TERMINATED,
        "broken": TrialStatus.ERROR,
    }
    # Scores 1, 5, 2, 3: the kept best (iteration 2) is not the latest (iteration 4).
    peaked = by_id["peaked"]
    assert peaked.best_checkpoint.endswith("checkpoint_000002")
    assert peaked.latest_checkpoint.endswith("checkpoint_000004")
    assert list(peaked.metrics_dataframe["score"]) == [1.0, 5.0, 2.0, 3.0]
    assert (
        grid.get_best_result(scope="all").trial_id == "peaked"
    )  # its 5 beats the retried trial's 3
    # The retried trial resumed from its checkpoint: each iteration recorded once.
    retried = by_id["retried"]
    assert retried.num_failures == 1
    assert list(retried.metrics_dataframe["training_iteration"]) == [1, 2, 3]
    assert "broken trainable" in by_id["broken"].error and grid.num_errors == 1

    store = TrialStore(db_url)
    try:
        (run,) = store.reader.list_experiment_runs("engine-exp")
        assert run.status is ExperimentRunStatus.SUCCESS
        # The same rows the CLI and the dashboard read.
        assert [r.trial_id for r in store.reader.leaderboard(run.id, "score", "max")][:1] == [
            "peaked"
        ]
    finally:
        store.dispose()
    assert ResultGrid.from_db("engine-exp", db_url=db_url).run_key == "engine-1"


@WRITE_BEHIND
def test_pbt_exploits_are_recorded_with_the_trial_s_config_and_lineage(
    ray_cluster, storage, db_url, write_behind
):
    # As tests/integration/test_schedulers.py's PBT run: "d" (scale 0.1) is always at the bottom,
    # so it clones a top trial at every second iteration; each exploit must reach the trials DB.
    scheduler = PopulationBasedTraining(
        time_attr="training_iteration",
        metric="score",
        mode="max",
        perturbation_interval=2,
        hyperparam_mutations={"scale": [0.1, 0.5, 1.0, 2.0, 4.0]},
        quantile_fraction=0.5,
        resample_probability=0.0,
        rng=random.Random(0),
    )
    recorder = TrialsDbCallback(
        metric="score", mode="max", db_url=db_url, run_key="pbt-1", write_behind=write_behind
    )
    seen = ResultsAfterExploits()
    runner = TrialRunner(
        "pbt-exp",
        storage_path=storage,
        scheduler=scheduler,
        callbacks=[recorder, seen],
        stop={"training_iteration": 6},
        wait_timeout_s=10.0,
    )
    for trial_id, scale in {"a": 2.0, "b": 1.0, "c": 0.5, "d": 0.1}.items():
        runner.add_trial(
            Trial(
                "tests.trainables:counting",
                {"scale": scale},
                trial_id=trial_id,
                experiment_name="pbt-exp",
                resources={"cpu": 1},
            )
        )

    trials = {trial.trial_id: trial for trial in runner.run()}

    def applied(exploit):
        return (
            exploit.trial_id,
            exploit.donor_trial_id,
            exploit.donor_checkpoint.iteration,
            exploit.donor_checkpoint.path,
            exploit.new_config,
            exploit.operations,
        )

    def recorded(record):
        return (
            record.trial_id,
            record.donor_trial_id,
            record.iteration,
            record.donor_checkpoint,
            record.new_config,
            record.operations,
        )

    store = TrialStore(db_url)
    try:
        (run,) = store.reader.list_experiment_runs("pbt-exp")
        for trial_id, trial in trials.items():
            # The config each trial ended with, which the leaderboard shows, and its lineage.
            assert store.reader.get_trial(trial_id).config == trial.config, trial_id
            assert [recorded(r) for r in store.reader.lineage(trial_id)] == [
                applied(e) for e in scheduler.lineage(trial_id)
            ]
        exploits = store.reader.trial_exploits("d")
        assert exploits, "the bottom trial was never exploited"
        assert exploits[0].old_config == {"scale": 0.1}
        # Each exploit starts from the config the one before it gave.
        assert [e.old_config for e in exploits[1:]] == [e.new_config for e in exploits[:-1]]
        assert {e.experiment_run_id for e in exploits} == {run.id}
        assert exploits[-1].new_config == trials["d"].config
        for trial_id, trial in trials.items():
            # Every iteration of its current state once: the results of a state it gave up are
            # kept in its exploit rows, not lost, not mixed in. (An exploited trial continues from
            # the donor's checkpoint iteration: from 2 to 5 when the donor had run ahead to 4.)
            stored = [r["training_iteration"] for r in store.reader.get_results(trial_id)]
            assert stored == seen.current[trial_id], (trial_id, seen.current[trial_id])
            assert stored[:2] == [1, 2] and stored[-1] == 6, (trial_id, stored)
            assert (
                store.reader.get_trial(trial_id).last_result["score"] == trial.last_result["score"]
            ), trial_id
        for exploit in exploits:
            assert all(
                r["training_iteration"] > exploit.iteration for r in exploit.replaced_results
            )
        assert [[r["training_iteration"] for r in e.replaced_results] for e in exploits] == (
            seen.replaced["d"]
        )
    finally:
        store.dispose()


class ResultsAfterExploits(Callback):
    """Each trial's results as the runner hands them to callbacks, and what each exploit gives up:
    the iterations after the donor's checkpoint (what the trials DB must move into the exploit's
    row), whatever order the trials ran in."""

    def __init__(self) -> None:
        self.current: dict[str, list[int]] = {}
        self.replaced: dict[str, list[list[int]]] = {}

    def on_trial_result(self, trial, result):
        self.current.setdefault(trial.trial_id, []).append(result["training_iteration"])

    def on_trial_exploit(self, trial, exploit, old_config):
        kept = self.current.setdefault(trial.trial_id, [])
        cut = exploit.donor_checkpoint.iteration
        self.replaced.setdefault(trial.trial_id, []).append([i for i in kept if i > cut])
        self.current[trial.trial_id] = [i for i in kept if i <= cut]


class StoredCheckpointsExist(Callback):
    """After every runner step: each checkpoint the trials DB names (committed, as a new driver
    would read it after a crash) is still on the storage."""

    def __init__(self, db_url: str) -> None:
        self.store = TrialStore(db_url)
        self.named: set[int] = set()  # the iterations of the checkpoints the trials DB named

    def on_step_end(self, trials: list[Trial]) -> None:
        for trial in trials:
            try:
                named = self.store.reader.live_checkpoints(trial.trial_id)
            except TrialNotFoundError:
                continue
            missing = [c.path for c in named if not os.path.isdir(c.path)]
            assert not missing, (
                f"the trials DB names deleted checkpoints of {trial.trial_id}: {missing}"
            )
            self.named.update(c.iteration for c in named)


@WRITE_BEHIND
def test_a_runner_deletes_a_dropped_checkpoint_only_once_the_trials_db_no_longer_names_it(
    ray_cluster, storage, db_url, write_behind
):
    # Written every 0.5 s (and at a trial's end): the trials DB names a checkpoint that the trial
    # drops a few results later, long before the next write, as a sweep driver's does.
    recorder = TrialsDbCallback(
        metric="score",
        mode="max",
        db_url=db_url,
        run_key="kept-1",
        write_behind=write_behind,
        flush_interval_s=0.5,
    )
    probe = StoredCheckpointsExist(db_url)
    runner = TrialRunner(
        "kept-exp", storage_path=storage, callbacks=[recorder, probe], wait_timeout_s=10.0
    )
    for i in range(2):
        runner.add_trial(
            Trial(
                "tests.trainables:counting",
                {"sleep": 0.05},
                trial_id=f"kept-{i}",
                experiment_name="kept-exp",
                resources={"cpu": 0.5},
                keep_checkpoints_num=1,
                stopping_criterion={"training_iteration": 40},
            )
        )
    try:
        runner.run()
        # A write named a checkpoint mid-run (the trials take 2 s at least): the case was reached.
        assert probe.named - {40}, probe.named
        for i in range(2):
            trial_dir = Path(storage) / "kept-exp" / f"kept-{i}"
            assert sorted(p.name for p in trial_dir.glob("checkpoint_*")) == ["checkpoint_000040"]
            assert [c.iteration for c in probe.store.reader.live_checkpoints(f"kept-{i}")] == [40]
            assert [
                r["training_iteration"] for r in probe.store.reader.get_results(f"kept-{i}")
            ] == list(range(1, 41))
    finally:
        probe.store.dispose()


def test_a_runner_of_several_metrics_records_them_for_its_pareto_front(
    ray_cluster, storage, db_url
):
    from airflow_trials import OptunaSearch
    from airflow_trials.core.search import uniform

    metric, mode = ["score", "cost"], ["max", "min"]
    recorder = TrialsDbCallback(metric=metric, mode=mode, db_url=db_url, run_key="two-1")
    runner = TrialRunner(
        "two-exp",
        storage_path=storage,
        callbacks=[recorder],
        wait_timeout_s=10.0,
        search_alg=OptunaSearch(
            {"scale": uniform(0.1, 2.0), "cost": uniform(0.0, 1.0)},
            metric=metric,
            mode=mode,
            seed=0,
        ),
        num_samples=4,
        trainable="tests.trainables:two_metrics",
        trial_kwargs={"resources": {"cpu": 0.5}, "stopping_criterion": {"training_iteration": 2}},
    )
    runner.run()

    store = TrialStore(db_url)
    try:
        experiment = store.reader.get_experiment("two-exp")
        assert (experiment.metrics, experiment.modes, experiment.mode) == (metric, mode, None)
    finally:
        store.dispose()
    grid = recorder.result_grid()
    assert (grid.metric, grid.mode) == (metric, mode)
    values = {r.trial_id: (r.metrics["score"], r.metrics["cost"]) for r in grid}
    assert len(values) == 4 and grid.num_terminated == 4
    front = {r.trial_id for r in grid.get_pareto_front()}  # the recorded metrics by default
    assert front == {
        i
        for i, (score, cost) in values.items()
        if not any(
            s >= score and c <= cost and (s, c) != (score, cost)
            for j, (s, c) in values.items()
            if j != i
        )
    }
