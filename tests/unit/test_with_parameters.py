"""with_parameters without a cluster: the bundle, the trial's state, and the in-process actor."""

from __future__ import annotations

import json

import pytest

from airflow_trials import TrainableNotFoundError, Trial, with_parameters
from airflow_trials.core.parameters import refuse_in_airflow
from airflow_trials.execution.parameter_refs import parameter_refs
from airflow_trials.execution.trainable_api import check_accepts_parameters, load_trainable
from airflow_trials.execution.worker.actor import TrialActor


def test_each_constant_is_put_once_however_many_trials_share_it():
    puts = []
    bundle = with_parameters("tests.trainables:with_array", data=[1.0, 2.0], extra="x")

    def put(value):
        puts.append(value)
        return f"ref-{len(puts)}"

    assert bundle.references(put) == {"data": "ref-1", "extra": "ref-2"}
    assert bundle.references(put) == {"data": "ref-1", "extra": "ref-2"}
    assert puts == [[1.0, 2.0], "x"]


def test_a_trial_keeps_the_path_and_the_names_never_the_values():
    big = list(range(100_000))
    trial = Trial(
        with_parameters("tests.trainables:with_array", data=big), {"scale": 2.0}, trial_id="t1"
    )
    assert trial.trainable == "tests.trainables:with_array" and trial.config == {"scale": 2.0}
    state = trial.to_json_state()
    assert state["trainable_parameters"] == ["data"] and len(json.dumps(state)) < 2_000
    back = Trial.from_json_state(json.loads(json.dumps(state)))
    assert back.parameter_names == ("data",) and back.trainable_parameters is None


def test_a_resumed_trial_without_its_constants_names_the_fix():
    trial = Trial(
        with_parameters("tests.trainables:with_array", data=[1]), trial_id="t1", experiment_name="e"
    )
    resumed = Trial.from_json_state(trial.to_json_state())
    with pytest.raises(
        TrainableNotFoundError,
        match=r"Trial t1 of experiment e: .* took with_parameters "
        r"constants \(data\), .* not saved .* Re-create it with Trial\(with_parameters\(",
    ):
        parameter_refs(resumed)


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "message"),
    [
        ((None,), {"data": 1}, TypeError, "takes the trainable's import path first"),
        (("pkg.mod:fn",), {"config": 1}, ValueError, r"\['config'\] cannot be keyword arguments"),
        (("pkg.mod:fn",), {"trial_id": 1}, ValueError, "'config' and 'trial_id' are taken"),
    ],
)
def test_with_parameters_refuses_what_cannot_reach_the_trainable(args, kwargs, error, message):
    with pytest.raises(error, match=message):
        with_parameters(*args, **kwargs)


@pytest.mark.parametrize(
    ("path", "names", "message"),
    [
        (
            "tests.trainables:counting",
            ("data",),
            r"'tests.trainables:counting' does not take the with_parameters "
            r"constants data .* define it as \(config, data\)",
        ),
        (
            "tests.trainables:WithArray",
            ("data", "nope"),
            r"define its setup as \(self, config, data, nope\)",
        ),
    ],
)
def test_a_trainable_that_cannot_take_the_constants_is_refused_before_it_starts(
    path, names, message
):
    with pytest.raises(TrainableNotFoundError, match=message):
        check_accepts_parameters(load_trainable(path), path, names)
    check_accepts_parameters(load_trainable("tests.trainables:WithArray"), path, ("data", "offset"))


def test_an_airflow_task_refuses_a_bundle_and_says_why_and_what_to_do():
    refuse_in_airflow("pkg.train:fn", "Experiment e")
    with pytest.raises(TypeError) as info:
        refuse_in_airflow(with_parameters("pkg.train:fn", data=1), "Experiment e")
    assert str(info.value).startswith(
        "Experiment e: with_parameters('pkg.train:fn', data) works only with TrialRunner"
    )
    assert "Pass the import path 'pkg.train:fn' and load the data inside the trainable" in str(
        info.value
    )


@pytest.mark.parametrize(
    ("trainable", "expected"),
    [
        ("tests.trainables:with_array", {"total": 6.0, "length": 3}),
        ("tests.trainables:WithArray", {"total": 16.0}),
    ],
)
def test_the_actor_passes_the_constants_as_keywords(storage, trainable, expected):
    import numpy as np

    parameters = {"data": np.array([1.0, 2.0, 3.0])}
    if trainable.endswith("WithArray"):
        parameters["offset"] = 10.0
    spec = {
        "trial_id": "t1",
        "experiment_name": "unit",
        "trainable": trainable,
        "config": {"scale": 1.0},
        "parameters": parameters,
    }
    actor = TrialActor(spec, storage, storage, capture_output=False)
    try:
        result = actor.train()
    finally:
        actor.stop()
    assert {k: result[k] for k in expected} == expected
