"""Run-ahead: where the runner knows a trial continues, its actor trains the next iteration without
waiting to be asked (core/fate.py ``run_ahead_below``; execution/worker/actor.py ``train``)."""

from __future__ import annotations

import time

import pytest

from airflow_trials import Trial
from airflow_trials.core.fate import NO_RUN_AHEAD, after_result, run_ahead_below
from airflow_trials.core.stopping import Stopper
from airflow_trials.execution.worker.actor import TrialActor
from tests.unit.actor_waits import started, wait_for


def make_trial(**kwargs):
    return Trial("tests.trainables:logged", {}, trial_id="t-1", **kwargs)


class CountingStopper(Stopper):
    def __init__(self):
        self.calls = 0

    def __call__(self, trial_id, result):
        self.calls += 1
        return self.calls >= 3


@pytest.mark.parametrize(
    ("kwargs", "judged", "expected"),
    [
        ({}, False, None),  # nothing can end it before its trainable returns
        ({"stopping_criterion": {"training_iteration": 5}}, False, 5),
        ({"stopping_criterion": {"training_iteration": 4.5}}, False, 5),  # stops at 5 >= 4.5
        (
            {"stopping_criterion": {"training_iteration": 5, "score": 0.9}},
            False,
            NO_RUN_AHEAD,
        ),  # reads a metric
        (
            {"stopping_criterion": lambda trial_id, result: False},
            False,
            NO_RUN_AHEAD,
        ),  # code: only it knows
        ({"stopping_criterion": CountingStopper()}, False, NO_RUN_AHEAD),
        ({"checkpoint_freq": 3}, False, 3),
        ({"stopping_criterion": {"training_iteration": 2}, "checkpoint_freq": 3}, False, 2),
        ({}, True, NO_RUN_AHEAD),  # a scheduler (or an experiment stopper) judges every result
    ],
)
def test_run_ahead_stops_below_the_first_result_that_could_change_what_happens(
    kwargs, judged, expected
):
    bound = run_ahead_below(make_trial(**kwargs), results_judged=judged)
    assert bound == expected if expected is not None else bound > 10**9


def test_the_bound_agrees_with_after_result_at_every_iteration():
    """Below the bound, after_result says CONTINUE without a checkpoint; at the bound it does
    not."""
    trial = make_trial(stopping_criterion={"training_iteration": 7}, checkpoint_freq=3)
    for iteration in range(1, 8):
        bound = run_ahead_below(trial, results_judged=False)
        decision = after_result(trial, {"training_iteration": iteration, "score": 1.0})
        plain_continue = decision.action.value == "CONTINUE" and not decision.save_checkpoint
        assert plain_continue == (iteration < bound), (iteration, bound, decision)


def actor(storage, tmp_path, **config):
    log = tmp_path / "iterations.log"
    spec = {
        "trial_id": "t1",
        "experiment_name": "unit",
        "trainable": "tests.trainables:logged",
        "config": {"log": str(log), **config},
    }
    return TrialActor(spec, storage, storage, capture_output=False), log


def test_below_the_bound_the_trainable_trains_its_next_result_before_it_is_asked(storage, tmp_path):
    a, log = actor(storage, tmp_path)
    assert a.train(run_ahead_below=10)["training_iteration"] == 1
    session = a._driver._session
    wait_for(session.results.full, "iteration 2 to be reported without a train() call")
    reported = time.time()
    assert started(log) == [1, 2]
    # A save now is the state of the last result handed out (1), not of the one trained ahead.
    assert a.save()["iteration"] == 1
    assert a._storage.load_checkpoint(a.save()["path"])[0] == {"i": 1}
    second = a.train(run_ahead_below=10)
    # It is stamped when it was reported, and timed from when it was let go, not from the call.
    assert second["training_iteration"] == 2 and second["score"] == 2.0
    assert second["timestamp"] <= reported
    a.stop()


def test_at_the_bound_the_trainable_waits_and_a_stop_ends_it_without_another_iteration(
    storage, tmp_path
):
    a, log = actor(storage, tmp_path)
    assert [a.train(run_ahead_below=2)["training_iteration"] for _ in range(2)] == [1, 2]
    thread = a._driver._thread
    a.stop()  # what the runner does when the criterion ends the trial at iteration 2
    thread.join(timeout=10)
    assert not thread.is_alive()
    assert started(log) == [1, 2]


def test_time_this_iter_counts_the_trainable_s_time_only(storage, tmp_path):
    a, _ = actor(storage, tmp_path, sleep=0.05)
    first = a.train(run_ahead_below=10)
    time.sleep(0.3)  # the runner is slow to ask: the second result waits, trained ahead
    second = a.train(run_ahead_below=10)
    assert first["time_this_iter_s"] >= 0.05 and second["time_this_iter_s"] >= 0.05
    # Timed from when it was let go (after the first was reported) to when it was reported.
    assert second["time_this_iter_s"] <= second["timestamp"] - first["timestamp"]
    a.stop()


def test_a_restore_drops_what_was_trained_ahead(storage, tmp_path):
    a, log = actor(storage, tmp_path)
    first = a.train(run_ahead_below=10)
    wait_for(a._driver._session.results.full, "iteration 2 to be reported ahead")
    assert a.restore(a.save()["path"]) == 1 == first["training_iteration"]
    resumed = a.train()
    assert resumed["training_iteration"] == 2 and resumed["iterations_since_restore"] == 1
    a.stop()


class EndsTheExperiment(Stopper):
    def __call__(self, trial_id, result):
        return False

    def stop_all(self):
        return False


def test_the_runner_s_rule_turns_run_ahead_off_where_a_scheduler_or_an_experiment_stopper_judges():
    from airflow_trials import ASHAScheduler, FIFOScheduler, MedianStoppingRule
    from airflow_trials.core.fate import run_ahead_rule
    from airflow_trials.core.stopping import ThresholdStopper

    trial = make_trial(stopping_criterion={"training_iteration": 5})
    assert run_ahead_rule(FIFOScheduler(), None)(trial) == 5
    assert run_ahead_rule(FIFOScheduler(), ThresholdStopper({"training_iteration": 5}))(trial) == 5
    assert run_ahead_rule(ASHAScheduler(metric="score", mode="max"), None)(trial) == NO_RUN_AHEAD
    assert (
        run_ahead_rule(MedianStoppingRule(metric="score", mode="max"), None)(trial) == NO_RUN_AHEAD
    )
    assert run_ahead_rule(FIFOScheduler(), EndsTheExperiment())(trial) == NO_RUN_AHEAD


def test_a_class_trainable_never_trains_ahead_and_is_timed_from_the_call(storage):
    spec = {
        "trial_id": "t1",
        "experiment_name": "unit",
        "trainable": "tests.trainables:FakeTrainable",
        "config": {"sleep": 0.05},
    }
    a = TrialActor(spec, storage, storage, capture_output=False)
    a.train(run_ahead_below=10)
    time.sleep(0.3)  # the runner is slow to ask: a class trainable waits for the call
    called = time.time()
    second = a.train(run_ahead_below=10)
    assert 0.05 <= second["time_this_iter_s"] <= second["timestamp"] - called
    a.stop()
