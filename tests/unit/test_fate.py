"""core/fate.py: the one decision after a result and after a failure, on every path."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from airflow_trials import Trial
from airflow_trials.core.airflow_tries import first_try_after_a_clear, retries_left
from airflow_trials.core.end import TrialEnd
from airflow_trials.core.fate import (
    TRANSITION_STATUS,
    Action,
    ActorState,
    Outcome,
    Start,
    Transition,
    after_failure,
    after_result,
    ended_for_good,
    on_start,
    status_after_end,
)
from airflow_trials.core.status import TrialStatus
from airflow_trials.core.stop_kind import StopKind
from airflow_trials.core.trial import check_max_failures
from airflow_trials.core.update import TrialUpdate


def make_trial(**kwargs):
    kwargs.setdefault("trial_id", "t-1")
    kwargs.setdefault("stopping_criterion", {"training_iteration": 3})
    return Trial("tests.trainables:counting", {"lr": 0.1}, **kwargs)


def result(iteration, **extra):
    return {"training_iteration": iteration, "loss": 1.0 / iteration, **extra}


def test_a_result_below_the_criterion_continues_and_is_recorded():
    trial = make_trial()
    decision = after_result(trial, result(1))
    assert (decision.fresh, decision.action, decision.save_checkpoint) == (
        True,
        Action.CONTINUE,
        False,
    )
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
    assert not after_result(
        trial, result(6, checkpoint="/c/6")
    ).save_checkpoint  # it brought its own


def test_a_replayed_or_duplicate_result_is_not_recorded_again_and_the_scheduler_is_not_asked():
    asked = []
    trial = make_trial(stopping_criterion={"training_iteration": 10})
    after_result(trial, result(2))
    replay = after_result(trial, result(2), scheduler=lambda t, r: asked.append(r) or "STOP")
    assert (replay.fresh, replay.action, asked) == (False, Action.CONTINUE, [])
    duplicate = after_result(trial, result(3), duplicate=True)
    assert not duplicate.fresh and trial.last_recorded_iteration == 2


@pytest.mark.parametrize(
    ("said", "action"),
    [("CONTINUE", Action.CONTINUE), ("PAUSE", Action.PAUSE), ("STOP", Action.STOP)],
)
def test_the_scheduler_decides_for_trials_the_criterion_does_not_end(said, action):
    trial = make_trial(checkpoint_at_end=True, stopping_criterion={"training_iteration": 10})
    decision = after_result(trial, result(1), scheduler=lambda t, r: said)
    assert decision.action is action
    assert decision.save_checkpoint is (action is Action.STOP)
    # The criterion wins over the scheduler.
    assert after_result(trial, result(10), scheduler=lambda t, r: "PAUSE").action is Action.STOP


def test_a_stop_or_pause_carries_the_schedulers_reason_and_a_finished_trainable_says_so():
    trial = make_trial(stopping_criterion={"training_iteration": 10})
    why = {
        "t-1": "stopped by ASHA at training_iteration=1 (rung 1 of 2): score 1 below the rung's "
        "cutoff 2"
    }
    stopped = after_result(
        trial, result(1), scheduler=lambda t, r: "STOP", scheduler_reason=why.get
    )
    assert (stopped.action, stopped.reason) == (Action.STOP, why["t-1"])
    paused = after_result(
        trial, result(2), scheduler=lambda t, r: "PAUSE", scheduler_reason=lambda _: None
    )
    assert (paused.action, paused.reason) == (Action.PAUSE, "the scheduler paused it")
    assert after_result(trial, result(3, done=True)).reason == "its trainable finished"


def test_the_experiment_stopper_ends_the_experiment_after_the_trials_own_criterion():
    trial = make_trial()
    assert (
        after_result(trial, result(1), experiment_done=lambda: True).action
        is Action.STOP_EXPERIMENT
    )
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
    assert (decision.outcome, decision.num_failures, decision.fail_experiment) == (
        Outcome.FAIL,
        1,
        False,
    )
    assert "no retries left" in decision.reason


def test_infrastructure_losses_resume_without_counting_up_to_a_limit():
    lost = after_failure("t", 1, 1, infrastructure=True)
    assert (lost.outcome, lost.num_failures) == (Outcome.RESUME, 1)
    assert "without counting it against max_failures" in lost.reason
    capped = after_failure(
        "t", 1, 1, infrastructure=True, infrastructure_restarts=2, max_infrastructure_restarts=3
    )
    assert capped.outcome is Outcome.RESUME and "restart 3 of 3" in capped.reason
    past = after_failure(
        "t", 1, 1, infrastructure=True, infrastructure_restarts=3, max_infrastructure_restarts=3
    )
    assert (past.outcome, past.num_failures) == (Outcome.FAIL, 2)


def test_the_end_event_round_trips_through_plain_values_and_reads_older_payloads():
    end = TrialEnd.lost("t-1", "exp", "its Ray actor is gone", infrastructure=True, released=True)
    payload = end.to_event()
    assert payload["status"] == "ERROR" and isinstance(payload["status"], str)
    assert TrialEnd.from_event(payload) == end
    assert end.error == "Trial t-1 of experiment exp failed: its Ray actor is gone."
    old = {
        "trial_id": "t-1",
        "experiment_name": "exp",
        "status": "TERMINATED",
        "error": None,
        "last_result": {"training_iteration": 3},
        "best_checkpoint": {"path": "/c/3"},
        "num_results": 3,
    }
    read = TrialEnd.from_event(old)
    assert (read.finished, read.best_checkpoint, read.released, read.infrastructure) == (
        True,
        "/c/3",
        False,
        False,
    )
    assert read.stop_reason is None  # events from before stop reasons were carried


ASHA_STOP = (
    "stopped by ASHA at training_iteration=3 (rung 1 of 4): loss 0.41 above the rung's cutoff 0.35"
)


def test_the_stop_reason_travels_from_the_actor_s_last_poll_through_the_event():
    update = TrialUpdate(
        "t-1",
        status=TrialStatus.TERMINATED,
        last_result={"training_iteration": 3},
        best_checkpoint="/c/3",
        num_results=3,
        stop_reason=ASHA_STOP,
    )
    end = update.end("exp", released=True)
    assert (end.finished, end.stop_reason) == (True, ASHA_STOP)
    payload = end.to_event()
    assert payload["stop_reason"] == ASHA_STOP
    assert TrialEnd.from_event(payload) == end
    failed = TrialUpdate("t-1", status=TrialStatus.ERROR, error="boom").end("exp", released=False)
    assert failed.stop_reason is None


def test_a_stored_end_carries_the_stop_reason_the_store_holds():
    stored = TrialEnd.stored("t-1", "exp", {"training_iteration": 3}, "/c/3", stop_reason=ASHA_STOP)
    assert (stored.status, stored.released, stored.stop_reason) == (
        TrialStatus.TERMINATED,
        True,
        ASHA_STOP,
    )
    assert TrialEnd.from_event(stored.to_event()) == stored
    assert TrialEnd.stored("t-1", "exp", None, None).stop_reason is None


def test_an_end_event_must_be_an_end():
    with pytest.raises(ValueError, match="TERMINATED or ERROR"):
        TrialEnd("t-1", "exp", TrialStatus.RUNNING)


@pytest.mark.parametrize(
    ("end", "decision", "status"),
    [
        (
            TrialEnd.stored("t-1", "exp", {"training_iteration": 3}, None),
            None,
            TrialStatus.TERMINATED,
        ),
        (TrialEnd.lost("t-1", "exp", "boom"), after_failure("t-1", 0, 1), TrialStatus.PENDING),
        (TrialEnd.lost("t-1", "exp", "boom"), after_failure("t-1", 1, 1), TrialStatus.ERROR),
        (
            TrialEnd.lost("t-1", "exp", "gone", infrastructure=True),
            after_failure("t-1", 1, 1, infrastructure=True),
            TrialStatus.PENDING,
        ),
    ],
)
def test_the_status_after_an_end_follows_the_failure_decision(end, decision, status):
    assert status_after_end(end, decision) is status


def test_every_transition_names_its_status():
    assert set(TRANSITION_STATUS) == set(Transition)


# -- the start of a try -------------------------------------------------------------------------


@dataclass(frozen=True)
class Stored:
    """A trial's record as on_start reads it (the fields of the store's TrialRecord it needs)."""

    status: TrialStatus
    last_result: dict[str, Any] | None = None
    stop_reason: str | None = None
    stopped_from_airflow: bool = False
    trial_id: str = "t-1"
    stop_kind: StopKind | None = None


ASHA_STOP = "stopped by ASHA at training_iteration=1 (rung 1 of 3): loss 0.9 above the cutoff 0.5"
# What each kind of stored trial is (make_trial's criterion is training_iteration 3).
STORED = {
    "pending": Stored(TrialStatus.PENDING),
    "running": Stored(TrialStatus.RUNNING, {"training_iteration": 2}),
    "paused": Stored(TrialStatus.PAUSED, {"training_iteration": 2}),
    "error": Stored(TrialStatus.ERROR, {"training_iteration": 2}),
    "error-at-criterion": Stored(TrialStatus.ERROR, {"training_iteration": 3}),
    "finished": Stored(
        TrialStatus.TERMINATED,
        {"training_iteration": 3},
        "it met its stopping criterion",
        stop_kind=StopKind.CRITERION,
    ),
    "stopped-by-scheduler": Stored(
        TrialStatus.TERMINATED, {"training_iteration": 1}, ASHA_STOP, stop_kind=StopKind.SCHEDULER
    ),
    # Its criterion was raised since it ended.
    "ended-short": Stored(TrialStatus.TERMINATED, {"training_iteration": 2}),
    "ended-without-results": Stored(TrialStatus.TERMINATED),
    "stopped-from-airflow": Stored(TrialStatus.TERMINATED, {"training_iteration": 2}, None, True),
    "stopped-from-airflow-at-criterion": Stored(
        TrialStatus.TERMINATED, {"training_iteration": 3}, None, True
    ),
}

# (start, stop the actor found first, placed, transition before the launch)
REPORT = (Start.REPORT_END, False, False, None)
RESTART = (Start.RESTART, False, False, Transition.RESET)
RESET = (Start.RESET, False, False, Transition.RESET)
RESUME = (Start.RESUME, False, False, None)
RESUME_QUEUED = (Start.RESUME, False, False, Transition.QUEUED)
KILL_RESET = (Start.RESET, True, False, Transition.RESET)
KILL_RESUME = (Start.RESUME, True, False, None)
KILL_RESUME_QUEUED = (Start.RESUME, True, False, Transition.QUEUED)
ATTACH = (Start.REATTACH, False, True, None)
ATTACH_QUEUED = (Start.REATTACH, False, False, None)

A = ActorState
# stored trial, actor: (action on a retry, action on the first try after a clear)
START_TABLE = {
    **{
        (kind, actor): expected
        for kind in ("pending", "running", "paused")
        for actor, expected in (
            (A.GONE, (RESUME, RESET)),
            (A.QUEUED, (ATTACH_QUEUED, ATTACH_QUEUED)),
            (A.RUNNING, (ATTACH, ATTACH)),
            (A.TERMINATED, (ATTACH, ATTACH)),
            (A.STALE, (KILL_RESUME, KILL_RESET)),
        )
    },
    **{
        (kind, actor): expected
        for kind in ("error", "error-at-criterion", "ended-short", "ended-without-results")
        for actor, expected in (
            (A.GONE, (RESUME_QUEUED, RESET)),
            (A.QUEUED, (ATTACH_QUEUED, ATTACH_QUEUED)),
            (A.RUNNING, (ATTACH, ATTACH)),
            (A.TERMINATED, (ATTACH, ATTACH)),
            (A.STALE, (KILL_RESUME_QUEUED, KILL_RESET)),
        )
    },
    **{
        (kind, actor): expected
        for kind in ("finished", "stopped-by-scheduler")
        for actor, expected in (
            (A.GONE, (REPORT, RESTART)),
            (A.QUEUED, (ATTACH_QUEUED, ATTACH_QUEUED)),
            (A.RUNNING, (ATTACH, ATTACH)),
            (A.TERMINATED, (ATTACH, ATTACH)),
            (A.STALE, (KILL_RESUME_QUEUED, KILL_RESET)),
        )
    },
    # Its previous try stops the actor found: never re-attach to it.
    **{
        ("stopped-from-airflow", actor): (KILL_RESUME_QUEUED, KILL_RESET)
        for actor in (A.QUEUED, A.RUNNING, A.TERMINATED, A.STALE)
    },
    ("stopped-from-airflow", A.GONE): (RESUME_QUEUED, RESET),
    **{
        ("stopped-from-airflow-at-criterion", actor): (KILL_RESUME_QUEUED, KILL_RESET)
        for actor in (A.QUEUED, A.RUNNING, A.TERMINATED, A.STALE)
    },
    ("stopped-from-airflow-at-criterion", A.GONE): (REPORT, RESTART),
}


def test_the_start_table_covers_every_stored_trial_and_actor_state():
    assert set(START_TABLE) == {(kind, actor) for kind in STORED for actor in ActorState}


@pytest.mark.parametrize("cleared", [False, True], ids=["retry", "cleared"])
@pytest.mark.parametrize(("kind", "actor"), sorted(START_TABLE), ids=lambda v: str(v))
def test_on_start_decides_every_stored_trial_actor_state_and_clear(kind, actor, cleared):
    action = on_start(STORED[kind], actor, trial=make_trial(), try_number=2, cleared=cleared)
    decided = (action.start, action.stop_actor, action.placed, action.transition)
    assert decided == START_TABLE[kind, actor][cleared]
    assert action.launches is (action.start in (Start.RESTART, Start.RESET, Start.RESUME))
    assert "t-1" in action.reason


@pytest.mark.parametrize(("kind", "actor"), sorted(START_TABLE), ids=lambda v: str(v))
def test_a_cleared_handle_starts_as_a_cleared_task_and_never_reattaches(kind, actor):
    """A user cleared the task's handle in Airflow's task state store (operators/task_handle.py)."""
    action = on_start(
        STORED[kind], actor, trial=make_trial(), try_number=2, cleared=False, handle_kept=False
    )
    expected = START_TABLE[kind, actor][True]
    if expected[0] is Start.REATTACH:  # a live actor is stopped and the trial starts afresh
        expected = KILL_RESET
    assert (action.start, action.stop_actor, action.placed, action.transition) == expected
    if action.start is Start.RESET:
        assert action.reason.endswith("(its handle in the task state store was cleared).")


def test_on_start_says_why_in_the_words_the_task_log_is_searched_for():
    def reason(kind, actor):
        return on_start(STORED[kind], actor, trial=make_trial(), try_number=2, cleared=False).reason

    assert (
        reason("running", A.RUNNING) == "Trial t-1 is RUNNING on Ray already; re-attaching to it."
    )
    assert reason("pending", A.QUEUED) == "Trial t-1 is QUEUED on Ray already; re-attaching to it."
    assert "being stopped by its cleared previous try" in reason("stopped-from-airflow", A.RUNNING)
    assert reason("finished", A.GONE) == "Trial t-1 already finished; reporting its stored state."


def test_a_raised_criterion_makes_a_finished_trial_continue_and_a_missing_metric_is_not_an_end():
    finished = STORED["finished"]
    assert ended_for_good(make_trial(), finished)
    assert not ended_for_good(make_trial(stopping_criterion={"training_iteration": 6}), finished)
    # A criterion on a metric the stored result lacks (KeyError) is not met.
    assert not ended_for_good(make_trial(stopping_criterion={"accuracy": 0.9}), finished)
    raised = make_trial(stopping_criterion={"training_iteration": 6})
    assert ended_for_good(raised, STORED["stopped-by-scheduler"])
    action = on_start(finished, ActorState.GONE, trial=raised, try_number=2, cleared=True)
    assert action.start is Start.RESET  # resumed from its checkpoint at 3, not from scratch


@pytest.mark.parametrize(
    ("try_number", "max_tries", "retries", "cleared"),
    [
        (1, 3, 3, False),  # the first try ever
        (2, 3, 3, False),  # a retry after a failure
        (2, 4, 3, True),  # cleared after try 1: max_tries = 1 + retries
        (3, 4, 3, False),  # a retry after that
        (5, 7, 3, True),  # cleared again after try 4
    ],
)
def test_the_first_try_after_a_clear_is_max_tries_minus_retries_plus_one(
    try_number, max_tries, retries, cleared
):
    assert first_try_after_a_clear(try_number, max_tries, retries) is cleared


def test_retries_are_left_while_the_try_number_is_within_them():
    assert retries_left(1, 1) and not retries_left(2, 1) and not retries_left(1, 0)


@pytest.mark.parametrize("value", [-1, 0, 3])
def test_max_failures_is_minus_one_or_a_count(value):
    assert check_max_failures(value) == value


@pytest.mark.parametrize("value", [-2, 1.0, True, "2", None])
def test_max_failures_that_is_no_count_is_refused_naming_it(value):
    message = rf"max_failures must be -1 \(unlimited\) or an integer >= 0, got {value!r}"
    with pytest.raises(ValueError, match=message):
        check_max_failures(value)
