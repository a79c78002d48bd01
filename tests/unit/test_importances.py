"""Hyperparameter importances: the trials' configs and values as Optuna's evaluators read them
(core/importances.py), and the ranking PED-ANOVA and fANOVA give (searchers/optuna_importances.py)
on synthetic runs whose driving parameter is known."""

from __future__ import annotations

import math
import random
import sys

import pytest

from airflow_trials.core.importances import (
    EvaluatorUnavailableError,
    NotEnoughTrialsError,
    check_evaluator,
    flatten_config,
    prepare_importances,
)
from airflow_trials.searchers.optuna_importances import evaluate_importances

SUBJECT = "run r1 (id 7) of experiment tune"
SPACE = {
    "lr": {"loguniform": [1e-4, 1e-1]},
    "noise": {"uniform": [0.0, 1.0]},
    "act": {"choice": ["relu", "tanh", "gelu"]},
    "layers": {"randint": [1, 9]},
}


def synthetic_run(num_trials: int, seed: int = 0, mode: str = "min"):
    """Configs where lr alone drives the loss (best at lr = 10**-2.5); noise, act and layers are
    drawn but change nothing beyond a little jitter. Every 10th trial failed (no value)."""
    rng = random.Random(seed)
    configs, values = [], []
    for i in range(num_trials):
        config = {
            "lr": 10 ** rng.uniform(-4, -1),
            "noise": rng.random(),
            "act": rng.choice(["relu", "tanh", "gelu"]),
            "layers": rng.randint(1, 8),
            "epochs": 10,  # the same in every trial
        }
        loss = abs(math.log10(config["lr"]) + 2.5) + 0.01 * rng.random()
        configs.append(config)
        values.append(None if i % 10 == 9 else (loss if mode == "min" else -loss))
    return configs, values


@pytest.mark.parametrize("evaluator", ["ped-anova", "fanova"])
@pytest.mark.parametrize("mode", ["min", "max"])
def test_the_parameter_that_drives_the_metric_ranks_first(evaluator, mode):
    configs, values = synthetic_run(80, mode=mode)
    data = prepare_importances(
        configs, values, metric="loss", mode=mode, subject=SUBJECT, search_space=SPACE
    )
    found = evaluate_importances(data, evaluator)

    names = [p.name for p in found.params]
    assert names[0] == "lr"
    assert sorted(names) == ["act", "layers", "lr", "noise"]
    shares = [p.importance for p in found.params]
    assert shares == sorted(shares, reverse=True)
    assert sum(shares) == pytest.approx(1.0)
    assert shares[0] > 0.6 and shares[0] > 3 * shares[1]  # far ahead of the noise
    assert (found.num_trials, found.num_skipped, found.constant) == (72, 8, ["epochs"])
    assert (found.metric, found.mode, found.evaluator) == ("loss", mode, evaluator)


def test_the_mode_decides_which_end_of_the_values_is_explained():
    """PED-ANOVA compares the best 10% with all trials. Here act=gelu lifts a trial's value and
    noise < 0.1 sinks it: maximized, the best trials are the gelu ones (act explains them);
    minimized, the best are those with little noise (noise explains them)."""
    rng = random.Random(3)
    configs, values = [], []
    for _ in range(100):
        config = {"act": rng.choice(["relu", "tanh", "gelu"]), "noise": rng.random()}
        configs.append(config)
        lift = 1.0 if config["act"] == "gelu" else 0.0
        sink = 1.0 if config["noise"] < 0.1 else 0.0
        values.append(lift - sink + 0.01 * rng.random())
    ranked = {
        mode: [
            p.name
            for p in evaluate_importances(
                prepare_importances(configs, values, metric="acc", mode=mode, subject=SUBJECT)
            ).params
        ]
        for mode in ("max", "min")
    }
    assert ranked == {"max": ["act", "noise"], "min": ["noise", "act"]}


def test_too_few_trials_say_how_many_there_are_and_how_many_are_needed():
    configs, _ = synthetic_run(3)
    with pytest.raises(NotEnoughTrialsError) as caught:
        prepare_importances(
            configs, [0.5, None, float("nan")], metric="loss", mode="min", subject=SUBJECT
        )
    message = str(caught.value)
    assert SUBJECT in message and "loss" in message
    assert "1 of its 3 trials reported loss" in message and "2 without it" in message
    assert "at least 2" in message
    assert "\n" not in message  # the CLI prints a message's first line only

    with pytest.raises(NotEnoughTrialsError, match="0 of its 0 trials"):
        prepare_importances([], [], metric="loss", mode="min", subject=SUBJECT)


def test_no_varying_parameter_or_one_value_for_all_is_nothing_to_rank():
    same = [{"lr": 0.1, "opt": {"m": 0.9}}] * 4
    with pytest.raises(NotEnoughTrialsError, match=r"no hyperparameter varies .* \(lr, opt/m"):
        prepare_importances(same, [0.1, 0.2, 0.3, 0.4], metric="loss", mode="min", subject="r")
    with pytest.raises(NotEnoughTrialsError, match=r"the same value \(0\.5\)"):
        prepare_importances(
            [{"lr": 0.1}, {"lr": 0.2}], [0.5, 0.5], metric="loss", mode="min", subject="r"
        )


def test_the_recorded_search_space_gives_the_distributions():
    configs, values = synthetic_run(30)
    data = prepare_importances(
        configs, values, metric="loss", mode="min", subject=SUBJECT, search_space=SPACE
    )
    lr, noise, act, layers = (data.params[k] for k in ("lr", "noise", "act", "layers"))
    assert (lr.kind, lr.low, lr.high, lr.log, lr.from_search_space) == (
        "float",
        1e-4,
        1e-1,
        True,
        True,
    )
    assert (noise.kind, noise.low, noise.high, noise.log) == ("float", 0.0, 1.0, False)
    assert act.kind == "categorical" and act.choices == ("relu", "tanh", "gelu")
    # Ray Tune's randint(1, 9) never gives 9: integers 1 to 8.
    assert (layers.kind, layers.low, layers.high, layers.log) == ("int", 1, 8, False)
    assert "epochs" not in data.params and data.constant == ["epochs"]


def test_without_a_search_space_the_values_decide():
    rng = random.Random(1)
    configs = [
        {
            "lr": 10 ** rng.uniform(-5, -1),  # log-uniform over four decades
            "dropout": rng.uniform(0.0, 1.0),  # its smallest draw is tiny, but it is linear
            "layers": rng.randint(1, 8),
            "opt": {"name": rng.choice(["adam", "sgd"]), "nesterov": rng.random() < 0.5},
            "size": rng.choice([1, True, "1"]),  # Optuna would take 1 for True
        }
        for _ in range(200)
    ]
    values = [rng.random() for _ in configs]
    data = prepare_importances(configs, values, metric="loss", mode="min", subject=SUBJECT)
    params = data.params
    assert sorted(params) == ["dropout", "layers", "lr", "opt/name", "opt/nesterov", "size"]
    assert (params["lr"].kind, params["lr"].log) == ("float", True)
    assert (params["dropout"].kind, params["dropout"].log) == ("float", False)
    assert params["dropout"].low < 0.01  # the span alone would have said log
    assert (params["layers"].kind, params["layers"].low, params["layers"].high) == ("int", 1, 8)
    assert params["opt/name"].choices == ("adam", "sgd")
    assert params["opt/nesterov"].choices == (False, True)
    assert params["size"].json_choices and set(params["size"].choices) == {"1", "true", '"1"'}
    assert not any(spec.from_search_space for spec in params.values())
    # Each point holds the values as its distribution does: Optuna accepts every one.
    found = evaluate_importances(data)
    assert sorted(p.name for p in found.params) == sorted(params)


def test_a_choice_of_dicts_is_one_parameter_not_nested_keys():
    space = {"opt": {"choice": [{"name": "adam"}, {"name": "sgd", "m": 0.9}]}, "wd": {"w": 1}}
    config = {"opt": {"name": "sgd", "m": 0.9}, "wd": {"w": 2}}
    assert flatten_config(config, space) == {"opt": {"name": "sgd", "m": 0.9}, "wd/w": 2}
    configs = [{"opt": {"name": "adam"}}, {"opt": {"name": "sgd", "m": 0.9}}]
    data = prepare_importances(
        configs, [1.0, 2.0], metric="loss", mode="min", subject="r", search_space=space
    )
    assert data.params["opt"].choices == ('{"name": "adam"}', '{"m": 0.9, "name": "sgd"}')


def test_a_conditional_parameter_is_ranked_by_ped_anova_and_named_by_fanova():
    rng = random.Random(5)
    configs, values = [], []
    for _ in range(60):
        config = {"lr": 10 ** rng.uniform(-4, -1), "noise": rng.random()}
        if rng.random() < 0.5:
            config["momentum"] = rng.random()  # only some trials have it
        configs.append(config)
        values.append(abs(math.log10(config["lr"]) + 2.5))
    data = prepare_importances(configs, values, metric="loss", mode="min", subject=SUBJECT)
    ped = evaluate_importances(data, "ped-anova")
    assert [p.name for p in ped.params][0] == "lr" and len(ped.params) == 3
    fanova = evaluate_importances(data, "fanova")
    assert sorted(p.name for p in fanova.params) == ["lr", "noise"]
    assert "fanova leaves out the parameters some trials lack: momentum." in fanova.notes


def test_fanova_without_scikit_learn_says_how_to_install_it(monkeypatch):
    configs, values = synthetic_run(20)
    data = prepare_importances(configs, values, metric="loss", mode="min", subject=SUBJECT)
    monkeypatch.setitem(sys.modules, "sklearn", None)  # as if it were not installed
    with pytest.raises(EvaluatorUnavailableError) as caught:
        evaluate_importances(data, "fanova")
    message = str(caught.value)
    assert "fANOVA needs scikit-learn" in message and "pip install 'scikit-learn>=1.5'" in message
    assert "ped-anova" in message
    assert evaluate_importances(data, "ped-anova").params  # the default needs nothing more


def test_an_unknown_evaluator_lists_the_known_ones():
    assert check_evaluator("fanova") == "fanova"
    with pytest.raises(ValueError, match="use one of ped-anova, fanova"):
        check_evaluator("shap")


def test_configs_and_values_must_pair_up():
    with pytest.raises(ValueError, match="2 configs but 1 values"):
        prepare_importances([{}, {}], [1.0], metric="loss", mode="min", subject="r")
    with pytest.raises(ValueError, match="mode must be 'min' or 'max'"):
        prepare_importances([{}], [1.0], metric="loss", mode="best", subject="r")
