"""A self-driving trial actor (in-process, as Ray hosts it) holds at its scheduler's hold points
until it is given a verdict, and a STOP verdict ends it TERMINATED with the scheduler's reason."""

from __future__ import annotations

import time

from airflow_trials.core.trial import Trial
from airflow_trials.execution.worker.actor import TrialActor
from airflow_trials.execution.worker.holds import Holds

# A failsafe only: each wait returns as soon as what it waits for happened.
WAIT_S = 60.0


def _autonomous(storage, points, stop=None, trial_id="t1"):
    spec = {
        "trial_id": trial_id,
        "experiment_name": "unit",
        "trainable": "tests.trainables:counting",
        "config": {},
    }
    actor = TrialActor(spec, storage, storage, capture_output=False)
    trial = Trial(
        "tests.trainables:counting",
        {},
        trial_id=trial_id,
        experiment_name="unit",
        stopping_criterion=stop or {"training_iteration": 20},
    )
    actor.run(trial.to_json_state(), None, {"time_attr": "training_iteration", "points": points})
    return actor


def _until(actor, ready):
    """The first snapshot ``ready`` accepts (polls answer at once while the trial holds or
    ended)."""
    deadline = time.monotonic() + WAIT_S
    while True:
        snapshot = actor.poll(0, wait_s=1.0)
        if ready(snapshot):
            return snapshot
        assert time.monotonic() < deadline, snapshot


def _iterations(snapshot):
    return [r["training_iteration"] for r in snapshot.results]


def test_the_trial_holds_at_each_point_until_its_verdict(storage):
    actor = _autonomous(storage, [2, 4])
    held = _until(actor, lambda s: s.held_at is not None)
    assert held.held_at == 2 and _iterations(held) == [1, 2]  # the held result is published first
    assert held.status == "RUNNING"
    actor.decide(2, "CONTINUE")
    held = _until(actor, lambda s: s.held_at == 4)
    assert _iterations(held) == [1, 2, 3, 4]
    actor.decide(
        4,
        "STOP",
        "stopped by ASHA at training_iteration=4 (rung 2 of 2): score 4 below the cutoff 5",
    )
    ended = _until(actor, lambda s: s.status != "RUNNING")
    assert ended.status == "TERMINATED" and ended.error is None
    assert _iterations(ended) == [1, 2, 3, 4]  # nothing trained past the rung it stopped at
    assert ended.stop_reason.startswith("stopped by ASHA at training_iteration=4")
    assert ended.held_at is None


def test_continue_past_every_point_runs_to_the_criterion(storage):
    actor = _autonomous(storage, [1, 3], stop={"training_iteration": 5})
    for point in (1, 3):
        _until(actor, lambda s, p=point: s.held_at == p)
        actor.decide(point, "CONTINUE")
    ended = _until(actor, lambda s: s.status != "RUNNING")
    assert ended.status == "TERMINATED" and _iterations(ended) == [1, 2, 3, 4, 5]
    assert ended.stop_reason == "it met its stopping criterion"


def test_a_stop_given_for_a_result_not_held_at_applies_at_the_next_result(storage):
    actor = _autonomous(storage, [3])
    _until(actor, lambda s: s.held_at == 3)
    actor.decide(
        2, "STOP", "stopped by ASHA: a verdict stored for result 2"
    )  # e.g. a restarted trigger
    actor.decide(3, "CONTINUE")
    ended = _until(actor, lambda s: s.status != "RUNNING")
    assert _iterations(ended) == [1, 2, 3, 4]  # result 4 is the first after the verdict
    assert ended.stop_reason == "stopped by ASHA: a verdict stored for result 2"


def test_a_stop_request_ends_a_held_trial(storage):
    actor = _autonomous(storage, [2])
    _until(actor, lambda s: s.held_at == 2)
    actor.request_stop()
    ended = _until(actor, lambda s: s.status != "RUNNING")
    assert ended.status == "TERMINATED" and _iterations(ended) == [1, 2]


def test_without_holds_the_actor_takes_no_verdicts(storage):
    spec = {
        "trial_id": "t1",
        "experiment_name": "unit",
        "trainable": "tests.trainables:counting",
        "config": {},
    }
    actor = TrialActor(spec, storage, storage, capture_output=False)
    trial = Trial(
        "tests.trainables:counting",
        {},
        trial_id="t1",
        experiment_name="unit",
        stopping_criterion={"training_iteration": 3},
    )
    actor.run(trial.to_json_state())
    assert actor.decide(1, "STOP") is False
    ended = _until(actor, lambda s: s.status != "RUNNING")
    assert _iterations(ended) == [1, 2, 3] and ended.held_at is None


def test_holds_release_every_point_a_result_passed():
    holds = Holds("time_total_s", [1.0, 4.0, 16.0])
    result = {"time_total_s": 5.0}
    assert holds.holds_at(result)
    holds.give(7, "CONTINUE", None)
    assert holds.hold(7, 5.0, lambda: False) == ("CONTINUE", None, "scheduler")
    assert not holds.holds_at({"time_total_s": 6.0})  # 1 and 4 were passed by one result
    assert holds.holds_at({"time_total_s": 16.0})
    assert not holds.holds_at({"loss": 1.0})  # no time_attr: nothing to hold at
    holds.give(7, "STOP", "late")  # the first verdict for a result stands
    assert holds.told(9) == ("CONTINUE", None, "scheduler")


def test_with_every_from_the_trial_holds_at_each_result_from_there(storage):
    """The median rule's holds: every result from grace_period waits for its verdict."""
    spec = {
        "trial_id": "t1",
        "experiment_name": "unit",
        "trainable": "tests.trainables:counting",
        "config": {},
    }
    actor = TrialActor(spec, storage, storage, capture_output=False)
    trial = Trial(
        "tests.trainables:counting",
        {},
        trial_id="t1",
        experiment_name="unit",
        stopping_criterion={"training_iteration": 20},
    )
    actor.run(
        trial.to_json_state(),
        None,
        {"time_attr": "training_iteration", "points": [], "every_from": 3},
    )
    for iteration in (3, 4, 5):
        held = _until(actor, lambda s, i=iteration: s.held_at == i)
        assert _iterations(held) == list(
            range(1, iteration + 1)
        )  # nothing past the result it holds at
        if iteration < 5:
            actor.decide(iteration, "CONTINUE")
    actor.decide(5, "STOP", "stopped by the median stopping rule at training_iteration=5: ...")
    ended = _until(actor, lambda s: s.status != "RUNNING")
    assert _iterations(ended) == [1, 2, 3, 4, 5]
    assert ended.stop_reason.startswith(
        "stopped by the median stopping rule at training_iteration=5"
    )
    assert not Holds.from_spec({"time_attr": "t", "points": [], "every_from": 2.0}).holds_at(
        {"t": 1.5}
    )
