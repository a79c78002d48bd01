from __future__ import annotations

import pytest

from airflow_trials import (
    CheckpointManager,
    CheckpointRecord,
    FIFOScheduler,
    Resources,
    Trial,
    TrialStatus,
)
from airflow_trials.core.stopping import build_stopper


def rec(i, **metrics):
    return CheckpointRecord(f"/ckpt/{i}", i, metrics)


def test_keeps_the_n_best_by_score_and_always_the_newest():
    dropped = []
    manager = CheckpointManager(2, "acc")
    dropped += manager.on_checkpoint(rec(1, acc=0.9))
    dropped += manager.on_checkpoint(rec(2, acc=0.5))
    dropped += manager.on_checkpoint(rec(3, acc=0.7))  # drops 2 (worst)
    assert [r.iteration for r in manager.kept] == [1, 3]
    dropped += manager.on_checkpoint(rec(4, acc=0.1))  # newest is kept although worst: drops 3
    assert [r.iteration for r in manager.kept] == [1, 4]
    assert [r.iteration for r in dropped] == [2, 3]
    assert manager.best().iteration == 1
    assert manager.newest.iteration == 4


def test_min_prefix_ranks_lower_is_better():
    manager = CheckpointManager(1 + 1, "min-loss")
    for i, loss in enumerate([0.3, 0.1, 0.2], start=1):
        manager.on_checkpoint(rec(i, loss=loss))
    assert [r.iteration for r in manager.kept] == [2, 3]


def test_without_score_the_oldest_goes():
    manager = CheckpointManager(2)
    for i in range(1, 5):
        manager.on_checkpoint(rec(i))
    assert [r.iteration for r in manager.kept] == [3, 4]


def test_a_dropped_checkpoint_is_retired_until_a_record_without_it_is_written():
    manager = CheckpointManager(1)
    manager.on_checkpoint(rec(1))
    stored = manager.version  # a record (the trials DB) names checkpoint 1
    manager.on_checkpoint(rec(2))
    manager.on_checkpoint(rec(3))
    assert [r.iteration for r in manager.kept] == [3]
    assert [r.iteration for r in manager.retired] == [1, 2]
    assert manager.release(stored) == []  # that record still names 1: nothing may be deleted
    after_two = manager.version - 1  # the record written when 2 was kept, 1 dropped
    assert [r.iteration for r in manager.release(after_two)] == [1]
    assert [r.iteration for r in manager.release(manager.version)] == [2]
    assert manager.retired == [] and manager.release(manager.version) == []


def test_a_checkpoint_saved_again_where_a_retired_one_was_is_not_released():
    manager = CheckpointManager(1)
    manager.on_checkpoint(rec(1))
    manager.on_checkpoint(rec(2))  # retires /ckpt/1
    manager.on_checkpoint(rec(1))  # a retry from an earlier checkpoint writes /ckpt/1 again
    assert [r.iteration for r in manager.retired] == [2]
    assert [r.path for r in manager.release()] == ["/ckpt/2"]


def test_retired_checkpoints_survive_a_saved_state_and_wait_for_the_next_record():
    manager = CheckpointManager(1)
    manager.on_checkpoint(rec(1))
    manager.on_checkpoint(rec(2))
    loaded = CheckpointManager(1)
    loaded.load(manager.to_dict())
    assert [r.iteration for r in loaded.kept] == [2]
    assert loaded.release(0) == []
    assert [r.iteration for r in loaded.release(loaded.version)] == [1]


def test_keep_zero_is_refused():
    with pytest.raises(ValueError, match="keep_checkpoints_num"):
        CheckpointManager(0)


def test_threshold_stopper_needs_the_metric():
    stopper = build_stopper({"training_iteration": 3})
    assert not stopper("t", {"training_iteration": 2})
    assert stopper("t", {"training_iteration": 3})
    with pytest.raises(KeyError, match="Trial t has stopping criterion 'accuracy'"):
        build_stopper({"accuracy": 0.9})("t", {"loss": 1})


def test_callable_stopper():
    stopper = build_stopper(lambda trial_id, result: result["loss"] < 0.1)
    assert stopper("t", {"loss": 0.05}) and not stopper("t", {"loss": 0.5})


def test_bad_stopping_criterion_is_refused():
    with pytest.raises(ValueError, match="stopping criterion"):
        build_stopper(42)


def test_fifo_prefers_pending_in_order_then_paused_and_skips_what_does_not_fit():
    big = Trial("m:f", trial_id="big", resources={"cpu": 8})
    small = Trial("m:f", trial_id="small", resources={"cpu": 1})
    paused = Trial("m:f", trial_id="paused", resources={"cpu": 1})
    paused.set_status(TrialStatus.PAUSED)
    asked = []

    def has_resources(resources):
        asked.append(resources)
        return resources.fits_in(Resources(cpu=2))

    scheduler = FIFOScheduler()
    assert scheduler.choose_trial_to_run([paused, big, small], has_resources) is small
    small.set_status(TrialStatus.RUNNING)
    assert scheduler.choose_trial_to_run([paused, big, small], has_resources) is paused
    big_twin = Trial("m:f", trial_id="big2", resources={"cpu": 8})
    asked.clear()
    assert scheduler.choose_trial_to_run([big, big_twin], has_resources) is None
    assert asked == [Resources(cpu=8)]  # asked once per resource shape
