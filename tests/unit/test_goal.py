"""core/goal.py: the run's goal resolved once from the experiment's record and a reader's
override; a metric that is not the experiment's must come with a mode (issue 48)."""

from __future__ import annotations

import pytest

from airflow_trials.core.goal import (
    API_FLAGS,
    CLI_FLAGS,
    PYTHON_FLAGS,
    Goal,
    GoalError,
    ModeNeeded,
)
from airflow_trials.core.pareto import encode_metrics


def test_one_recorded_metric():
    goal = Goal.recorded("val_loss", "min", ["latency <= 5.0"])
    assert (goal.metrics, goal.modes, goal.constraints) == (
        ("val_loss",),
        ("min",),
        ("latency <= 5.0",),
    )
    assert not goal.several and (goal.metric, goal.mode) == ("val_loss", "min")


def test_several_recorded_metrics_as_the_trials_db_stores_them():
    goal = Goal.recorded(*encode_metrics(["val_acc", "latency"], ["max", "min"]))
    assert goal.several and goal.metrics == ("val_acc", "latency") and goal.modes == ("max", "min")
    assert goal.describe() == "max val_acc, min latency"
    assert goal.first() == Goal(("val_acc",), ("max",))


def test_none_recorded():
    goal = Goal.recorded(None, None)
    assert goal.metric is None and goal.pick(None, None) == goal


def test_the_experiment_s_own_metric_keeps_its_mode():
    assert Goal.recorded("val_loss", "min").pick("val_loss", None).mode == "min"
    several = Goal.recorded(*encode_metrics(["val_acc", "latency"], ["max", "min"]))
    assert several.pick("latency", None) == Goal(("latency",), ("min",))
    assert several.pick("val_acc", None) == Goal(("val_acc",), ("max",))


def test_a_mode_given_wins():
    assert Goal.recorded("val_loss", "min").pick("val_acc", "max") == Goal(("val_acc",), ("max",))
    assert Goal.recorded("val_loss", "min").pick(None, "max") == Goal(("val_loss",), ("max",))
    assert Goal.recorded("val_loss", None).pick(None, None).mode == "min"
    assert Goal.recorded("val_loss", None).pick("val_loss", None).modes == (None,)


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (CLI_FLAGS, "pass --mode min or --mode max with --metric val_acc."),
        (API_FLAGS, "pass ?mode=min or ?mode=max with ?metric=val_acc."),
        (PYTHON_FLAGS, "pass mode='min' or mode='max' with metric='val_acc'."),
    ],
)
def test_another_metric_without_mode_is_refused_naming_mode(flags, says):
    with pytest.raises(ModeNeeded) as refused:
        Goal.recorded("val_loss", "min").pick("val_acc", None, flags)
    message = str(refused.value)
    assert "\n" not in message and message.endswith(says)
    assert "records (min val_loss)" in message


def test_a_metric_not_among_several_and_none_recorded_are_refused_too():
    several = Goal.recorded(*encode_metrics(["val_acc", "latency"], ["max", "min"]))
    with pytest.raises(ModeNeeded, match=r"records \(max val_acc, min latency\)"):
        several.pick("width", None)
    with pytest.raises(ModeNeeded, match=r"records \(none\)"):
        Goal.recorded(None, None).pick("val_acc", None)


def test_a_bad_mode_is_refused():
    with pytest.raises(GoalError, match="--mode must be 'min' or 'max', got 'best'"):
        Goal.recorded("val_loss", "min").pick(None, "best")
    with pytest.raises(GoalError, match="^mode must be 'min' or 'max', got 'up'"):
        Goal.recorded("val_loss", "min").pick("val_loss", "up", PYTHON_FLAGS)


def test_of_the_package_s_spelling():
    assert Goal.of("loss", "min") == Goal.recorded("loss", "min")
    assert Goal.of(["val_acc", "latency"], ["max", "min"]) == Goal.recorded(
        *encode_metrics(["val_acc", "latency"], ["max", "min"])
    )
    assert Goal.of(None, "min") == Goal((), ())
