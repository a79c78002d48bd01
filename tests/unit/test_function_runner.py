"""FunctionRunner edge cases, driven in-process through TrialActor (the class Ray hosts)."""

from __future__ import annotations

import os

import pytest

import airflow_trials
from airflow_trials import TrainableNotFoundError, TrialError
from airflow_trials.execution.trainable_api import load_trainable
from airflow_trials.execution.worker.actor import TrialActor


def actor(storage, trainable, config=None, trial_id="t1"):
    spec = {
        "trial_id": trial_id,
        "experiment_name": "unit",
        "trainable": trainable,
        "config": config or {},
    }
    return TrialActor(spec, storage, storage, capture_output=False)


def test_error_inside_the_trainable_carries_the_full_traceback(storage):
    a = actor(storage, "tests.trainables:failing")
    assert a.train()["score"] == 1.0
    with pytest.raises(TrialError) as info:
        a.train()
    assert "Trial t1: trainable failing raised an exception" in str(info.value)
    assert 'raise KeyError("broken trainable' in info.value.traceback_text
    assert "tests/trainables.py" in info.value.traceback_text


def test_return_without_reporting_is_a_clear_error(storage):
    a = actor(storage, "tests.trainables:silent")
    with pytest.raises(
        TrialError, match=r"returned without reporting any result; call airflow_trials.report"
    ):
        a.train()


def test_returning_after_reports_ends_the_trial_with_a_duplicate_marker(storage):
    a = actor(storage, "tests.trainables:sleepy", {"iterations": 2, "sleep": 0.0})
    assert [a.train()["training_iteration"] for _ in range(2)] == [1, 2]
    final = a.train()
    assert final["done"] is True and final["__duplicate__"] is True
    assert final["training_iteration"] == 2


def test_a_returned_dict_is_the_final_result(storage):
    result = actor(storage, "tests.trainables:returns_dict").train()
    assert result["score"] == 42.0 and result["done"] is True and result["training_iteration"] == 1


def test_reporting_after_done_stops_the_function_at_its_next_report(storage):
    a = actor(storage, "tests.trainables:report_after_done")
    results = [a.train() for _ in range(3)]
    assert [r["done"] for r in results] == [False, False, True]
    thread = a._driver._thread
    a.stop()
    thread.join(timeout=5)
    assert not thread.is_alive()


def test_dict_checkpoint_is_persisted_and_restored(storage):
    a = actor(storage, "tests.trainables:counting")
    results = [a.train() for _ in range(3)]
    path = results[-1]["checkpoint"]
    assert path.endswith("checkpoint_000003") and os.path.isdir(path)
    assert a.save()["path"] == path  # the reported checkpoint is not stored twice
    a.stop()

    b = actor(storage, "tests.trainables:counting", trial_id="t2")
    assert b.restore(path) == 3
    result = b.train()
    assert result["score"] == 4.0
    assert result["training_iteration"] == 4
    assert result["iterations_since_restore"] == 1
    b.stop()


def test_directory_checkpoint_is_copied_into_storage_and_restored(storage, tmp_path):
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    a = actor(
        storage, "tests.trainables:dir_checkpoint", {"scratch": str(scratch), "iterations": 5}
    )
    path = [a.train() for _ in range(2)][-1]["checkpoint"]
    assert open(os.path.join(path, "step.txt")).read() == "2"
    assert (scratch / "ckpt-2").is_dir()  # the user's own directory is copied, not moved
    a.stop()
    b = actor(
        storage, "tests.trainables:dir_checkpoint", {"scratch": str(scratch), "iterations": 5}, "t3"
    )
    b.restore(path)
    assert b.train()["step"] == 3
    b.stop()


def test_class_trainable_directory_checkpoint(storage):
    a = actor(storage, "tests.trainables:DirCheckpointTrainable")
    a.train(), a.train()
    record = a.save()
    assert (
        record["iteration"] == 2 and open(os.path.join(record["path"], "state.txt")).read() == "2"
    )
    b = actor(storage, "tests.trainables:DirCheckpointTrainable", trial_id="t4")
    b.restore(record["path"])
    assert b.train()["episode_reward_mean"] == 3.0


def test_restore_metrics_restart_since_restore_counters(storage):
    a = actor(storage, "tests.trainables:FakeTrainable")
    a.train(), a.train()
    path = a.save()["path"]
    b = actor(storage, "tests.trainables:FakeTrainable", trial_id="t5")
    b.restore(path)
    first, second = b.train(), b.train()
    assert (first["timesteps_since_restore"], first["iterations_since_restore"]) == (10, 1)
    assert (second["timesteps_since_restore"], second["iterations_since_restore"]) == (20, 2)
    assert second["timesteps_total"] == 40 and second["training_iteration"] == 4
    assert second["time_since_restore"] > 0


def test_report_outside_a_trial_says_where_to_call_it():
    with pytest.raises(RuntimeError, match="outside a trial"):
        airflow_trials.report(loss=1.0)
    with pytest.raises(RuntimeError, match="outside a trial"):
        airflow_trials.get_checkpoint()


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("no_such_module_xyz:train", "Cannot import module 'no_such_module_xyz'"),
        ("tests.trainables:nope", "has no attribute 'nope'"),
        ("tests.trainables:NOT_A_TRAINABLE", "neither a function nor a Trainable"),
        ("collections:OrderedDict", "not a subclass of airflow_trials.Trainable"),
        ("justaname", "not of the form"),
    ],
)
def test_unknown_trainables_are_named_in_the_error(path, message):
    with pytest.raises(TrainableNotFoundError, match=message):
        load_trainable(path)


def test_a_positional_dict_is_the_metrics_as_in_ray_tune(storage):
    a = actor(storage, "tests.trainables:ray2_style")
    first, second = a.train(), a.train()
    assert (first["loss"], first["step"], first.get("checkpoint")) == (1.0, 1, None)
    assert (second["loss"], second["step"]) == (0.5, 2) and second["checkpoint"]
    resumed = actor(storage, "tests.trainables:ray2_style", trial_id="t1")
    assert resumed.restore(second["checkpoint"]) == 2
    assert resumed.train()["step"] == 3  # the dict checkpoint came back through get_checkpoint()


def test_metrics_as_a_dict_and_as_keywords_is_an_error_that_names_the_fix(storage):
    a = actor(storage, "tests.trainables:ambiguous_report")
    with pytest.raises(
        TrialError, match=r"both as a dict and as keywords \(loss\).*checkpoint=state"
    ):
        a.train()


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        (
            ("/some/dir",),
            {},
            r"metrics dict as its positional argument, got str.*report\(metrics, "
            r"checkpoint=\.\.\.\)",
        ),
        (({1: 0.5},), {}, r"metric names must be strings"),
        (
            ({"loss": 1.0},),
            {"checkpoint": 3},
            r"takes a dict, a directory path or an object with a \.path",
        ),
    ],
)
def test_report_refuses_what_it_cannot_take(args, kwargs, message):
    from airflow_trials.execution.worker import trainable

    with pytest.raises(TypeError, match=message):
        trainable._metrics_of(args[0], {})
        trainable._checkpoint_of(kwargs.get("checkpoint"))


def test_report_takes_a_path_like_or_a_checkpoint_object_as_the_checkpoint(tmp_path):
    from airflow_trials.execution.worker import trainable

    class RayCheckpoint:  # the shape of ray.train.Checkpoint.from_directory(...)
        path = str(tmp_path)

    assert trainable._checkpoint_of(tmp_path) == str(tmp_path)
    assert trainable._checkpoint_of(RayCheckpoint()) == str(tmp_path)
