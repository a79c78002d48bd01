"""Ray Train inside a trial, on a real local Ray: the example trainable runs a TorchTrainer with 2
gloo workers per trial, and the engine keeps, resumes and judges it as any other trial."""

from __future__ import annotations

import os
import signal

import pytest
import ray

from airflow_trials import ASHAScheduler, Callback, Trial, TrialRunner, TrialStatus
from airflow_trials.execution.handles import find_trial_actor

pytest.importorskip(
    "torch",
    reason="the Ray Train example needs torch: pip install -c constraints.txt '.[torch]' "
    "(.ci/run installs it)",
)

TRAINABLE = "airflow_trials.examples.torch_train:train"


class KillOnce(Callback):
    """Kills one trial's actor once, right after its result at ``iteration``."""

    def __init__(self, trial_id: str, iteration: int) -> None:
        self.trial_id, self.iteration, self.killed = trial_id, iteration, False

    def on_trial_result(self, trial, result):
        if trial.trial_id == self.trial_id and result["training_iteration"] == self.iteration:
            if not self.killed:
                self.killed = True
                ray.kill(find_trial_actor(trial.experiment_name, trial.trial_id))


def _trial(trial_id: str, lr: float, **settings) -> Trial:
    # 2 CPUs for the actor, the Train driver: on 3 CPUs one trial runs at a time, and its 2
    # workers (0.25 CPU each, in the placement group Train reserves itself) fit beside it, as do
    # those of the killed actor's run until Train's PlacementGroupCleaner removes their group.
    return Trial(
        TRAINABLE,
        {"lr": lr, "hidden": 16, "n_samples": 600, "seed": 1, "cpu_per_worker": 0.25},
        trial_id=trial_id,
        experiment_name="train-exp",
        keep_checkpoints_num=2,
        checkpoint_score_attr="min-loss",
        **{"resources": {"cpu": 2}, "max_failures": 1, **settings},
    )


@pytest.mark.parametrize("ray_cluster", [{"num_cpus": 3, "num_gpus": 0}], indirect=True)
def test_train_workers_report_the_trials_results_checkpoints_resume_and_asha_stops_the_worse(
    ray_cluster, storage
):
    # Rungs at iterations 2 and 4, max_t 6; the good trial runs first, so the bad one (lr 0:
    # it never learns) meets the good one's rung-2 loss and is stopped there.
    scheduler = ASHAScheduler(
        metric="loss", mode="min", max_t=6, grace_period=2, reduction_factor=2
    )
    kill = KillOnce("good", iteration=3)
    runner = TrialRunner(
        "train-exp",
        storage_path=storage,
        scheduler=scheduler,
        callbacks=[kill],
        wait_timeout_s=120.0,
    )
    trials = {t.trial_id: t for t in (_trial("good", 0.05), _trial("bad", 0.0))}
    for trial in trials.values():
        runner.add_trial(trial)
    runner.run()

    assert {t: trials[t].status for t in trials} == {
        "good": TrialStatus.TERMINATED,
        "bad": TrialStatus.TERMINATED,
    }
    assert trials["bad"].error_msg is None
    assert "killed by `ray.kill`" in trials["good"].error_msg  # the recovered failure's
    good = [r for _, r in runner.results("good")]
    bad = [r for _, r in runner.results("bad")]
    # Every result came from the 2 Train workers, one per epoch.
    assert {r["world_size"] for r in good + bad} == {2}
    assert [r["training_iteration"] for r in bad] == [1, 2]
    assert "stopped by ASHA" in trials["bad"].stop_reason
    # The good trial's actor was killed after epoch 3: the runner restarted it from the
    # checkpoint of epoch 3 and Train's loop went on at epoch 4, up to ASHA's max_t.
    assert kill.killed and trials["good"].num_failures == 1
    assert [(r["training_iteration"], r["epoch"]) for r in good] == [(i, i) for i in range(1, 7)]
    assert [r["iterations_since_restore"] for r in good if r["epoch"] >= 4][0] == 1
    assert good[-1]["loss"] < bad[-1]["loss"]
    # keep-N: the 2 best checkpoints by loss are kept, each a directory Train's rank 0 wrote.
    kept = trials["good"].checkpoint_manager.kept
    assert len(kept) == 2
    assert all(os.path.isfile(os.path.join(record.path, "state.pt")) for record in kept)
    best = trials["good"].checkpoint_manager.best()
    assert best.metrics["loss"] == min(r["loss"] for r in good if r.get("epoch"))


class KillATrainWorker(Callback):
    """SIGKILLs the process of one of the trial's Train workers once, right after the trial's
    result at ``iteration``: the workers are then inside the next epoch."""

    def __init__(self, iteration: int) -> None:
        self.iteration, self.killed_pid = iteration, None

    def on_trial_result(self, trial, result):
        if result["training_iteration"] != self.iteration or self.killed_pid is not None:
            return
        from ray._private.state import actors  # the GCS's table: no dashboard needed

        workers = [
            a["Pid"]
            for a in actors().values()
            if a["ActorClassName"].endswith("RayTrainWorker") and a["State"] == "ALIVE"
        ]
        assert len(workers) == 2, workers
        self.killed_pid = workers[-1]
        os.kill(self.killed_pid, signal.SIGKILL)


@pytest.mark.parametrize("ray_cluster", [{"num_cpus": 3, "num_gpus": 0}], indirect=True)
def test_a_train_worker_killed_mid_epoch_restarts_the_workers_from_the_trials_last_checkpoint(
    ray_cluster, storage
):
    """Issue 51: a Train worker's process SIGKILLed mid-epoch. Train's FailureConfig (the
    example's ``train_max_failures``) starts the workers again from the latest checkpoint they
    reported, which is the trial's latest: the trial goes on in the same actor, spends none of its
    max_failures, and its stored iterations have no gap and no repeat."""
    kill = KillATrainWorker(iteration=2)
    runner = TrialRunner("train-exp", storage_path=storage, callbacks=[kill], wait_timeout_s=120.0)
    # max_failures=0: a counted failure would end the trial ERROR.
    trial = _trial(
        "killed-worker", 0.05, max_failures=0, stopping_criterion={"training_iteration": 5}
    )
    runner.add_trial(trial)
    runner.run()

    assert kill.killed_pid is not None
    assert trial.status == TrialStatus.TERMINATED, trial.error_msg
    assert trial.num_failures == 0
    results = [r for _, r in runner.results("killed-worker")]
    assert [(r["training_iteration"], r["epoch"]) for r in results] == [(i, i) for i in range(1, 6)]
    # One actor throughout: the restart was Train's, inside the trial.
    assert [r["iterations_since_restore"] for r in results] == [1, 2, 3, 4, 5]
    assert {r["world_size"] for r in results} == {2}
    # Every result names the nodes its workers ran on (one node here).
    assert all(len(r["worker_node_ids"]) == 1 for r in results)


@pytest.mark.parametrize("ray_cluster", [{"num_cpus": 3, "num_gpus": 0}], indirect=True)
def test_ray_train_resources_size_train_s_workers_and_the_runner_counts_them(ray_cluster, storage):
    """Two trials of ``RayTrainResources(driver 0.5 CPU, 2 workers x 1 CPU)`` on 3 CPUs: the
    trainable reads its workers from the trial's resources (``get_trial_resources()``), and the
    runner counts driver and workers (2.5 CPUs), so the second trial starts only once the first
    ended, instead of waiting inside Train for its workers' group."""
    from airflow_trials import RayTrainResources

    resources = RayTrainResources(
        driver={"CPU": 0.5}, num_workers=2, resources_per_worker={"CPU": 1}
    )
    trials = [
        _trial(name, 0.05, resources=resources, stopping_criterion={"training_iteration": 2})
        for name in ("first", "second")
    ]
    seen = SeenAtEachResult(trials)
    runner = TrialRunner("train-exp", storage_path=storage, callbacks=[seen], wait_timeout_s=120.0)
    for trial in trials:
        runner.add_trial(trial)
    runner.run()

    assert [t.status for t in trials] == [TrialStatus.TERMINATED] * 2, [t.error_msg for t in trials]
    results = [r for t in trials for _, r in runner.results(t.trial_id)]
    assert {r["world_size"] for r in results} == {2}
    # One at a time: while one trial reported, the other was waiting or done.
    assert seen.statuses == [
        ("first", TrialStatus.PENDING),
        ("first", TrialStatus.PENDING),
        ("second", TrialStatus.TERMINATED),
        ("second", TrialStatus.TERMINATED),
    ]


class SeenAtEachResult(Callback):
    """At each result of a trial, the status of the other trial."""

    def __init__(self, trials) -> None:
        self.trials, self.statuses = trials, []

    def on_trial_result(self, trial, result):
        (other,) = [t for t in self.trials if t is not trial]
        self.statuses.append((trial.trial_id, other.status))
