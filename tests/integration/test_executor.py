"""RayTrialExecutor on a real local Ray: actors, placement groups, reuse, logs, checkpoints,
lookup."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import ray

from airflow_trials import (
    CheckpointError,
    RayTrialExecutor,
    Resources,
    Trial,
    TrialError,
    TrialRunner,
    TrialStatus,
    find_trial_actor,
)
from airflow_trials.execution.driver.actor_client import TrialActorClient
from tests.conftest import REPO, LoopTicker, live_placement_groups, live_trial_actors

COUNTING = "tests.trainables:counting"
FAKE = "tests.trainables:FakeTrainable"


def trial(trainable=COUNTING, **kwargs):
    kwargs.setdefault("experiment_name", "exp")
    return Trial(trainable, kwargs.pop("config", {}), **kwargs)


def next_result(executor, t):
    assert executor.get_next_available_trial(timeout_s=30) is t
    return executor.fetch_result(t)


def test_start_save_stop_persists_metadata_and_frees_everything(ray_cluster, storage):
    executor = RayTrialExecutor(storage)
    t = trial(FAKE, trial_id="t1", resources={"cpu": 1, "gpu": 0.5})
    assert executor.start_trial(t)
    assert t.status == TrialStatus.RUNNING
    assert executor.committed_resources() == Resources(cpu=1, gpu=0.5)
    assert next_result(executor, t)["training_iteration"] == 1
    record = executor.save(t)
    assert record.iteration == 1 and t.checkpoint == record
    executor.stop_trial(t)
    assert t.status == TrialStatus.TERMINATED
    meta = json.load(open(os.path.join(storage, "exp", "t1", "trial.json")))
    assert meta["status"] == "TERMINATED" and meta["checkpoints"]["kept"][0]["iteration"] == 1
    assert executor.get_checkpoints()["t1"]["status"] == "TERMINATED"
    assert executor.committed_resources() == Resources(cpu=0)
    executor.cleanup()
    assert live_trial_actors() == [] and live_placement_groups() == []


def test_detached_named_actor_is_found_from_another_process(ray_cluster, storage):
    executor = RayTrialExecutor(storage, namespace="lookup-test")
    t = trial(config={"sleep": 0.2}, trial_id="findme")
    executor.start_trial(t)
    next_result(executor, t)
    assert find_trial_actor("exp", "findme", namespace="lookup-test") is not None
    # The address, not 'auto': another Ray on this machine must not be picked up instead.
    code = (
        f"import ray, sys; ray.init(address={ray.get_runtime_context().gcs_address!r}, "
        "namespace='lookup-test', log_to_driver=False);"
        "from airflow_trials import find_trial_actor;"
        "a = find_trial_actor('exp', 'findme', namespace='lookup-test');"
        "print(ray.get(a.ping.remote()))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120
    )
    assert out.stdout.strip().splitlines()[-1:] == ["findme"], out.stderr
    executor.cleanup()
    assert find_trial_actor("exp", "findme", namespace="lookup-test") is None


def test_reuse_actors_goes_through_reset_config(ray_cluster, storage):
    executor = RayTrialExecutor(storage, reuse_actors=True)
    first, second = trial(FAKE, trial_id="a"), trial(FAKE, trial_id="b", config={"x": 1})
    executor.start_trial(first)
    pid = next_result(executor, first)["pid"]
    executor.stop_trial(first)
    executor.start_trial(second)
    result = next_result(executor, second)
    assert result["pid"] == pid and result["trial_id"] == "b" and result["training_iteration"] == 1
    resets = ray.get(
        executor.get_actor(second).execute.remote(lambda t: (t.resets, t.config, t.trial_id))
    )
    assert resets == (1, {"x": 1}, "b")
    # The actor now hosts "b": no Ray name says it is "a"'s (a name is fixed at creation).
    assert find_trial_actor("exp", "a") is None
    [name] = live_trial_actors()
    assert name.startswith("trial.exp.slot-"), name
    executor.stop_trial(second)
    executor.cleanup()
    assert live_trial_actors() == []


def test_without_reuse_each_trial_gets_a_fresh_process(ray_cluster, storage):
    executor = RayTrialExecutor(storage, reuse_placement_groups=True)
    first, second = trial(trial_id="a"), trial(trial_id="b")
    executor.start_trial(first)
    pid = next_result(executor, first)["pid"]
    executor.stop_trial(first)
    executor.start_trial(second)
    assert next_result(executor, second)["pid"] != pid
    executor.cleanup()


def test_stdout_and_stderr_are_captured_per_trial(ray_cluster, storage):
    executor = RayTrialExecutor(storage, reuse_actors=True)
    for trial_id in ("talk1", "talk2"):
        t = trial("tests.trainables:chatty", trial_id=trial_id)
        executor.start_trial(t)
        next_result(executor, t)
        executor.stop_trial(t)
    executor.cleanup()
    actors = executor.actors
    assert actors.stdout("talk1") == ["hello from trial talk1"]
    assert actors.stdout("talk2") == ["hello from trial talk2"]  # reused actor, its own file
    assert actors.stderr("talk2") == ["a warning on stderr"]
    fresh = TrialActorClient(storage)
    assert fresh.stdout("talk1", experiment_name="exp") == ["hello from trial talk1"]
    with pytest.raises(KeyError, match="pass experiment_name"):
        fresh.stdout("talk1")


def test_a_trainable_exception_arrives_as_trial_error_with_traceback(ray_cluster, storage):
    executor = RayTrialExecutor(storage)
    t = trial("tests.trainables:failing", trial_id="boom")
    executor.start_trial(t)
    next_result(executor, t)
    executor.continue_training(t)
    assert executor.get_next_available_trial(30) is t
    with pytest.raises(TrialError) as info:
        executor.fetch_result(t)
    assert info.value.trial_id == "boom"
    assert "Traceback (most recent call last)" in info.value.traceback_text
    assert "broken trainable: key 'missing'" in str(info.value)
    executor.stop_trial(t, error=True, error_msg=str(info.value))
    assert t.status == TrialStatus.ERROR
    assert (
        "broken trainable"
        in json.load(open(os.path.join(storage, "exp", "boom", "trial.json")))["error_msg"]
    )
    executor.cleanup()


async def test_async_fetch_result_awaits_the_object_ref(ray_cluster, storage):
    executor = RayTrialExecutor(storage)
    t = trial(config={"sleep": 0.3})
    executor.start_trial(t)
    async with LoopTicker() as ticker:
        result = await executor.async_fetch_result(t)
    assert result["training_iteration"] == 1
    assert ticker.ticks >= 10  # the event loop kept running while the result was awaited
    executor.cleanup()


def test_has_resources_counts_running_trials_and_refreshes_the_cluster(ray_cluster, storage):
    executor = RayTrialExecutor(storage, refresh_period_s=0.0)
    assert (
        executor.actors.cluster_resources().cpu == 2
        and executor.actors.cluster_resources().gpu == 2
    )
    assert executor.has_resources(Resources(cpu=2, gpu=2))
    t = trial(resources={"cpu": 1.5, "gpu": 1})
    executor.start_trial(t)
    assert executor.has_resources(Resources(cpu=0.5, gpu=1))
    assert not executor.has_resources(Resources(cpu=1, gpu=0))
    assert "1.5 CPU, 1 GPU used of 2 CPU, 2 GPU" in executor.actors.resource_string()
    executor.cleanup()


def test_copy_checkpoint_warm_starts_another_trial(ray_cluster, storage):
    executor = RayTrialExecutor(storage)
    src, tgt = trial(trial_id="src"), trial(trial_id="tgt")
    with pytest.raises(CheckpointError, match="Trial src has no checkpoint to copy to trial tgt"):
        executor.copy_checkpoint(src, tgt)
    executor.start_trial(src)
    result = next_result(executor, src)
    executor.register_checkpoint(src, _record(result))
    executor.stop_trial(src)
    copied = executor.copy_checkpoint(src, tgt)
    assert copied.path.startswith(os.path.join(storage, "exp", "tgt"))
    executor.start_trial(tgt)
    assert next_result(executor, tgt)["score"] == 2.0  # continued from src's iteration 1
    executor.cleanup()


def test_delete_checkpoints_on_stop(ray_cluster, storage):
    executor = RayTrialExecutor(storage, delete_checkpoints=True)
    t = trial(trial_id="gone")
    executor.start_trial(t)
    result = next_result(executor, t)
    executor.register_checkpoint(t, _record(result))
    path = t.checkpoint.path
    assert os.path.isdir(path)
    executor.stop_trial(t)
    assert not os.path.exists(path) and not t.has_checkpoint()
    executor.cleanup()


def test_keep_checkpoints_num_deletes_the_pushed_out_ones(ray_cluster, storage):
    runner = TrialRunner("exp", storage_path=storage, wait_timeout_s=10)
    t = trial(
        trial_id="keep",
        stopping_criterion={"training_iteration": 5},
        keep_checkpoints_num=2,
        checkpoint_score_attr="score",
    )
    runner.add_trial(t)
    runner.run()
    kept = sorted(
        p for p in os.listdir(os.path.join(storage, "exp", "keep")) if p.startswith("checkpoint_")
    )
    assert kept == ["checkpoint_000004", "checkpoint_000005"]
    assert [r.iteration for r in t.checkpoint_manager.kept] == [4, 5]


def test_restore_failure_is_a_trial_error_not_a_silent_fresh_start(ray_cluster, storage, tmp_path):
    empty = tmp_path / "not-a-checkpoint"
    empty.mkdir()
    executor = RayTrialExecutor(storage)
    t = trial(FAKE, trial_id="badrestore", restore_path=str(empty))
    executor.start_trial(t)
    assert executor.get_next_available_trial(30) is t
    with pytest.raises(TrialError, match="restoring from its checkpoint"):
        executor.fetch_result(t)
    executor.cleanup()


def _record(result):
    from airflow_trials import CheckpointRecord

    return CheckpointRecord(result["checkpoint"], result["training_iteration"], result)
