"""core/fate.py: the one decision after a result and after a failure, on every path."""

from __future__ import annotations

import pytest

from airflow_trials import Trial
from airflow_trials.core.end import TrialEnd
from airflow_trials.core.fate import (
    TRANSITION_STATUS,
    Action,
    Outcome,
    Transition,
    after_failure,
    after_result,
    status_after_end,
)
from airflow_trials.core.status import TrialStatus


def make_trial(**kwargs):
    kwargs.setdefault("trial_id", "t-1")
    kwargs.setdefault("stopping_criterion", {"training_iteration": 3})
    return Trial("tests.trainables:counting", {"lr": 0.1}, **kwargs)


def result(iteration, **extra):
    return {"training_iteration": iteration, "loss": 1.0 / iteration, **extra}


def test_a_result_below_the_criterion_continues_and_is_recorded():
    trial = make_trial()
    decision = after_result(trial, result(1))
    assert (decision.fresh, decision.action, decision.save_checkpoint) == (True, Action.CONTINUE, False)
    assert trial.last_result["training_iteration"] == 1


def test_meeting_the_criterion_stops_and_checkpoints_at_end_unless_the_result_has_one():
    trial = make_trial(checkpoint_at_end=True)
    decision = after_result(trial, result(3))
    assert (decision.action, decision.save_checkpoint) == (Action.STOP, True)
    assert "stopping criterion" in decision.reason
    with_checkpoint = after_result(make_trial(checkpoint_at_end=True), result(3, checkpoint="/c/3"))
    assert (with_checkpoint.action, with_checkpoint.save_checkpoint) == (Action.STOP, False)
    done = after_result(make_trial(), result(1, done=True))
    assert (done.action, done.save_checkpoint) == (Action.STOP, False)


def test_a_checkpoint_is_due_every_checkpoint_freq_iterations():
    trial = make_trial(checkpoint_freq=2, stopping_criterion={"training_iteration": 10})
    due = [after_result(trial, result(i)).save_checkpoint for i in range(1, 6)]
    assert due == [False, True, False, True, False]
    assert not after_result(trial, result(6, checkpoint="/c/6")).save_checkpoint  # it brought its own


def test_a_replayed_or_duplicate_result_is_not_recorded_again_and_the_scheduler_is_not_asked():
    asked = []
    trial = make_trial(stopping_criterion={"training_iteration": 10})
    after_result(trial, result(2))
    replay = after_result(trial, result(2), scheduler=lambda t, r: asked.append(r) or "STOP")
    assert (replay.fresh, replay.action, asked) == (False, Action.CONTINUE, [])
    duplicate = after_result(trial, result(3), duplicate=True)
    assert not duplicate.fresh and trial.last_recorded_iteration == 2


@pytest.mark.parametrize(("said", "action"), [("CONTINUE", Action.CONTINUE), ("PAUSE", Action.PAUSE),
                                               ("STOP", Action.STOP)])
def test_the_scheduler_decides_for_trials_the_criterion_does_not_end(said, action):
    trial = make_trial(checkpoint_at_end=True, stopping_criterion={"training_iteration": 10})
    decision = after_result(trial, result(1), scheduler=lambda t, r: said)
    assert decision.action is action
    assert decision.save_checkpoint is (action is Action.STOP)
    # The criterion wins over the scheduler.
    assert after_result(trial, result(10), scheduler=lambda t, r: "PAUSE").action is Action.STOP


def test_a_stop_or_pause_carries_the_schedulers_reason_and_a_finished_trainable_says_so():
    trial = make_trial(stopping_criterion={"training_iteration": 10})
    why = {"t-1": "stopped by ASHA at training_iteration=1 (rung 1 of 2): score 1 below the rung's cutoff 2"}
    stopped = after_result(trial, result(1), scheduler=lambda t, r: "STOP", scheduler_reason=why.get)
    assert (stopped.action, stopped.reason) == (Action.STOP, why["t-1"])
    paused = after_result(trial, result(2), scheduler=lambda t, r: "PAUSE", scheduler_reason=lambda _: None)
    assert (paused.action, paused.reason) == (Action.PAUSE, "the scheduler paused it")
    assert after_result(trial, result(3, done=True)).reason == "its trainable finished"


def test_the_experiment_stopper_ends_the_experiment_after_the_trials_own_criterion():
    trial = make_trial()
    assert after_result(trial, result(1), experiment_done=lambda: True).action is Action.STOP_EXPERIMENT
    assert after_result(trial, result(3), experiment_done=lambda: True).action is Action.STOP


def test_a_stopping_criterion_on_a_missing_metric_raises_key_error():
    trial = make_trial(stopping_criterion={"accuracy": 0.9})
    with pytest.raises(KeyError):
        after_result(trial, result(1))


def test_failures_retry_within_max_failures_then_fail():
    first = after_failure("t", 0, 2)
    assert (first.outcome, first.num_failures) == (Outcome.RETRY, 1)
    assert "failure 1 of at most 2" in first.reason
    assert after_failure("t", 1, 2).outcome is Outcome.RETRY
    last = after_failure("t", 2, 2, fail_fast=True)
    assert (last.outcome, last.num_failures, last.fail_experiment) == (Outcome.FAIL, 3, True)
    assert "reached its max_failures (2)" in last.reason
    assert after_failure("t", 500, -1).outcome is Outcome.RETRY
    assert after_failure("t", 0, 0).outcome is Outcome.FAIL


def test_no_retry_left_with_the_caller_fails_within_budget():
    decision = after_failure("t", 0, 3, retries_left=False)
    assert (decision.outcome, decision.num_failures, decision.fail_experiment) == (Outcome.FAIL, 1, False)
    assert "no retries left" in decision.reason


def test_infrastructure_losses_resume_without_counting_up_to_a_limit():
    lost = after_failure("t", 1, 1, infrastructure=True)
    assert (lost.outcome, lost.num_failures) == (Outcome.RESUME, 1)
    assert "without counting it against max_failures" in lost.reason
    capped = after_failure("t", 1, 1, infrastructure=True, infrastructure_restarts=2, max_infrastructure_restarts=3)
    assert capped.outcome is Outcome.RESUME and "restart 3 of 3" in capped.reason
    past = after_failure("t", 1, 1, infrastructure=True, infrastructure_restarts=3, max_infrastructure_restarts=3)
    assert (past.outcome, past.num_failures) == (Outcome.FAIL, 2)


def test_the_end_event_round_trips_through_plain_values_and_reads_older_payloads():
    end = TrialEnd.lost("t-1", "exp", "its Ray actor is gone", infrastructure=True, released=True)
    payload = end.to_event()
    assert payload["status"] == "ERROR" and isinstance(payload["status"], str)
    assert TrialEnd.from_event(payload) == end
    assert end.error == "Trial t-1 of experiment exp failed: its Ray actor is gone."
    old = {"trial_id": "t-1", "experiment_name": "exp", "status": "TERMINATED", "error": None,
           "last_result": {"training_iteration": 3}, "best_checkpoint": {"path": "/c/3"}, "num_results": 3}
    read = TrialEnd.from_event(old)
    assert (read.finished, read.best_checkpoint, read.released, read.infrastructure) == (True, "/c/3", False, False)
    assert read.stop_reason is None  # events from before stop reasons were carried


ASHA_STOP = "stopped by ASHA at training_iteration=3 (rung 1 of 4): loss 0.41 above the rung's cutoff 0.35"


def test_the_stop_reason_travels_from_the_actor_s_last_poll_through_the_event():
    snapshot = {"trial_id": "t-1", "status": "TERMINATED", "last_result": {"training_iteration": 3},
                "best_checkpoint": {"path": "/c/3", "iteration": 3}, "num_results": 3, "stop_reason": ASHA_STOP}
    end = TrialEnd.from_snapshot("exp", snapshot, released=True)
    assert (end.finished, end.stop_reason) == (True, ASHA_STOP)
    payload = end.to_event()
    assert payload["stop_reason"] == ASHA_STOP
    assert TrialEnd.from_event(payload) == end
    failed = TrialEnd.from_snapshot("exp", {"trial_id": "t-1", "status": "ERROR", "error": "boom"}, released=False)
    assert failed.stop_reason is None


def test_a_stored_end_carries_the_stop_reason_the_store_holds():
    stored = TrialEnd.stored("t-1", "exp", {"training_iteration": 3}, "/c/3", stop_reason=ASHA_STOP)
    assert (stored.status, stored.released, stored.stop_reason) == (TrialStatus.TERMINATED, True, ASHA_STOP)
    assert TrialEnd.from_event(stored.to_event()) == stored
    assert TrialEnd.stored("t-1", "exp", None, None).stop_reason is None


def test_an_end_event_must_be_an_end():
    with pytest.raises(ValueError, match="TERMINATED or ERROR"):
        TrialEnd("t-1", "exp", TrialStatus.RUNNING)


@pytest.mark.parametrize(
    ("end", "decision", "status"),
    [
        (TrialEnd.stored("t-1", "exp", {"training_iteration": 3}, None), None, TrialStatus.TERMINATED),
        (TrialEnd.lost("t-1", "exp", "boom"), after_failure("t-1", 0, 1), TrialStatus.PENDING),
        (TrialEnd.lost("t-1", "exp", "boom"), after_failure("t-1", 1, 1), TrialStatus.ERROR),
        (TrialEnd.lost("t-1", "exp", "gone", infrastructure=True),
         after_failure("t-1", 1, 1, infrastructure=True), TrialStatus.PENDING),
    ],
)
def test_the_status_after_an_end_follows_the_failure_decision(end, decision, status):
    assert status_after_end(end, decision) is status


def test_every_transition_names_its_status():
    assert set(TRANSITION_STATUS) == set(Transition)
