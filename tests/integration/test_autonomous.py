"""Autonomous trials: the actor drives itself and any process polls it (the Airflow path)."""

from __future__ import annotations

import time

import pytest
import ray

from airflow_trials import (
    InsufficientResourcesError,
    RayTrialExecutor,
    TrainableNotFoundError,
    Trial,
)
from tests.conftest import live_placement_groups, live_trial_actors


def wait_done(actor, timeout_s=60):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        snap = ray.get(actor.poll.remote(0))
        if snap["status"] in ("TERMINATED", "ERROR"):
            return snap
        time.sleep(0.05)
    raise AssertionError("trial did not finish")


def test_launch_runs_to_the_stopping_criterion_with_checkpoints(ray_cluster, storage):
    executor = RayTrialExecutor(storage)
    trial = Trial("tests.trainables:FakeTrainable", experiment_name="auto", trial_id="a1",
                  stopping_criterion={"training_iteration": 4}, checkpoint_freq=2, keep_checkpoints_num=1)
    actor = executor.launch(trial)
    snap = wait_done(actor)
    assert snap["status"] == "TERMINATED" and snap["error"] is None
    assert [r["training_iteration"] for r in snap["results"]] == [1, 2, 3, 4]
    assert [c["iteration"] for c in snap["checkpoints"]] == [2]  # no checkpoint_at_end
    assert ray.get(actor.poll.remote(3))["results"][0]["training_iteration"] == 4
    executor.terminate("auto", "a1")
    assert live_trial_actors() == [] and live_placement_groups() == []


def test_launch_restores_and_reports_errors_with_tracebacks(ray_cluster, storage, tmp_path):
    executor = RayTrialExecutor(storage)
    config = {"crash_at": 3, "marker": str(tmp_path / "m")}
    trial = Trial("tests.trainables:counting", config, experiment_name="auto", trial_id="a2",
                  stopping_criterion={"training_iteration": 5})
    snap = wait_done(executor.launch(trial))
    assert snap["status"] == "ERROR"
    assert "crash at iteration 3" in snap["error"] and "Traceback" in snap["error"]
    newest = snap["checkpoints"][-1]
    assert newest["iteration"] == 2
    executor.terminate("auto", "a2")

    again = Trial("tests.trainables:counting", config, experiment_name="auto", trial_id="a2",
                  stopping_criterion={"training_iteration": 5}, restore_path=newest["path"])
    actor = executor.launch(again)
    snap = wait_done(actor)
    assert snap["status"] == "TERMINATED"
    assert [r["training_iteration"] for r in snap["results"]] == [3, 4, 5]
    assert executor.attach("auto", "a2") is not None
    executor.terminate("auto", "a2")
    assert executor.attach("auto", "a2") is None


def test_launch_refuses_bad_input_before_any_ray_work(ray_cluster, storage):
    executor = RayTrialExecutor(storage)
    with pytest.raises(TrainableNotFoundError, match="no_such_mod"):
        executor.launch(Trial("no_such_mod:train", experiment_name="auto"))
    with pytest.raises(InsufficientResourcesError, match="needs 1 CPU, 4 GPU"):
        executor.launch(Trial("tests.trainables:counting", experiment_name="auto", resources={"gpu": 4}))
    assert live_trial_actors() == [] and live_placement_groups() == []
