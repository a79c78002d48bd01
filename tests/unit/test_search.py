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
    space = {
        "lr": loguniform(1e-4, 1e-1),
        "layers": grid_search([1, 2]),
        "opt": {"name": choice(["sgd", "adam"]), "momentum": uniform(0.5, 0.9)},
        "batch": randint(16, 64),
        "fixed": 3,
    }
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


# -- the domains Ray Tune 2.60 has beyond the first five
# --------------------------------------------

from airflow_trials.core.search import (  # noqa: E402
    lograndint,
    qlograndint,
    qloguniform,
    qrandint,
    qrandn,
    quniform,
    randn,
    sample_from,
    validate_search_space,
)


def _values(domain, n=300, seed=0):
    return [c["x"] for c in generate_configs({"x": domain}, n, seed=seed)]


def _is_multiple(value, q):
    return math.isclose(value / q, round(value / q), abs_tol=1e-9)


def test_constructors_write_plain_json():
    assert quniform(0, 1, 0.25) == {"quniform": [0, 1, 0.25]}
    assert qloguniform(1e-4, 1e-1, 5e-5) == {"qloguniform": [1e-4, 1e-1, 5e-5]}
    assert lograndint(1, 100) == {"lograndint": [1, 100]}
    assert qrandint(0, 10) == {"qrandint": [0, 10, 1]}
    assert qlograndint(1, 100, 10) == {"qlograndint": [1, 100, 10]}
    assert randn() == {"randn": [0.0, 1.0]}
    assert qrandn(0, 2, 0.5) == {"qrandn": [0, 2, 0.5]}
    assert sample_from("tests.search_functions:double_layers") == {
        "sample_from": "tests.search_functions:double_layers"
    }


@pytest.mark.parametrize(
    ("domain", "expected"),
    [
        # Quantization rounds to the nearest multiple, so the upper bound is inclusive.
        (quniform(0, 1, 0.25), {0.0, 0.25, 0.5, 0.75, 1.0}),
        (qloguniform(0.5, 2.0, 0.5), {0.5, 1.0, 1.5, 2.0}),
        # Integer quantization: multiples of q between the bounds rounded inwards, upper
        # inclusive...
        (qrandint(1, 10, 3), {3, 6, 9}),
        (qlograndint(1, 100, 10), {10, 20, 30, 40, 50, 60, 70, 80, 90, 100}),
        # ...except for q == 1, where it is randint / lograndint (upper exclusive).
        (qrandint(0, 5), {0, 1, 2, 3, 4}),
        (qlograndint(1, 5, 1), {1, 2, 3, 4}),
        (lograndint(3, 6), {3, 4, 5}),
    ],
)
def test_quantized_and_integer_domains_take_exactly_ray_tunes_values(domain, expected):
    values = _values(domain, n=400)
    assert set(values) == expected  # 400 draws over at most 10 values: every one appears
    kind = next(iter(domain))
    assert all(type(v) is (int if "randint" in kind else float) for v in values)


def test_lograndint_stays_in_bounds_with_the_upper_bound_exclusive():
    values = _values(lograndint(1, 1000), n=500)
    assert all(type(v) is int and 1 <= v < 1000 for v in values)
    assert sum(v < 32 for v in values) > 150  # half the log range lies below sqrt(1000)


def test_quantized_floats_are_multiples_of_q_within_the_bounds():
    for domain, (lower, upper, q) in [
        (quniform(-1.5, 3.0, 0.5), (-1.5, 3.0, 0.5)),
        (qloguniform(1e-4, 1e-1, 5e-5), (1e-4, 1e-1, 5e-5)),
    ]:
        values = _values(domain)
        assert all(lower - 1e-12 <= v <= upper + 1e-12 and _is_multiple(v, q) for v in values)


def test_randn_and_qrandn():
    values = _values(randn(10.0, 2.0), n=400)
    assert all(type(v) is float for v in values)
    assert 9.0 < sum(values) / len(values) < 11.0  # standard error 0.1: ten of them away
    assert 100 < sum(v > 10.0 for v in values) < 300
    assert all(_is_multiple(v, 0.5) for v in _values(qrandn(0.0, 3.0, 0.5)))


@pytest.mark.parametrize(
    "domain",
    [
        quniform(0, 10, 0.5),
        qloguniform(1, 64, 1),
        lograndint(1, 50),
        qrandint(0, 100, 7),
        qlograndint(2, 200, 2),
        randn(),
        qrandn(1.0, 2.0, 0.1),
    ],
)
def test_every_new_domain_is_reproducible_per_seed(domain):
    assert _values(domain, 20, seed=3) == _values(domain, 20, seed=3)
    assert _values(domain, 20, seed=3) != _values(domain, 20, seed=4)


def test_a_seed_still_gives_the_configs_it_gave_before_the_new_domains():
    # Stored experiment runs record their seed: the same seed must keep giving the same configs.
    old = {
        "lr": loguniform(1e-4, 1e-1),
        "n": randint(1, 9),
        "m": uniform(0, 1),
        "c": choice(list("abc")),
        "g": grid_search([1, 2]),
    }
    assert generate_configs(old, 2, seed=11) == [
        {"lr": 0.0022758239345465406, "n": 8, "m": 0.45183232059956535, "c": "c", "g": 1},
        {"lr": 0.0003712838800106654, "n": 8, "m": 0.6298827202168019, "c": "a", "g": 2},
        {"lr": 0.00019158891091426583, "n": 5, "m": 0.14179512925945614, "c": "c", "g": 1},
        {"lr": 0.026849339294740086, "n": 1, "m": 0.5954365058406696, "c": "b", "g": 2},
    ]
    # sample_from functions draw from a stream of their own: adding one changes no other value.
    with_function = generate_configs(
        {**old, "z": sample_from("tests.search_functions:units_for_depth"), "model": {"depth": 1}},
        2,
        seed=11,
    )
    assert [{k: c[k] for k in old} for c in with_function] == generate_configs(old, 2, seed=11)


@pytest.mark.parametrize(
    ("space", "message"),
    [
        ({"x": {"quniform": [0, 1]}}, r"key 'x' \(quniform\) needs \[lower, upper, q\] numbers"),
        ({"x": {"quniform": [0, 1, 0]}}, "needs a quantization step q > 0, got 0"),
        ({"x": {"qrandn": [0, 1, -0.5]}}, "needs a quantization step q > 0, got -0.5"),
        (
            {"x": {"quniform": [0.1, 1, 0.25]}},
            r"bounds that are multiples of q=0.25 \(as Ray Tune\), but lower is 0.1",
        ),
        ({"x": {"qloguniform": [0, 1, 0.5]}}, "needs lower > 0"),
        ({"x": {"qloguniform": [1, 1, 0.5]}}, "needs lower < upper"),
        ({"x": {"lograndint": [0, 10]}}, "needs lower > 0"),
        ({"x": {"lograndint": [1, 10.5]}}, "whole-number bounds"),
        ({"x": {"qlograndint": [-1, 10, 2]}}, "needs lower > 0"),
        ({"x": {"qrandint": [0, 10, 2.5]}}, "needs a whole-number q >= 1"),
        ({"x": {"qrandint": [1, 4, 5]}}, "has no multiple of q=5 between 1 and 4"),
        ({"x": {"randn": [0, 0]}}, "needs a standard deviation sd > 0, got 0"),
        ({"x": {"randn": [0, -1]}}, "sd > 0"),
        ({"x": {"randn": [float("nan"), 1]}}, r"needs finite values \(not NaN or infinity\)"),
        ({"x": {"qrandn": [0, 1]}}, r"needs \[mean, sd, q\] numbers"),
        ({"x": {"randn": [0, True]}}, r"needs \[mean, sd\] numbers"),
    ],
)
def test_malformed_new_domains_name_the_key_and_the_rule(space, message):
    with pytest.raises(ValueError, match=message):
        generate_configs(space, 1, seed=0)


# -- sample_from ----------------------------------------------------------------------------------


def test_sample_from_sees_the_sampled_config_and_its_seeded_rng():
    space = {
        "layers": grid_search([1, 2]),
        "model": {
            "depth": randint(1, 4),
            "units": sample_from("tests.search_functions:units_for_depth"),
        },
        "width": sample_from("tests.search_functions:double_layers"),
        "fixed": "a",
    }
    configs = generate_configs(space, 4, seed=5)
    assert configs == generate_configs(space, 4, seed=5)
    for c in configs:
        assert c["width"] == 2 * c["layers"]
        assert c["model"]["units"] in {d * c["model"]["depth"] for d in (16, 32, 64)}
        assert list(c) == ["layers", "model", "width", "fixed"] and list(c["model"]) == [
            "depth",
            "units",
        ]
    assert len({c["model"]["units"] for c in generate_configs(space, 30, seed=5)}) > 1


def test_a_sample_from_function_sees_only_the_sample_from_keys_before_it():
    space = {
        "a": sample_from("tests.search_functions:seen_keys"),
        "b": 1,
        "c": sample_from("tests.search_functions:seen_keys"),
        "d": uniform(0, 1),
    }
    config = generate_configs(space, 1, seed=0)[0]
    assert config["a"] == ["b", "d"] and config["c"] == ["a", "b", "d"]


def test_a_sample_from_function_may_take_no_argument_as_in_ray_tune():
    assert (
        generate_configs({"x": sample_from("tests.search_functions:no_args")}, 2)
        == [{"x": "constant"}] * 2
    )


@pytest.mark.parametrize(
    ("path", "message"),
    [
        (
            "tests.no_such_module:f",
            r"key 'x' \(sample_from\): Cannot import module 'tests.no_such_module'",
        ),
        ("tests.search_functions:nope", "has no attribute 'nope'"),
        ("tests.search_functions:NOT_CALLABLE", "is int 3, not a function of the config"),
        (
            "tests.search_functions:two_positional",
            r"must take the config as its one positional argument",
        ),
        ("nocolon", "is not of the form 'package.module:name'"),
        (["tests.search_functions:no_args"], "path must be a non-empty string"),
    ],
)
def test_a_sample_from_path_that_does_not_resolve_fails_validation(path, message):
    with pytest.raises(ValueError, match=message):
        validate_search_space({"x": {"sample_from": path}})


def test_parsing_a_dag_checks_the_path_form_without_importing_it():
    validate_search_space({"x": sample_from("tests.no_such_module:f")}, import_functions=False)
    with pytest.raises(ValueError, match="needs an import path 'package.module:function'"):
        validate_search_space({"x": {"sample_from": "nocolon"}}, import_functions=False)


@pytest.mark.parametrize(
    ("path", "message"),
    [
        (
            "tests.search_functions:raises",
            r"key 'x' \(sample_from 'tests.search_functions:raises'\): "
            r"the function raised KeyError: 'missing'",
        ),
        ("tests.search_functions:not_json", "returned set {1, 2}, which is not JSON"),
    ],
)
def test_a_failing_sample_from_function_is_named(path, message):
    with pytest.raises(ValueError, match=message):
        generate_configs({"x": sample_from(path), "y": 1}, 1, seed=0)


def test_sample_from_refuses_a_lambda_and_names_the_fix():
    with pytest.raises(TypeError, match="define the function in a module and pass its path"):
        sample_from(lambda config: 1)
