"""A graceful stop's drain (``execution/driver/drain.py``) on real Ray actors: a self-driving
trial checkpoints its last reported iteration, with the results since its previous checkpoint,
and pauses; one that cannot pause in time is reported, not waited for."""

from __future__ import annotations

import time

import ray

from airflow_trials import Trial
from airflow_trials.execution.driver.actor_client import TrialActorClient
from airflow_trials.execution.driver.drain import drain_trials
from airflow_trials.storage.trial_storage import RESULTS_KEY, TrialStorage
from tests.conftest import live_trial_actors
from tests.integration.test_autonomous import wait_done


def _results_after(actor, count, timeout_s=60):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        snap = ray.get(actor.poll.remote(0))
        if snap.num_results >= count:
            return snap
        time.sleep(0.05)
    raise AssertionError(f"the trial did not report {count} results")


def test_a_drained_trial_saves_what_it_reported_and_pauses_until_resumed(ray_cluster, storage):
    client = TrialActorClient(storage)
    trial = Trial(
        "tests.trainables:FakeTrainable",
        {"sleep": 0.02},
        experiment_name="drain",
        trial_id="d1",
        stopping_criterion={"training_iteration": 100_000},
        checkpoint_freq=1_000,  # no checkpoint of its own before the drain
    )
    actor = client.launch(trial)
    _results_after(actor, 3)

    report = drain_trials(timeout_s=60, prefix="trial.drain.")

    state = report.states["trial.drain.d1"]
    assert state["state"] == "paused" and report.unsettled == []
    paused_at = state["iteration"]
    assert state["checkpoint_iteration"] == paused_at >= 3
    assert report.summary().startswith("Drained 1 trial(s) in ") and "1 paused" in report.summary()
    # Paused: it trains nothing more while it waits.
    time.sleep(0.3)
    snap = ray.get(actor.poll.remote(0))
    assert snap.num_results == paused_at and snap.status == "RUNNING"
    assert [c.iteration for c in snap.kept_checkpoints] == [paused_at]
    # Durable: the checkpoint of the last reported iteration, with every result before it.
    ((path, meta),) = TrialStorage(storage).saved_checkpoints("drain", "d1", after=0)
    assert path == snap.kept_checkpoints[0].path and meta["iteration"] == paused_at
    assert [r["training_iteration"] for r in meta[RESULTS_KEY]] == list(range(1, paused_at + 1))
    # Asked again, a paused trial answers the same and saves nothing more.
    assert drain_trials(timeout_s=5, prefix="trial.drain.").states == report.states
    # Marked, so that its next try reads its actor gone as stopped with the stack.
    assert TrialStorage(storage).drained_at("drain", "d1") == paused_at

    ray.get(actor.resume_drained.remote())
    _results_after(actor, paused_at + 3)
    assert TrialStorage(storage).drained_at("drain", "d1") is None  # it trains again
    ray.get(actor.request_stop.remote())
    snap = wait_done(actor)
    iterations = [r["training_iteration"] for r in snap.results]
    assert snap.status == "TERMINATED" and iterations == list(range(1, len(iterations) + 1))
    client.terminate("drain", "d1")
    assert live_trial_actors() == []


def test_a_trial_that_cannot_pause_in_time_is_reported_and_not_waited_for(ray_cluster, storage):
    client = TrialActorClient(storage)
    trial = Trial(
        "tests.trainables:FakeTrainable",
        {"sleep": 600.0},  # its first iteration outlasts the drain
        experiment_name="drain",
        trial_id="slow",
        stopping_criterion={"training_iteration": 2},
    )
    client.launch(trial)
    try:
        report = drain_trials(timeout_s=0.5, prefix="trial.drain.")
    finally:
        client.terminate("drain", "slow")
    assert report.states["trial.drain.slow"]["state"] == "training"
    assert report.unsettled == ["trial.drain.slow"]
    assert report.seconds < 60
    summary = report.summary()
    assert "Did not pause within 0.5 s: trial.drain.slow (iteration None, checkpoint at None)" in (
        summary
    )
    assert "drain_timeout_seconds" in summary
    assert live_trial_actors() == []


def test_a_drain_finds_nothing_to_do_without_trial_actors(ray_cluster):
    report = drain_trials(timeout_s=5, prefix="trial.nobody.")
    assert report.states == {} and report.unsettled == []
    assert report.summary().startswith("Drained 0 trial(s)")


def test_a_function_trainable_pauses_at_its_last_reported_checkpoint_and_says_so(
    ray_cluster, storage
):
    client = TrialActorClient(storage)
    trial = Trial(
        "tests.trainables:sleepy",  # reports no checkpoint at all
        {"iterations": 100_000, "sleep": 0.02},
        experiment_name="drain",
        trial_id="f1",
        stopping_criterion={"training_iteration": 100_000},
    )
    actor = client.launch(trial)
    try:
        _results_after(actor, 2)
        report = drain_trials(timeout_s=60, prefix="trial.drain.")
    finally:
        client.terminate("drain", "f1")
    state = report.states["trial.drain.f1"]
    assert state["state"] == "paused" and state["checkpoint_iteration"] is None
    assert "Paused past their last checkpoint" in report.summary()
    assert f"trial.drain.f1 (iteration {state['iteration']}, checkpoint at None)" in (
        report.summary()
    )
    assert TrialStorage(storage).saved_checkpoints("drain", "f1") == []


def test_a_trial_ray_has_not_placed_is_not_waited_for(ray_cluster, storage):
    client = TrialActorClient(storage)
    trial = Trial(
        "tests.trainables:FakeTrainable",
        {},
        experiment_name="drain",
        trial_id="queued",
        stopping_criterion={"training_iteration": 2},
        resources={"cpu": 64},  # more than the test cluster has: it waits, queued
    )
    client.launch(trial, start_timeout_s=None, wait_for_capacity=True)
    try:
        report = drain_trials(timeout_s=60, prefix="trial.drain.")
    finally:
        client.terminate("drain", "queued")
    assert report.states == {"trial.drain.queued": {"state": "queued"}}
    assert report.unsettled == [] and report.seconds < 30
    assert "1 queued" in report.summary()
    assert live_trial_actors() == []
