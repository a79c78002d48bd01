"""The trial runner on a real local Ray, porting the behaviours Ray Tune's own tests check."""

from __future__ import annotations

import json
import os

import pytest

from airflow_trials import (
    Callback,
    Decision,
    FIFOScheduler,
    InsufficientResourcesError,
    RayTrialExecutor,
    Resources,
    RunnerFinishedError,
    Trial,
    TrialError,
    TrialRunner,
    TrialStatus,
)
from tests.conftest import live_placement_groups, live_trial_actors

FAKE = "tests.trainables:FakeTrainable"
COUNTING = "tests.trainables:counting"

gpu_cluster = pytest.mark.parametrize(
    "ray_cluster", [{"num_cpus": 4, "num_gpus": 2}], indirect=True
)
one_gpu = pytest.mark.parametrize("ray_cluster", [{"num_cpus": 1, "num_gpus": 1}], indirect=True)


def fake(**kwargs):
    return Trial(FAKE, kwargs.pop("config", {}), experiment_name="exp", **kwargs)


def runner_for(storage, **kwargs):
    # One step, one event: a step that expects a result waits for it however loaded the machine
    # (an actor can take over 10 s to start under `stress --cpu 2`); it returns at the result.
    kwargs.setdefault("wait_timeout_s", 120.0)
    if "executor" not in kwargs:
        kwargs["storage_path"] = storage
    return TrialRunner("exp", **kwargs)


def step_until(runner, predicate, limit=50):
    for _ in range(limit):
        if predicate():
            return
        runner.step()
    raise AssertionError("condition not reached")


class StatusSnapshot(Callback):
    def __init__(self):
        self.max_running = 0

    def on_step_end(self, trials):
        self.max_running = max(
            self.max_running, sum(t.status == TrialStatus.RUNNING for t in trials)
        )


@gpu_cluster
def test_stop_running_and_pending_trials_then_next_starts(ray_cluster, storage):
    runner = runner_for(storage)
    trials = [
        fake(stopping_criterion={"training_iteration": 5}, resources={"cpu": 1, "gpu": 1})
        for _ in range(4)
    ]
    for t in trials:
        runner.add_trial(t)
    runner.step()
    assert [t.status for t in trials[:2]] == [TrialStatus.RUNNING, TrialStatus.PENDING]

    runner.stop_trial(trials[0])
    assert trials[0].status == TrialStatus.TERMINATED and trials[1].status == TrialStatus.PENDING
    runner.step()
    assert trials[1].status == TrialStatus.RUNNING and trials[-1].status == TrialStatus.PENDING

    runner.stop_trial(trials[-1])
    assert trials[-1].status == TrialStatus.TERMINATED
    runner.step()
    assert [t.status for t in trials] == [
        TrialStatus.TERMINATED,
        TrialStatus.RUNNING,
        TrialStatus.RUNNING,
        TrialStatus.TERMINATED,
    ]
    runner.run()
    assert live_trial_actors() == [] and live_placement_groups() == []


@pytest.mark.parametrize("ray_cluster", [{"num_cpus": 4, "num_gpus": 1}], indirect=True)
def test_fractional_gpus_two_run_two_pend(ray_cluster, storage):
    runner = runner_for(storage, wait_timeout_s=0.1)
    trials = [fake(resources={"cpu": 1, "gpu": 0.5}, config={"sleep": 0.05}) for _ in range(4)]
    for t in trials:
        runner.add_trial(t)
    for _ in range(10):
        runner.step()
    assert [t.status for t in trials] == [TrialStatus.RUNNING] * 2 + [TrialStatus.PENDING] * 2
    assert runner.trial_executor.committed_resources() == Resources(cpu=2, gpu=1)
    runner.cleanup()


@pytest.mark.parametrize("ray_cluster", [{"num_cpus": 4, "num_gpus": 1}], indirect=True)
def test_one_gpu_runs_one_trial_at_a_time(ray_cluster, storage):
    snapshot = StatusSnapshot()
    runner = runner_for(storage, callbacks=[snapshot])
    for _ in range(2):
        runner.add_trial(
            fake(stopping_criterion={"training_iteration": 1}, resources={"cpu": 1, "gpu": 1})
        )
    runner.run()
    assert snapshot.max_running == 1
    assert all(t.status == TrialStatus.TERMINATED for t in runner.get_trials())


def test_custom_resources(storage):
    from tests.conftest import start_ray

    start_ray(num_cpus=4, num_gpus=2, resources={"a": 2})
    runner = runner_for(storage)
    trials = [
        fake(
            stopping_criterion={"training_iteration": 1},
            resources={"cpu": 1, "custom_resources": {"a": 2}},
        )
        for _ in range(2)
    ]
    for t in trials:
        runner.add_trial(t)
    runner.step()
    assert [t.status for t in trials] == [TrialStatus.RUNNING, TrialStatus.PENDING]
    runner.step()
    assert [t.status for t in trials] == [TrialStatus.TERMINATED, TrialStatus.PENDING]
    runner.run()
    assert trials[1].status == TrialStatus.TERMINATED


@one_gpu
def test_checkpoint_at_end(ray_cluster, storage):
    runner = runner_for(storage)
    trial = fake(
        stopping_criterion={"training_iteration": 2},
        checkpoint_at_end=True,
        resources={"cpu": 1, "gpu": 1},
    )
    runner.add_trial(trial)
    runner.step()  # start
    assert trial.status == TrialStatus.RUNNING
    runner.step()  # result 1
    assert not trial.has_checkpoint()
    runner.step()  # result 2: done, checkpoint at end
    assert trial.last_result["training_iteration"] == 2
    assert trial.status == TrialStatus.TERMINATED
    assert trial.has_checkpoint() and trial.checkpoint.iteration == 2
    assert os.path.isdir(trial.checkpoint.path)
    with pytest.raises(RunnerFinishedError, match="has finished"):
        runner.step()


@one_gpu
def test_pause_then_resume_keeps_the_trainables_state(ray_cluster, storage):
    runner = runner_for(storage)
    trial = fake(stopping_criterion={"training_iteration": 4}, resources={"cpu": 1, "gpu": 1})
    runner.add_trial(trial)
    runner.step()  # start
    runner.step()  # result 1
    executor = runner.trial_executor
    actor = executor.get_actor(trial)
    import ray

    assert ray.get(actor.execute.remote(lambda t: t.get_info())) is None
    assert ray.get(actor.execute.remote(lambda t: t.set_info(1))) == 1
    runner.pause_trial(trial)  # records the in-flight result 2, checkpoints, frees the GPU
    assert trial.status == TrialStatus.PAUSED
    assert executor.committed_resources() == Resources(cpu=0)  # its GPU is free again
    assert trial.checkpoint.iteration == 2

    runner.step()  # FIFO resumes the paused trial
    assert trial.status == TrialStatus.RUNNING
    assert ray.get(executor.get_actor(trial).execute.remote(lambda t: t.get_info())) == 1
    runner.run()
    assert trial.status == TrialStatus.TERMINATED
    assert [r["training_iteration"] for _, r in runner.results(trial.trial_id)] == [1, 2, 3, 4]


@one_gpu
def test_restore_metrics_after_checkpointing(ray_cluster, storage):
    runner = runner_for(storage)
    first = fake(
        stopping_criterion={"training_iteration": 2},
        checkpoint_freq=1,
        resources={"cpu": 1, "gpu": 1},
    )
    runner.add_trial(first)
    runner.run()
    assert first.status == TrialStatus.TERMINATED and first.checkpoint.iteration == 1

    runner2 = TrialRunner(
        "exp2", storage_path=storage, wait_timeout_s=120
    )  # each step awaits its result
    second = Trial(
        FAKE,
        experiment_name="exp2",
        restore_path=first.checkpoint.path,
        stopping_criterion={"training_iteration": 3},
        resources={"cpu": 1, "gpu": 1},
    )
    runner2.add_trial(second)
    runner2.step()  # start, restore
    runner2.step()
    assert second.last_result["timesteps_since_restore"] == 10
    assert second.last_result["iterations_since_restore"] == 1
    assert second.last_result["time_since_restore"] > 0
    assert second.last_result["training_iteration"] == 2
    runner2.step()
    assert second.last_result["timesteps_since_restore"] == 20
    assert second.last_result["iterations_since_restore"] == 2
    assert second.last_result["timesteps_total"] == 30
    runner2.cleanup()


def _erroring(**extra):
    return fake(
        resources={"cpu": 1, "gpu": 1},
        checkpoint_freq=1,
        max_failures=0,
        config={"mock_error": True, "persistent_error": True},
        **extra,
    )


@one_gpu
def test_fail_fast_terminates_the_rest(ray_cluster, storage):
    runner = runner_for(storage, fail_fast=True)
    trials = [_erroring(), _erroring()]
    for t in trials:
        runner.add_trial(t)
    runner.run()
    assert trials[0].status == TrialStatus.ERROR
    assert trials[1].status == TrialStatus.TERMINATED
    with pytest.raises(RunnerFinishedError):
        runner.step()


@one_gpu
def test_fail_fast_raise(ray_cluster, storage):
    runner = runner_for(storage, fail_fast="raise")
    trials = [_erroring(), _erroring()]
    for t in trials:
        runner.add_trial(t)
    with pytest.raises(TrialError, match="mock error at iteration 2"):
        runner.run()
    assert trials[0].status == TrialStatus.ERROR
    assert trials[1].status == TrialStatus.PENDING
    assert live_trial_actors() == []  # run() cleaned up although it raised


@one_gpu
def test_failure_recovery_disabled(ray_cluster, storage):
    errored = []

    class Errors(FIFOScheduler):
        def on_trial_error(self, trial):
            errored.append(trial.trial_id)

    runner = runner_for(storage, scheduler=Errors())
    trial = fake(
        resources={"cpu": 1, "gpu": 1},
        checkpoint_freq=1,
        max_failures=0,
        config={"mock_error": True},
    )
    runner.add_trial(trial)
    runner.run()
    assert trial.status == TrialStatus.ERROR
    assert trial.num_failures == 1
    assert errored == [trial.trial_id]
    assert "mock error at iteration 2" in trial.error_msg and "Traceback" in trial.error_msg


@one_gpu
def test_failure_recovery_resumes_from_the_latest_checkpoint(ray_cluster, storage, tmp_path):
    recovered = []

    class Recoveries(Callback):
        def on_trial_recover(self, trial):
            recovered.append(trial.num_failures)

    runner = runner_for(storage, callbacks=[Recoveries()])
    trial = Trial(
        COUNTING,
        {"crash_at": 3, "marker": str(tmp_path / "crashed")},
        experiment_name="exp",
        stopping_criterion={"training_iteration": 5},
        max_failures=1,
        resources={"cpu": 1},
    )
    runner.add_trial(trial)
    runner.run()
    assert trial.status == TrialStatus.TERMINATED
    assert trial.num_failures == 1 and recovered == [1]
    history = [(r["training_iteration"], r["score"]) for _, r in runner.results(trial.trial_id)]
    assert history == [(1, 1.0), (2, 2.0), (3, 3.0), (4, 4.0), (5, 5.0)]
    # The retry started from checkpoint 2, so its first result says one iteration since restore.
    third = [r for _, r in runner.results(trial.trial_id) if r["training_iteration"] == 3][0]
    assert third["iterations_since_restore"] == 1


@one_gpu
def test_unknown_trainable_errors_and_the_next_trial_runs(ray_cluster, storage):
    runner = runner_for(storage)
    trials = [
        Trial(
            "tests.trainables:does_not_exist", experiment_name="exp", resources={"cpu": 1, "gpu": 1}
        ),
        fake(stopping_criterion={"training_iteration": 1}, resources={"cpu": 1, "gpu": 1}),
    ]
    for t in trials:
        runner.add_trial(t)
    runner.step()
    assert [t.status for t in trials] == [TrialStatus.ERROR, TrialStatus.PENDING]
    assert "has no attribute 'does_not_exist'" in trials[0].error_msg
    runner.step()
    assert [t.status for t in trials] == [TrialStatus.ERROR, TrialStatus.RUNNING]
    runner.run()


@pytest.mark.parametrize("ray_cluster", [{"num_cpus": 1, "num_gpus": 0}], indirect=True)
def test_overstepping_a_finished_runner_raises(ray_cluster, storage):
    runner = runner_for(storage)
    trial = fake(stopping_criterion={"training_iteration": 2}, resources={"cpu": 1})
    runner.add_trial(trial)
    runner.step()
    assert trial.status == TrialStatus.RUNNING
    runner.step()
    assert trial.status == TrialStatus.RUNNING
    runner.step()
    assert trial.status == TrialStatus.TERMINATED
    with pytest.raises(RunnerFinishedError):
        runner.step()


@pytest.mark.parametrize("ray_cluster", [{"num_cpus": 2, "num_gpus": 0}], indirect=True)
def test_change_resources_between_runs(ray_cluster, storage):
    class ChangingScheduler(FIFOScheduler):
        def __init__(self):
            self.runner = None

        def on_trial_result(self, trial, result):
            if result["training_iteration"] == 1:
                executor = self.runner.trial_executor
                executor.pause_trial(trial)
                trial.update_resources({"cpu": 2})
                executor.start_trial(trial, train=False)
                return Decision.CONTINUE
            return Decision.CONTINUE

    scheduler = ChangingScheduler()
    runner = runner_for(storage, scheduler=scheduler)
    scheduler.runner = runner
    trial = fake(stopping_criterion={"training_iteration": 2}, resources={"cpu": 1})
    runner.add_trial(trial)
    runner.step()
    assert runner.trial_executor.committed_resources() == Resources(cpu=1)
    with pytest.raises(ValueError, match="while it is RUNNING"):
        trial.update_resources({"cpu": 2})
    runner.step()  # result 1: the scheduler moves the trial to 2 CPUs
    assert trial.status == TrialStatus.RUNNING
    assert runner.trial_executor.committed_resources() == Resources(cpu=2)
    runner.run()
    assert trial.status == TrialStatus.TERMINATED
    assert trial.last_result["training_iteration"] == 2


@pytest.mark.parametrize("ray_cluster", [{"num_cpus": 2, "num_gpus": 0}], indirect=True)
def test_a_trial_that_can_never_fit_fails_fast_naming_both_sides(ray_cluster, storage):
    runner = runner_for(storage)
    trial = fake(trial_id="t-3", resources={"cpu": 1, "gpu": 2})
    with pytest.raises(InsufficientResourcesError) as info:
        runner.add_trial(trial)
    message = str(info.value)
    assert (
        "Trial t-3 of experiment exp needs 1 CPU, 2 GPU but the Ray cluster has 2 CPU, 0 GPU"
        in message
    )
    assert "queue_trials=True" in message
    assert runner.get_trials() == []
    assert live_placement_groups() == []


@pytest.mark.parametrize("ray_cluster", [{"num_cpus": 2, "num_gpus": 0}], indirect=True)
def test_queue_trials_lets_one_oversized_trial_wait(ray_cluster, storage):
    executor = RayTrialExecutor(storage, queue_trials=True)
    runner = runner_for(storage, executor=executor, wait_timeout_s=0.2)
    big = fake(resources={"cpu": 4})
    runner.add_trial(big)  # accepted: an autoscaler could add a node
    runner.add_trial(fake(resources={"cpu": 4}))
    runner.step()
    assert big.status == TrialStatus.RUNNING  # waits in Ray's queue for resources
    assert not executor.has_resources(Resources(cpu=4))  # only one trial is queued at a time
    runner.cleanup()


@pytest.mark.parametrize("ray_cluster", [{"num_cpus": 2, "num_gpus": 0}], indirect=True)
def test_stopping_criteria_dict_callable_and_missing_metric(ray_cluster, storage):
    runner = runner_for(storage)
    by_dict = Trial(
        COUNTING, {"scale": 1.0}, experiment_name="exp", stopping_criterion={"score": 3}
    )
    by_fn = Trial(
        COUNTING,
        {"scale": 2.0},
        experiment_name="exp",
        stopping_criterion=lambda trial_id, result: result["score"] >= 8,
    )
    missing = Trial(COUNTING, {}, experiment_name="exp", stopping_criterion={"accuracy": 1})
    for t in (by_dict, by_fn, missing):
        runner.add_trial(t)
    runner.run()
    assert by_dict.last_result["score"] == 3.0 and by_dict.status == TrialStatus.TERMINATED
    assert by_fn.last_result["score"] == 8.0 and by_fn.status == TrialStatus.TERMINATED
    assert missing.status == TrialStatus.ERROR
    assert (
        "has stopping criterion 'accuracy' but its result has no such metric" in missing.error_msg
    )


@pytest.mark.parametrize("ray_cluster", [{"num_cpus": 2, "num_gpus": 0}], indirect=True)
def test_global_time_budget_ends_the_experiment(ray_cluster, storage):
    runner = runner_for(storage, time_budget_s=1.0, wait_timeout_s=0.2)
    trials = [Trial(COUNTING, {"sleep": 0.05}, experiment_name="exp") for _ in range(3)]
    for t in trials:
        runner.add_trial(t)
    runner.run()
    assert runner.is_finished()
    assert all(t.status == TrialStatus.TERMINATED for t in trials)
    # COUNTING never ends by itself: the budget stopped every trial, however far a loaded machine
    # let each get (one may not have reported at all before the budget ran out).
    assert all(t.last_result.get("training_iteration", 0) < 9_999 for t in trials)
    assert live_trial_actors() == []


@pytest.mark.parametrize("ray_cluster", [{"num_cpus": 2, "num_gpus": 0}], indirect=True)
def test_incremental_results_sorted_by_time(ray_cluster, storage):
    runner = runner_for(storage)
    trials = [
        Trial(
            COUNTING,
            {"sleep": 0.01},
            experiment_name="exp",
            stopping_criterion={"training_iteration": 3},
        )
        for _ in range(2)
    ]
    for t in trials:
        runner.add_trial(t)
    seen = []
    while not runner.is_finished():
        runner.step()
        statuses, new = runner.fetch_status_results()
        assert set(statuses) == {t.trial_id for t in trials}
        stamps = [r["timestamp"] for _, r in new]
        assert stamps == sorted(stamps)
        seen.extend(new)
    assert len(seen) == 6
    assert runner.fetch_status_results()[1] == []


@pytest.mark.parametrize("ray_cluster", [{"num_cpus": 3, "num_gpus": 0}], indirect=True)
def test_resume_errored_only(ray_cluster, storage):
    runner = runner_for(storage)
    trials = [
        fake(
            config={"mock_error": True, "persistent_error": True},
            stopping_criterion={"training_iteration": 4},
            trial_id="bad",
        ),
        fake(stopping_criterion={"training_iteration": 4}, trial_id="good1"),
        fake(stopping_criterion={"training_iteration": 4}, trial_id="good2"),
    ]
    for t in trials:
        runner.add_trial(t)
    runner.run()
    assert [t.status for t in trials] == [
        TrialStatus.ERROR,
        TrialStatus.TERMINATED,
        TrialStatus.TERMINATED,
    ]
    state = json.load(open(os.path.join(storage, "exp", "experiment_state.json")))
    assert [t["status"] for t in state["trials"]] == ["ERROR", "TERMINATED", "TERMINATED"]

    # Without run_errored_only the errored trial stays errored.
    assert TrialRunner("exp", storage_path=storage, resume=True).is_finished()

    resumed = TrialRunner(
        "exp", storage_path=storage, resume=True, run_errored_only=True, wait_timeout_s=10
    )
    assert len(resumed.get_trials()) == 3
    assert TrialStatus.ERROR not in {t.status for t in resumed.get_trials()}
    bad = resumed.get_trial("bad")
    assert bad.status == TrialStatus.PENDING and bad.num_failures == 0
    bad.config["mock_error"] = False  # the fix the user made before re-running
    resumed.run()
    assert [t.status for t in resumed.get_trials()] == [TrialStatus.TERMINATED] * 3
    assert resumed.get_trial("good1").last_result["training_iteration"] == 4
    # Iteration 1 of the re-run repeats one the first run recorded, so it is not recorded twice.
    assert [r["training_iteration"] for _, r in resumed.results()] == [2, 3, 4]


def _long_trial_at_3(storage, stop):
    """A runner whose trial "long" (counting, stopped at ``stop``) recorded iteration 3."""
    runner = runner_for(storage)
    trial = Trial(
        COUNTING,
        {},
        experiment_name="exp",
        trial_id="long",
        stopping_criterion={"training_iteration": stop},
    )
    runner.add_trial(trial)
    step_until(runner, lambda: trial.last_result.get("training_iteration") == 3)
    return runner, trial


@pytest.mark.parametrize("ray_cluster", [{"num_cpus": 2, "num_gpus": 0}], indirect=True)
def test_interrupted_experiment_resumes_running_trials_from_checkpoints(ray_cluster, storage):
    runner, _ = _long_trial_at_3(storage, stop=6)
    runner.cleanup()  # what run() does on Ctrl-C: state saved, actors killed
    assert live_trial_actors() == []

    resumed = TrialRunner("exp", storage_path=storage, resume=True, wait_timeout_s=10)
    again = resumed.get_trial("long")
    # 3, or 4 when its actor trained 4 ahead before it was killed (its checkpoint is on the
    # storage: the resume takes it, with its result).
    assert again.status == TrialStatus.PENDING and again.checkpoint.iteration in (3, 4)
    resumed.run()
    assert again.status == TrialStatus.TERMINATED
    assert [r["training_iteration"] for _, r in resumed.results()] == [4, 5, 6]


@pytest.mark.parametrize("ray_cluster", [{"num_cpus": 2, "num_gpus": 0}], indirect=True)
def test_a_resume_takes_the_checkpoints_saved_after_the_experiment_state(ray_cluster, storage):
    """The runner's process dies (no state saved) after its trial trained past the saved state:
    the resume takes the newer checkpoints from the storage, with the results their metadata
    carries, and restores from the newest; nothing is trained twice and no result is missing."""
    runner, trial = _long_trial_at_3(storage, stop=8)
    runner.checkpoint()  # the state names iteration 3
    step_until(runner, lambda: trial.last_result.get("training_iteration") == 6)
    runner.trial_executor.cleanup()  # the process dies: actors gone, no state saved since
    assert live_trial_actors() == []

    resumed = TrialRunner("exp", storage_path=storage, resume=True, wait_timeout_s=10)
    again = resumed.get_trial("long")
    adopted = again.checkpoint.iteration  # 6, or 7 when its actor had trained 7 ahead
    assert again.status == TrialStatus.PENDING and adopted in (6, 7)
    assert again.last_result["training_iteration"] == adopted
    resumed.run()
    assert again.status == TrialStatus.TERMINATED
    results = [r for _, r in resumed.results()]
    # Up to the adopted checkpoint from the storage, handed to the callbacks as the trial
    # started again; then trained from there.
    assert [r["training_iteration"] for r in results] == [4, 5, 6, 7, 8]
    assert results[adopted - 3]["iterations_since_restore"] == 1  # the first after the restore


def test_resume_without_state_is_a_clear_error(storage):
    from airflow_trials import ExperimentStateError

    with pytest.raises(
        ExperimentStateError, match="Cannot resume experiment never-ran: no saved state"
    ):
        TrialRunner("never-ran", storage_path=storage, resume=True)


def test_executor_options_with_an_executor_are_refused(storage):
    with pytest.raises(ValueError, match="pass them to RayTrialExecutor"):
        TrialRunner("exp", executor=RayTrialExecutor(storage), reuse_actors=True)


@pytest.mark.parametrize("ray_cluster", [{"num_cpus": 2, "num_gpus": 0}], indirect=True)
def test_with_parameters_hands_each_trial_the_array_by_reference(ray_cluster, storage):
    import numpy as np

    from airflow_trials import with_parameters

    data = np.arange(200_000, dtype=np.float64)  # 1.6 MB: kept in Ray's shared object store
    trainable = with_parameters("tests.trainables:with_array", data=data)
    runner = runner_for(storage)
    trials = [
        Trial(trainable, {"scale": s}, experiment_name="exp", resources={"cpu": 1})
        for s in (1.0, 3.0)
    ]
    for t in trials:
        runner.add_trial(t)
    runner.run()
    assert [t.status for t in trials] == [TrialStatus.TERMINATED] * 2
    for t, scale in zip(trials, (1.0, 3.0), strict=True):
        result = t.last_result
        assert result["total"] == float(data.sum()) and result["length"] == 200_000
        assert result["dtype"] == "float64" and result["scale"] == scale
        # A read-only array is the object store's zero-copy view, not a copy made for the trial.
        assert result["read_only"] is True
        assert t.config == {"scale": scale}
    # Both trials used the one put made for the first: the bundle puts nothing more.
    assert list(trainable.references(lambda value: pytest.fail("put a second time"))) == ["data"]
    # The experiment's saved state names the constant but does not hold it.
    state_path = runner.checkpoint()
    assert os.path.getsize(state_path) < 50_000
    with open(state_path) as f:
        assert [s["trainable_parameters"] for s in json.load(f)["trials"]] == [["data"], ["data"]]
    assert live_trial_actors() == []


@pytest.mark.parametrize("ray_cluster", [{"num_cpus": 2, "num_gpus": 0}], indirect=True)
def test_reused_actors_of_one_shape_give_way_to_waiting_trials_of_another(ray_cluster, storage):
    """With actor reuse, a finished trial's cached actor is kept only while a waiting trial (of any
    position in the queue) has its shape; otherwise it is dropped, so the other shape's trials
    fit."""
    runner = runner_for(storage, reuse_actors=True, stop={"training_iteration": 2})
    shapes = [2, 2, 1, 1, 1, 2]
    trials = [
        Trial(
            "tests.trainables:counting",
            {"scale": float(i)},
            experiment_name="exp",
            trial_id=f"s{i}",
            resources={"cpu": cpu},
        )
        for i, cpu in enumerate(shapes)
    ]
    for trial in trials:
        runner.add_trial(trial)
    runner.run()
    assert [t.status for t in trials] == [TrialStatus.TERMINATED] * len(shapes)
    assert [t.last_result["training_iteration"] for t in trials] == [2] * len(shapes)
    assert live_trial_actors() == []


class Held(Callback):
    """How many trials the runner held at each step's end, and the order trials started in."""

    def __init__(self):
        self.most_held, self.started, self.completed = 0, [], []

    def on_trial_start(self, trial):
        self.started.append(trial.trial_id)

    def on_trial_complete(self, trial):
        self.completed.append(trial.trial_id)

    def on_step_end(self, trials):
        self.most_held = max(self.most_held, len(trials))


def test_fed_trials_start_in_order_and_ended_ones_are_forgotten(ray_cluster, storage):
    """A sweep's driver feeds its trials and forgets the ended ones: FIFO starts them in the
    order given, every one ends TERMINATED, and the runner holds no more than the one running
    (max_concurrent_trials=1), the next one waiting and the one that just ended."""
    held = Held()
    runner = runner_for(
        storage,
        callbacks=[held],
        forget_ended=True,
        reuse_actors=True,
        keep_results=False,
        max_concurrent_trials=1,
    )
    made = []

    def trials():
        for i in range(12):
            trial = Trial(
                FAKE,
                {"sleep": 0.0},
                trial_id=f"fed-{i:02d}",
                experiment_name="exp",
                stopping_criterion={"training_iteration": 2},
                resources={"cpu": 1},
            )
            made.append(trial)  # made only as the runner takes it
            yield trial

    runner.feed(trials())
    assert len(made) == 1  # the first, looked ahead
    runner.run()

    assert held.started == [f"fed-{i:02d}" for i in range(12)]
    assert sorted(held.completed) == held.started
    assert all(t.status == TrialStatus.TERMINATED for t in made)
    assert runner.get_trials() == [] and held.most_held <= 3
    with pytest.raises(ValueError, match="already fed trials"):
        runner.feed([])


def test_stopping_a_fed_runner_ends_the_trials_not_yet_taken(ray_cluster, storage):
    """``request_stop`` ends every trial, those still in the feed included, TERMINATED, as it
    ends trials added at once."""
    held = Held()
    runner = runner_for(storage, callbacks=[held], forget_ended=True)
    fed = [
        Trial(COUNTING, {}, trial_id=f"stop-{i}", experiment_name="exp", resources={"cpu": 1})
        for i in range(6)
    ]
    runner.feed(iter(fed))
    step_until(runner, lambda: len(held.started) == 2)
    runner.request_stop()
    runner.run()
    assert [t.status for t in fed] == [TrialStatus.TERMINATED] * 6
    assert sorted(held.completed) == [f"stop-{i}" for i in range(6)]
    assert runner.is_finished() and runner.get_trials() == []
