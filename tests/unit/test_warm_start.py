"""Warm start, the pure part: WarmStart's checks, and seeding a run's first configs from an earlier
run's ranked trials against the new search space."""

from __future__ import annotations

import pytest

from airflow_trials.core.search import choice, grid_search, loguniform, randint, randn, uniform
from airflow_trials.core.warm_start import SourceTrial, WarmStart, WarmStartError, seed_configs


def ranked(*configs):
    return [
        SourceTrial(f"t{i}", config, 1.0 - i / 10, f"/ckpt/t{i}")
        for i, config in enumerate(configs)
    ]


def test_seeds_take_the_sources_tuned_values_and_the_new_spaces_constants():
    space = {
        "lr": loguniform(1e-4, 1e-1),
        "layers": randint(1, 5),
        "opt": {"name": choice(["sgd", "adam"])},
        "epochs": 20,
        "noise": randn(0, 1),
    }
    source = ranked(
        {"lr": 0.01, "layers": 3, "opt": {"name": "adam"}, "epochs": 10, "noise": 5.0},
        {"lr": 0.02, "layers": 2, "opt": {"name": "sgd"}, "epochs": 10, "noise": -1.0},
        {"lr": 0.03, "layers": 1, "opt": {"name": "sgd"}, "epochs": 10, "noise": 0.0},
    )
    seeds, skipped = seed_configs(space, "night1", source, top_k=2)
    assert skipped == []
    assert [config for config, _ in seeds] == [
        {"lr": 0.01, "layers": 3, "opt": {"name": "adam"}, "epochs": 20, "noise": 5.0},
        {"lr": 0.02, "layers": 2, "opt": {"name": "sgd"}, "epochs": 20, "noise": -1.0},
    ]
    assert [trial.trial_id for _, trial in seeds] == ["t0", "t1"]


def test_a_source_trial_outside_the_new_space_is_skipped_with_a_note_and_the_next_one_taken():
    space = {"lr": uniform(0.0, 0.5), "layers": randint(1, 4), "act": grid_search(["relu", "tanh"])}
    source = ranked(
        {"lr": 0.9, "layers": 2, "act": "relu"},  # lr above the new bound
        {"lr": 0.1, "layers": 4, "act": "relu"},  # randint's upper bound is exclusive
        {"lr": 0.1, "layers": 3, "act": "gelu"},  # no longer a grid value
        {"lr": 0.2, "layers": 1, "act": "tanh"},
    )
    seeds, skipped = seed_configs(space, "night1", source, top_k=3)
    assert [trial.trial_id for _, trial in seeds] == ["t3"]
    assert skipped == [
        "trial t0 of run night1: lr=0.9 is outside {'uniform': [0.0, 0.5]}",
        "trial t1 of run night1: layers=4 is outside {'randint': [1, 4]}",
        "trial t2 of run night1: act='gelu' is outside {'grid_search': ['relu', 'tanh']}",
    ]


def test_a_space_that_changed_is_refused_naming_the_parameter_and_the_fix():
    space = {"lr": uniform(0.0, 1.0), "momentum": uniform(0.0, 1.0)}
    with pytest.raises(
        WarmStartError,
        match=r"tunes \['momentum'\], which run night1's trials never had .* "
        r"warm-start from a run of this search space, or drop warm_start",
    ):
        seed_configs(space, "night1", ranked({"lr": 0.5}), top_k=1)
    with pytest.raises(
        WarmStartError, match="none of run night1's best trials fits this run's search space"
    ):
        seed_configs({"lr": uniform(0.0, 0.1)}, "night1", ranked({"lr": 0.5}, {"lr": 0.7}), top_k=1)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"top_k": 0}, "top_k must be a whole number >= 1, got 0"),
        ({"top_k": True}, "top_k must be a whole number >= 1, got True"),
        ({"if_missing": "ignore"}, "if_missing must be 'warn' or 'error', got 'ignore'"),
        ({"source": ""}, "source must be 'previous', 'asset' or a run key"),
        ({"dag_id": ""}, "dag_id must be a DAG id or None"),
    ],
)
def test_bad_warm_start_settings_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        WarmStart(**kwargs)


def test_warm_start_of_takes_a_source_string():
    assert WarmStart.of("previous") == WarmStart()
    assert WarmStart.of("scheduled__2026-11-23") == WarmStart(source="scheduled__2026-11-23")
    assert WarmStart.of(None) is None
    with pytest.raises(ValueError, match="warm_start must be a WarmStart"):
        WarmStart.of(3)
