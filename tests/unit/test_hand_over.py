"""Hand-over: a result that is sure to end its trial (core/fate.py ``hand_over_from`` /
``ends_for_sure``) is followed on the trial's actor by the start of the successor the runner named
(execution/worker/actor.py ``train``); the rule, and the actor, in process."""

from __future__ import annotations

import sys
import time

import pytest

from airflow_trials import Trial
from airflow_trials.core.fate import Action, after_result, ends_for_sure, hand_over_from
from airflow_trials.core.result import HANDED_OVER
from airflow_trials.core.scheduler import FIFOScheduler
from airflow_trials.core.stopping import Stopper
from airflow_trials.execution.worker.actor import TrialActor
from tests.unit.actor_waits import started, wait_for


class NeverStops(Stopper):
    def __call__(self, trial_id, result):
        return False


def make_trial(**kwargs):
    return Trial("tests.trainables:logged", {}, trial_id="t-1", **kwargs)


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({}, sys.maxsize),  # only its trainable's own end (done) is sure
        ({"stopping_criterion": {"training_iteration": 3}}, 3),
        ({"stopping_criterion": {"training_iteration": 2.5}}, 3),
        ({"stopping_criterion": {"training_iteration": 3, "score": 0.9}}, sys.maxsize),
        ({"stopping_criterion": NeverStops()}, sys.maxsize),
        ({"stopping_criterion": {"training_iteration": 3}, "checkpoint_freq": 2}, 3),
        ({"checkpoint_at_end": True}, None),  # its end may save a checkpoint from the actor
        ({"stopping_criterion": {"training_iteration": 3}, "checkpoint_at_end": True}, None),
    ],
)
def test_hand_over_from_is_where_the_end_is_known_in_advance(kwargs, expected):
    assert hand_over_from(make_trial(**kwargs)) == expected


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"stopping_criterion": {"training_iteration": 3}},
        {"stopping_criterion": {"training_iteration": 3, "score": 100.0}},
        {"stopping_criterion": NeverStops()},
        {"stopping_criterion": {"training_iteration": 4}, "checkpoint_freq": 2},
    ],
)
@pytest.mark.parametrize("scheduler_says", [Action.CONTINUE, Action.PAUSE, Action.STOP])
def test_a_result_sure_to_end_its_trial_is_a_stop_without_a_save_whatever_else_says(
    kwargs, scheduler_says
):
    """Wherever ends_for_sure says so, after_result (the one decision) says STOP with no
    checkpoint to save, whatever the scheduler or the experiment's stopper would say; with a
    criterion on training_iteration only, it says so exactly from that iteration on."""
    for done in (False, True):
        trial = make_trial(**kwargs)
        bound = hand_over_from(trial)
        assert bound is not None
        for iteration in range(1, 7):
            result = {"training_iteration": iteration, "score": float(iteration), "done": done}
            sure = ends_for_sure(result, bound)
            decision = after_result(
                trial,
                result,
                scheduler=lambda t, r: scheduler_says,
                experiment_done=lambda: True,
            )
            if sure:
                assert decision.action is Action.STOP and not decision.save_checkpoint
            criterion = kwargs.get("stopping_criterion")
            if isinstance(criterion, dict) and set(criterion) == {"training_iteration"}:
                assert sure == (done or iteration >= bound), (iteration, decision)
            else:
                assert sure == done


def test_the_schedulers_that_pick_in_order_are_fifo_s():
    from airflow_trials import (
        ASHAScheduler,
        HyperBandScheduler,
        MedianStoppingRule,
        PopulationBasedTraining,
    )

    class OwnOrder(FIFOScheduler):
        def choose_trial_to_run(self, trials, has_resources):
            return None

    assert FIFOScheduler().picks_in_order()
    # ASHA and the median rule judge results but start waiting trials in FIFO order.
    assert ASHAScheduler(metric="score", mode="max").picks_in_order()
    assert MedianStoppingRule(metric="score", mode="max").picks_in_order()
    assert not HyperBandScheduler(metric="score", mode="max").picks_in_order()
    pbt = PopulationBasedTraining(
        metric="score", mode="max", hyperparam_mutations={"lr": [0.1, 0.2]}
    )
    assert not pbt.picks_in_order()  # it changes a trial (exploit) before it starts
    assert not OwnOrder().picks_in_order()


def spec(trial_id, log, **config):
    return {
        "trial_id": trial_id,
        "experiment_name": "unit",
        "trainable": "tests.trainables:logged",
        "config": {"log": str(log), **config},
    }


def test_the_actor_starts_the_successor_right_after_the_result_that_ends_its_trial(
    storage, tmp_path
):
    log1, log2 = tmp_path / "t1.log", tmp_path / "t2.log"
    a = TrialActor(spec("t1", log1, iterations=2), storage, storage, capture_output=False)
    first = a.train(run_ahead_below=sys.maxsize, successor=spec("t2", log2))
    assert HANDED_OVER not in first  # iteration 1 does not end t1: the offer is not taken
    assert a.trial_id == "t1" and not log2.exists()
    second = a.train(run_ahead_below=sys.maxsize, successor=spec("t2", log2))
    assert HANDED_OVER not in second and second["training_iteration"] == 2
    # t1's function returned after its last report: the call that brings that end hands over.
    end = a.train(run_ahead_below=sys.maxsize, successor=spec("t2", log2))
    assert end["done"] and end["__duplicate__"] and end["trial_id"] == "t1"
    assert end[HANDED_OVER] == {"trial_id": "t2"}
    assert a.trial_id == "t2"
    # t2 trains its first iteration without being asked, and its result is t2's, from 1.
    wait_for(lambda: started(log2) == [1], "t2's first iteration to start unasked")
    result = a.train(run_ahead_below=sys.maxsize)
    assert (result["trial_id"], result["training_iteration"], result["score"]) == ("t2", 1, 1.0)
    assert result["iterations_since_restore"] == 1
    assert result["time_total_s"] == result["time_this_iter_s"]  # t2's counters start afresh
    assert started(log1) == [1, 2]
    # t2's checkpoints are its own.
    assert a._storage.load_checkpoint(result["checkpoint"])[0] == {"i": 1}
    assert "/t2/" in result["checkpoint"].replace("\\", "/")
    a.stop()


def test_at_a_criterion_the_ended_trial_never_trains_past_it(storage, tmp_path):
    log1, log2 = tmp_path / "t1.log", tmp_path / "t2.log"
    a = TrialActor(spec("t1", log1), storage, storage, capture_output=False)
    # The runner's criterion ends t1 at iteration 2 (hand_over_from 2; run-ahead stops below it).
    assert (
        a.train(run_ahead_below=2, successor=spec("t2", log2), hand_over_from=2)[
            "training_iteration"
        ]
        == 1
    )
    ended = a.train(run_ahead_below=2, successor=spec("t2", log2), hand_over_from=2)
    assert ended["training_iteration"] == 2 and not ended["done"]
    assert ended[HANDED_OVER] == {"trial_id": "t2"}
    wait_for(lambda: started(log2) == [1], "t2's first iteration")
    time.sleep(0.2)
    assert started(log1) == [1, 2]  # t1 was stopped at its last result, not let go on
    assert a.train()["trial_id"] == "t2"
    a.stop()


def test_a_hand_over_that_fails_leaves_the_ended_trial_s_result_whole(storage, tmp_path):
    log1 = tmp_path / "t1.log"
    a = TrialActor(spec("t1", log1, iterations=1), storage, storage, capture_output=False)
    a.train()
    broken = {**spec("t2", tmp_path / "t2.log"), "trainable": "tests.no_such_module:train"}
    end = a.train(successor=broken)
    assert end["trial_id"] == "t1" and end["done"]
    assert "could not hand itself over to trial t2" in end[HANDED_OVER]["error"]
    assert "no_such_module" in end[HANDED_OVER]["error"]
