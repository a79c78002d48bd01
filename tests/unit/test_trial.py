from __future__ import annotations

import json
import math

import pytest

from airflow_trials import InvalidTransitionError, Resources, Trial, TrialStatus
from airflow_trials.core.status import check_transition


def make_trial(**kwargs):
    kwargs.setdefault("trial_id", "t-1")
    return Trial("tests.trainables:counting", {"lr": 0.1}, **kwargs)


def test_statuses_are_str_enum_with_is_terminal():
    assert TrialStatus("RUNNING") is TrialStatus.RUNNING
    assert str(TrialStatus.ERROR) == "ERROR"
    assert [s.value for s in TrialStatus if s.is_terminal()] == ["TERMINATED", "ERROR"]


@pytest.mark.parametrize(
    ("current", "new"),
    [
        (TrialStatus.TERMINATED, TrialStatus.RUNNING),
        (TrialStatus.TERMINATED, TrialStatus.ERROR),
        (TrialStatus.ERROR, TrialStatus.RUNNING),
        (TrialStatus.TERMINATED, TrialStatus.PAUSED),
    ],
)
def test_forbidden_transitions_raise_with_trial_id(current, new):
    with pytest.raises(
        InvalidTransitionError, match=f"Trial t-9 cannot go from {current.value} to {new.value}"
    ):
        check_transition("t-9", current, new)


def test_every_status_change_goes_through_the_guard():
    trial = make_trial()
    trial.set_status(TrialStatus.RUNNING)
    assert trial.start_time is not None
    trial.set_status(TrialStatus.TERMINATED)
    assert trial.end_time is not None
    with pytest.raises(InvalidTransitionError):
        trial.set_status(TrialStatus.RUNNING)
    assert trial.status == TrialStatus.TERMINATED


def test_changing_resources_while_running_raises_value_error():
    trial = make_trial(resources={"cpu": 1})
    trial.update_resources({"cpu": 2})
    assert trial.resources == Resources(cpu=2)
    trial.set_status(TrialStatus.RUNNING)
    with pytest.raises(ValueError, match="while it is RUNNING"):
        trial.update_resources({"cpu": 1})
    assert trial.resources == Resources(cpu=2)


def test_max_failures_minus_one_is_unlimited():
    trial = make_trial(max_failures=-1)
    trial.num_failures = 10_000
    assert trial.should_recover()
    bounded = make_trial(max_failures=1)
    bounded.num_failures = 1
    assert bounded.should_recover()
    bounded.num_failures = 2
    assert not bounded.should_recover()


def test_metric_analysis_tracks_min_max_last():
    trial = make_trial()
    for i, loss in enumerate([3.0, 1.0, 2.0], start=1):
        assert trial.record_result({"training_iteration": i, "loss": loss})
    stats = trial.metric_analysis["loss"]
    assert (stats.min, stats.max, stats.last) == (1.0, 3.0, 2.0)


def test_replayed_iterations_are_not_recorded_twice():
    trial = make_trial()
    for i in (1, 2, 3):
        trial.record_result({"training_iteration": i, "loss": float(i)})
    assert not trial.record_result({"training_iteration": 2, "loss": 99.0})
    assert trial.metric_analysis["loss"].max == 3.0
    assert trial.record_result({"training_iteration": 4, "loss": 0.5})


def test_should_checkpoint_follows_checkpoint_freq():
    trial = make_trial(checkpoint_freq=2)
    trial.record_result({"training_iteration": 1})
    assert not trial.should_checkpoint()
    trial.record_result({"training_iteration": 2})
    assert trial.should_checkpoint()
    assert not make_trial().should_checkpoint()


def test_json_state_round_trip():
    trial = make_trial(
        resources={"cpu": 0.5, "gpu": 0.25, "custom_resources": {"a": 1}},
        stopping_criterion={"training_iteration": 3},
        checkpoint_freq=1,
        checkpoint_at_end=True,
        keep_checkpoints_num=2,
        checkpoint_score_attr="min-loss",
        max_failures=3,
        restore_path="/tmp/x",
    )
    trial.set_status(TrialStatus.RUNNING)
    trial.record_result({"training_iteration": 1, "loss": 0.5, "blob": object()})
    state = json.loads(json.dumps(trial.to_json_state()))
    back = Trial.from_json_state(state)
    assert back.to_json_state() == state
    assert back.resources == trial.resources
    assert back.metric_analysis["loss"].last == 0.5
    assert back.should_stop({"training_iteration": 3})


@pytest.mark.parametrize("name", ["../etc", "a/b", "", ".hidden", "x" * 200, "a..b"])
def test_path_traversal_in_ids_is_refused(name):
    with pytest.raises(ValueError, match="not a valid name"):
        make_trial(trial_id=name)
    with pytest.raises(ValueError, match="not a valid name"):
        make_trial(experiment_name=name)


def test_non_json_config_is_refused_naming_the_trial():
    with pytest.raises(ValueError, match="Trial t-1: config is not JSON-serialisable"):
        Trial("tests.trainables:counting", {"fn": object()}, trial_id="t-1")


def test_nan_metrics_do_not_break_analysis():
    trial = make_trial()
    trial.record_result({"training_iteration": 1, "loss": math.nan})
    assert math.isnan(trial.metric_analysis["loss"].last)
