"""Autonomous trials: the actor drives itself and any process polls it (the Airflow path)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
import ray

from airflow_trials import (
    InsufficientResourcesError,
    TrainableNotFoundError,
    Trial,
)
from airflow_trials.execution.driver.actor_client import TrialActorClient
from tests.conftest import REPO, live_placement_groups, live_trial_actors


def wait_done(actor, timeout_s=60):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        snap = ray.get(actor.poll.remote(0))
        if snap.status in ("TERMINATED", "ERROR"):
            return snap
        time.sleep(0.05)
    raise AssertionError("trial did not finish")


def test_launch_runs_to_the_stopping_criterion_with_checkpoints(ray_cluster, storage):
    executor = TrialActorClient(storage)
    trial = Trial(
        "tests.trainables:FakeTrainable",
        experiment_name="auto",
        trial_id="a1",
        stopping_criterion={"training_iteration": 4},
        checkpoint_freq=2,
        keep_checkpoints_num=1,
    )
    actor = executor.launch(trial)
    snap = wait_done(actor)
    assert snap.status == "TERMINATED" and snap.error is None
    assert [r["training_iteration"] for r in snap.results] == [1, 2, 3, 4]
    assert [c.iteration for c in snap.kept_checkpoints] == [2]  # no checkpoint_at_end
    assert ray.get(actor.poll.remote(3)).results[0]["training_iteration"] == 4
    executor.terminate("auto", "a1")
    assert live_trial_actors() == [] and live_placement_groups() == []


def test_launch_restores_and_reports_errors_with_tracebacks(ray_cluster, storage, tmp_path):
    executor = TrialActorClient(storage)
    config = {"crash_at": 3, "marker": str(tmp_path / "m")}
    trial = Trial(
        "tests.trainables:counting",
        config,
        experiment_name="auto",
        trial_id="a2",
        stopping_criterion={"training_iteration": 5},
    )
    snap = wait_done(executor.launch(trial))
    assert snap.status == "ERROR"
    assert "crash at iteration 3" in snap.error and "Traceback" in snap.error
    newest = snap.kept_checkpoints[-1]
    assert newest.iteration == 2
    executor.terminate("auto", "a2")

    again = Trial(
        "tests.trainables:counting",
        config,
        experiment_name="auto",
        trial_id="a2",
        stopping_criterion={"training_iteration": 5},
        restore_path=newest.path,
    )
    actor = executor.launch(again)
    snap = wait_done(actor)
    assert snap.status == "TERMINATED"
    assert [r["training_iteration"] for r in snap.results] == [3, 4, 5]
    assert executor.attach("auto", "a2") is not None
    executor.terminate("auto", "a2")
    assert executor.attach("auto", "a2") is None


def test_launch_refuses_bad_input_before_any_ray_work(ray_cluster, storage):
    executor = TrialActorClient(storage)
    with pytest.raises(TrainableNotFoundError, match="no_such_mod"):
        executor.launch(Trial("no_such_mod:train", experiment_name="auto"))
    with pytest.raises(InsufficientResourcesError, match="needs 1 CPU, 4 GPU"):
        executor.launch(
            Trial("tests.trainables:counting", experiment_name="auto", resources={"gpu": 4})
        )
    assert live_trial_actors() == [] and live_placement_groups() == []


# Launches a trial that cannot be placed yet, then exits at once, as an Airflow task does when it
# defers: the trial must still start when Ray places it.
LAUNCH_AND_EXIT = """
import sys, ray
from airflow_trials import Trial
from airflow_trials.execution.driver.actor_client import TrialActorClient
ray.init(address=sys.argv[1], namespace=sys.argv[2], log_to_driver=False)
executor = TrialActorClient(sys.argv[3], namespace=sys.argv[2], detached=True)
trial = Trial("tests.trainables:counting", {}, experiment_name="auto", trial_id="queued",
              resources={"cpu": 2}, stopping_criterion={"training_iteration": 3})
actor = executor.launch(trial, start_timeout_s=None)
print("placed" if executor.is_placed(actor) else "queued", flush=True)
"""


def test_a_queued_trial_starts_when_placed_after_its_launcher_exited(ray_cluster, storage):
    namespace = ray.get_runtime_context().namespace
    executor = TrialActorClient(storage, namespace=namespace, detached=True)
    blocker = Trial(
        "tests.trainables:counting",
        {"sleep": 0.1},
        experiment_name="auto",
        trial_id="blocker",
        resources={"cpu": 2},
        stopping_criterion={"training_iteration": 5},
    )
    blocker_actor = executor.launch(blocker)  # holds every CPU of the cluster
    assert executor.is_placed(blocker_actor)
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            LAUNCH_AND_EXIT,
            ray.get_runtime_context().gcs_address,
            namespace,
            storage,
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "queued"
    queued = executor.attach("auto", "queued")
    assert queued is not None and not executor.is_placed(queued)

    assert wait_done(blocker_actor).status == "TERMINATED"
    executor.terminate("auto", "blocker")  # frees the CPUs: Ray places the queued trial now
    snap = wait_done(queued)
    assert snap.status == "TERMINATED"
    assert [r["training_iteration"] for r in snap.results] == [1, 2, 3]
    assert executor.is_placed(queued)
    executor.terminate("auto", "queued")
    assert executor.attach("auto", "queued") is None
    assert live_trial_actors() == [] and live_placement_groups() == []


def test_poll_with_wait_returns_as_soon_as_the_trial_ends(ray_cluster, storage):
    executor = TrialActorClient(storage)
    trial = Trial(
        "tests.trainables:counting",
        {"sleep": 0.2},
        experiment_name="auto",
        trial_id="w1",
        stopping_criterion={"training_iteration": 3},
    )
    actor = executor.launch(trial)
    started = time.monotonic()
    snap = ray.get(actor.poll.remote(0, 60.0))  # waits for the end, not for the 60 s
    assert snap.status == "TERMINATED" and time.monotonic() - started < 30
    assert [r["training_iteration"] for r in snap.results] == [1, 2, 3]
    started = time.monotonic()
    assert ray.get(actor.poll.remote(3, 60.0)).results == []  # already ended: no wait at all
    assert time.monotonic() - started < 30
    executor.terminate("auto", "w1")
