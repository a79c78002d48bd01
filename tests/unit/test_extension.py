"""The rules of extending a finished run (core/run_extension.py): each refusal names the run, the
cause and the fix; which trials continue; how ASHA's rungs extend."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import pytest

from airflow_trials import ASHAScheduler
from airflow_trials.core.fate import CRITERION_MET, TRAINABLE_FINISHED
from airflow_trials.core.run_extension import (
    describe_new_samples,
    extended_scheduler,
    plan_extension,
)
from airflow_trials.core.search import count_configs, grid_search, loguniform, sample_from
from airflow_trials.core.status import TrialStatus
from airflow_trials.core.stop_kind import StopKind
from airflow_trials.exceptions import ExtensionRefusedError
from airflow_trials.schedulers.asha.async_hyperband import raised_max_t, with_max_t
from airflow_trials.schedulers.asha.rung_math import max_t_stop_reason, rung_milestones

OWNER = "Run r1 (id 1) of experiment e"
#: A space that draws nothing at random: a grid of 2 x 2, and a fixed value.
GRID = {"layers": grid_search([2, 4]), "opt": {"name": grid_search(["sgd", "adam"])}, "x": 1}


@dataclass
class Stored:
    trial_id: str
    status: TrialStatus = TrialStatus.TERMINATED
    stop_reason: str | None = CRITERION_MET
    stop_kind: StopKind | None = StopKind.CRITERION
    last_result: dict[str, Any] = field(default_factory=lambda: {"training_iteration": 3})
    stopped_from_airflow: bool = False


def plan(trials, **kwargs):
    kwargs.setdefault("run_status", "SUCCESS")
    kwargs.setdefault("stop_before", {"training_iteration": 3})
    kwargs.setdefault("stop", {"training_iteration": 5})
    kwargs.setdefault("num_samples", 0)
    kwargs.setdefault("has_checkpoint", lambda trial_id: trial_id != "no-ckpt")
    return plan_extension(owner=OWNER, trials=trials, **kwargs)


def test_a_raised_stop_continues_the_terminated_trials_that_can_continue():
    trials = [
        Stored("done"),
        Stored(
            "at-max-t",
            stop_reason=max_t_stop_reason("training_iteration", 3, 3),
            stop_kind=StopKind.MAX_T,
        ),
        Stored(
            "early",
            stop_reason="stopped by ASHA at training_iteration=1 (rung 1 of 2): ...",
            stop_kind=StopKind.SCHEDULER,
        ),
        Stored("finished", stop_reason=TRAINABLE_FINISHED, stop_kind=StopKind.FINISHED),
        Stored("failed", status=TrialStatus.ERROR, stop_reason=None, stop_kind=None),
        Stored("no-ckpt"),
    ]
    decided = plan(trials)
    assert decided.continued == ["done", "at-max-t"]
    assert decided.stop_after == {"training_iteration": 5}
    kept = dict(decided.kept)
    assert "that verdict stands" in kept["early"]
    assert "nothing left to train" in kept["finished"]
    assert "ended ERROR" in kept["failed"]
    assert "no checkpoint" in kept["no-ckpt"] and "never restarted from scratch" in kept["no-ckpt"]


def test_new_samples_alone_continue_no_trial():
    decided = plan([Stored("done")], stop=None, num_samples=3)
    assert decided.continued == [] and decided.stop_after is None


@pytest.mark.parametrize(
    ("kwargs", "cause", "fix"),
    [
        ({"run_status": "RUNNING"}, "is still running", "Wait for the run"),
        ({"stop": {"training_iteration": 2}}, "lowers or drops", "at or above the run's"),
        ({"stop": {"loss": 0.1}}, "training_iteration=none \\(was 3\\)", "on every key"),
        ({"stop": {"training_iteration": 3}}, "would change nothing", "--num-samples"),
        ({"num_samples": -1}, "not a whole number", "N >= 0"),
        ({"stop": {"training_iteration": "x"}}, "not a mapping of metric names", "--stop"),
        (
            {"space_before": {"x": [1, 2]}, "space_now": {"x": [1, 3]}},
            "but the DAG now has",
            "restore the run's search space",
        ),
        (
            {"num_samples": 1, "space_before": GRID},
            r"a grid over layers, opt\.name \(4 combinations\) and draws nothing at random, so 1 "
            r"new sample\(s\) would only run the configs the run was given again",
            "wider grid or a random domain",
        ),
        (
            {"num_samples": 2, "space_before": {"lr": 0.1}, "stop": None},
            r"fixed values \(one config\)",
            "Raise --stop",
        ),
    ],
)
def test_each_refusal_names_the_run_its_cause_and_the_fix(kwargs, cause, fix):
    with pytest.raises(ExtensionRefusedError) as refused:
        plan([Stored("done")], **kwargs)
    message = str(refused.value)
    assert message.startswith(OWNER) and re.search(cause, message), message
    assert fix in message and "nothing was written" in message


@pytest.mark.parametrize(
    ("space", "said"),
    [
        (
            {**GRID, "lr": loguniform(1e-4, 1e-1)},
            "+3 samples (3 pass(es) over the grid's 4 combinations, each drawing lr afresh, as Ray "
            "Tune's num_samples does: 12 new trials)",
        ),
        ({"lr": loguniform(1e-4, 1e-1)}, "+3 samples (3 new trials)"),
        (None, "+3 samples"),
    ],
)
def test_a_new_sample_is_one_pass_over_the_grid_as_ray_tune_s_num_samples(space, said):
    """New samples of a space that draws something at random are new configs: accepted, each
    one pass over the grid (``sample_from`` may draw, so it counts); the plan says how many."""
    decided = plan([Stored("done")], stop=None, num_samples=3, space_before=space)
    assert decided.continued == []
    assert describe_new_samples(3, space) == said
    with_function = {**GRID, "units": sample_from("tests.search_functions:units_for_depth")}
    assert plan([Stored("done")], stop=None, num_samples=1, space_before=with_function)
    assert count_configs(with_function, 3) == 12


def test_a_raised_stop_alone_extends_a_grid_run():
    decided = plan([Stored("done")], num_samples=0, space_before=GRID)
    assert decided.continued == ["done"]


def test_a_trial_that_has_not_ended_refuses_the_extension_naming_it():
    with pytest.raises(ExtensionRefusedError, match="trials busy have not ended"):
        plan([Stored("done"), Stored("busy", status=TrialStatus.RUNNING)])


def test_asha_rungs_extend_to_the_raised_stop_keeping_the_lower_milestones():
    asha = ASHAScheduler(metric="score", mode="max", max_t=3, grace_period=1, reduction_factor=3)
    settings = asha.rule().to_dict()
    extended = extended_scheduler(settings, {"training_iteration": 9})
    assert extended == {**settings, "max_t": 9}
    assert extended_scheduler(settings, {"training_iteration": 2}) == settings
    assert extended_scheduler(None, {"training_iteration": 9}) is None
    before, after = rung_milestones(1, 3, 3), rung_milestones(1, 9, 3)
    assert after[-len(before) :] == before and after[0] == 9  # one new rung at the top
    assert raised_max_t(asha, {"training_iteration": 9}) == 9
    assert raised_max_t(asha, {"training_iteration": 3}) is None
    assert raised_max_t(None, {"training_iteration": 9}) is None
    raised = with_max_t(asha, 9)
    assert (raised.max_t, raised.grace_period, raised.reduction_factor) == (9, 1, 3)
    assert raised.rule().to_dict() == extended
