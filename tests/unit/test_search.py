from __future__ import annotations

import math

import pytest

from airflow_trials.core.search import (
    choice,
    generate_configs,
    grid_search,
    loguniform,
    randint,
    uniform,
)


def test_grid_times_samples_with_random_domains_in_bounds():
    space = {"lr": loguniform(1e-4, 1e-1), "layers": grid_search([1, 2]), "opt": {"name": choice(["sgd", "adam"]),
             "momentum": uniform(0.5, 0.9)}, "batch": randint(16, 64), "fixed": 3}
    configs = generate_configs(space, num_samples=3, seed=7)
    assert len(configs) == 6
    assert [c["layers"] for c in configs] == [1, 2] * 3
    for c in configs:
        assert 1e-4 <= c["lr"] <= 1e-1 and c["opt"]["name"] in ("sgd", "adam")
        assert 0.5 <= c["opt"]["momentum"] <= 0.9 and 16 <= c["batch"] < 64 and c["fixed"] == 3
    assert len({c["lr"] for c in configs}) == 6


def test_same_seed_same_configs_other_seed_other_configs():
    space = {"x": uniform(0, 1)}
    assert generate_configs(space, 4, seed=1) == generate_configs(space, 4, seed=1)
    assert generate_configs(space, 4, seed=1) != generate_configs(space, 4, seed=2)


def test_loguniform_samples_the_logarithm():
    values = [c["x"] for c in generate_configs({"x": loguniform(1e-6, 1)}, 400, seed=0)]
    below = sum(v < 1e-3 for v in values)
    assert 120 < below < 280  # half the log range lies below 1e-3
    assert all(v > 0 for v in values) and not any(math.isnan(v) for v in values)


@pytest.mark.parametrize(
    ("space", "message"),
    [
        ({"lr": {"uniform": [1]}}, "key 'lr' \\(uniform\\) needs \\[lower, upper\\]"),
        ({"lr": {"uniform": [2, 1]}}, "needs lower < upper"),
        ({"lr": {"loguniform": [0, 1]}}, "needs lower > 0"),
        ({"n": {"randint": [1.5, 4]}}, "whole-number bounds"),
        ({"opt": {"name": {"choice": []}}}, "key 'opt.name' \\(choice\\) needs a non-empty list"),
        ([1, 2], "must be a dict"),
    ],
)
def test_malformed_spaces_name_the_key(space, message):
    with pytest.raises(ValueError, match=message):
        generate_configs(space, 1, seed=0)


def test_num_samples_must_be_positive():
    with pytest.raises(ValueError, match="num_samples"):
        generate_configs({"x": 1}, 0)
