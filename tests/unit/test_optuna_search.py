"""OptunaSearch without Ray: the domains as Optuna distributions, and its ask-and-tell cycle."""

from __future__ import annotations

import random
import statistics

import optuna
import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import TrialState

from airflow_trials import OptunaSearch
from airflow_trials.core.domains import sample
from airflow_trials.core.search import (
    choice,
    grid_search,
    lograndint,
    loguniform,
    qlograndint,
    qloguniform,
    qrandint,
    qrandn,
    quniform,
    randint,
    randn,
    sample_from,
    uniform,
)
from airflow_trials.searchers.optuna_search import convert_search_space

CONVERSIONS = [
    (choice([1, "a", None, 2.5]), CategoricalDistribution([1, "a", None, 2.5])),
    (choice([[1, 2], {"k": 1}]), CategoricalDistribution([0, 1])),  # sampled by index
    (uniform(-1.0, 2.0), FloatDistribution(-1.0, 2.0)),
    (quniform(0.0, 1.0, 0.25), FloatDistribution(0.0, 1.0, step=0.25)),
    (loguniform(1e-4, 1e-1), FloatDistribution(1e-4, 1e-1, log=True)),
    (randint(0, 10), IntDistribution(0, 9)),
    (qrandint(1, 10, 3), IntDistribution(3, 9, step=3)),
    (qrandint(0, 10, 1), IntDistribution(0, 9)),
    (lograndint(1, 100), IntDistribution(1, 99, log=True)),
    (qlograndint(1, 100, 1), IntDistribution(1, 99, log=True)),
]


@pytest.mark.parametrize(
    ("domain", "expected"), CONVERSIONS, ids=lambda v: next(iter(v)) if isinstance(v, dict) else ""
)
def test_each_domain_becomes_the_optuna_distribution_of_the_same_values(domain, expected):
    assert convert_search_space({"p": domain}) == {"p": expected}


@pytest.mark.parametrize(
    ("domain", "expected"),
    CONVERSIONS[2:],
    ids=lambda v: next(iter(v)) if isinstance(v, dict) else "",
)
def test_every_value_our_sampler_draws_lies_in_the_distribution(domain, expected):
    # The distribution is not narrower than the domain: Optuna can suggest what generate_configs
    # can.
    (kind, arg), rng = next(iter(domain.items())), random.Random(0)
    values = [sample(kind, arg, rng) for _ in range(500)]
    assert all(expected._contains(expected.to_internal_repr(v)) for v in values)


@pytest.mark.parametrize(
    ("domain", "fix"),
    [
        (grid_search([1, 2]), "use choice(values)"),
        (randn(0.0, 1.0), "use uniform(mean - 3 * sd, mean + 3 * sd)"),
        (qrandn(0.0, 1.0, 0.5), "Optuna has no normal distribution"),
        (
            sample_from("tests.search_functions:double_layers"),
            "compute that value in the trainable",
        ),
        (qloguniform(1e-3, 1.0, 1e-3), "use loguniform(lower, upper) (no step)"),
        (qlograndint(2, 64, 2), "use lograndint(lower, upper) or qrandint(lower, upper, q)"),
    ],
    ids=["grid_search", "randn", "qrandn", "sample_from", "qloguniform", "qlograndint"],
)
def test_a_domain_optuna_cannot_sample_is_refused_naming_the_key_and_the_fix(domain, fix):
    kind = next(iter(domain))
    with pytest.raises(ValueError, match=rf"cannot search key 'model/p' \({kind}\): .*") as e:
        OptunaSearch({"model": {"p": domain}, "x": uniform(0, 1)}, metric="loss", mode="min")
    assert fix in str(e.value)


@pytest.mark.parametrize(
    ("space", "message"),
    [
        ({"x": uniform(1, 0)}, "Search space key 'x' (uniform) needs lower < upper"),
        ({"x": 1, "y": {"z": "fixed"}}, "has no domain to search, only fixed values"),
        ({"a/b": uniform(0, 1)}, "joins nested keys with '/'"),
    ],
)
def test_a_space_it_cannot_search_is_refused_when_it_is_given(space, message):
    with pytest.raises(ValueError) as e:
        OptunaSearch(space, metric="loss", mode="min")
    assert message in str(e.value)


def _run(search: OptunaSearch, n: int, objective, offset: int = 0) -> list[float]:
    values = []
    for i in range(offset, offset + n):
        config = search.suggest(f"t{i}")
        value = objective(config)
        search.on_trial_result(f"t{i}", {"loss": value, "training_iteration": 1})
        search.on_trial_complete(f"t{i}", {"loss": value, "training_iteration": 1})
        values.append(value)
    return values


def test_seeded_tpe_learns_a_quadratic_and_keeps_fixed_values():
    search = OptunaSearch(
        {"x": uniform(-5, 5), "fixed": {"a": 7}}, metric="loss", mode="min", seed=0
    )
    configs = []

    def objective(config):
        configs.append(config)
        return (config["x"] - 1.0) ** 2

    losses = _run(search, 40, objective)

    assert all(c["fixed"] == {"a": 7} and set(c) == {"x", "fixed"} for c in configs)
    first_ten = statistics.median(losses[:10])  # TPE's 10 random start-up trials
    assert min(losses) < 0.01  # |x - 1| < 0.1 in a range of width 10
    assert min(losses) < first_ten and statistics.median(losses[30:]) < first_ten
    assert search.study.best_value == min(losses)


def test_the_same_seed_suggests_the_same_configs_and_mode_max_maximises():
    def run():
        search = OptunaSearch({"x": uniform(-5, 5)}, metric="loss", mode="max", seed=3)
        return _run(search, 15, lambda c: -((c["x"] - 1.0) ** 2))

    first, again = run(), run()
    assert first == again
    assert max(first) > statistics.median(first[:10])


def test_points_to_evaluate_come_first_in_order_and_a_partial_point_is_completed():
    space = {
        "x": uniform(0, 1),
        "opt": choice([{"name": "adam"}, {"name": "sgd"}]),
        "n": {"k": randint(1, 5)},
    }
    points = [
        {"x": 0.25, "opt": {"name": "sgd"}, "n": {"k": 4}},
        {"x": 0.75, "opt": {"name": "adam"}, "n": {"k": 1}},
        {"x": 0.5},
    ]
    search = OptunaSearch(space, metric="loss", mode="min", points_to_evaluate=points, seed=0)

    configs = [search.suggest(f"t{i}") for i in range(4)]

    assert configs[:2] == points[:2]
    assert configs[2]["x"] == 0.5 and configs[2]["opt"] in ({"name": "adam"}, {"name": "sgd"})
    assert 1 <= configs[2]["n"]["k"] <= 4
    assert configs[3]["x"] not in (0.25, 0.5, 0.75)


def test_evaluated_rewards_are_finished_trials_not_suggestions():
    search = OptunaSearch(
        {"x": uniform(0, 1)},
        metric="loss",
        mode="min",
        seed=0,
        points_to_evaluate=[{"x": 0.1}, {"x": 0.9}],
        evaluated_rewards=[0.5, 0.2],
    )
    config = search.suggest("t0")

    done = search.study.trials[:2]
    assert [(t.params, t.value, t.state) for t in done] == [
        ({"x": 0.1}, 0.5, TrialState.COMPLETE),
        ({"x": 0.9}, 0.2, TrialState.COMPLETE),
    ]
    assert config["x"] not in (0.1, 0.9)
    assert search.study.best_params == {"x": 0.9}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"points_to_evaluate": [{"x": 2.0}]},
            "points_to_evaluate[0] key 'x': 2.0 is outside its domain",
        ),
        (
            {"points_to_evaluate": [{"y": 0.5}]},
            "points_to_evaluate[0] key 'y' is not in the search space",
        ),
        ({"points_to_evaluate": [{"x": 0.5}], "evaluated_rewards": [1, 2]}, "one reward per point"),
        ({"points_to_evaluate": [{"x": 0.5}], "evaluated_rewards": [1]}, "no value for ['z']"),
        (
            {"sampler": optuna.samplers.RandomSampler(seed=1), "seed": 1},
            "pass the seed to your sampler",
        ),
        ({"metric": ["a", "b"]}, "metric=['a', 'b'] is a list but mode='min' is not"),
        ({"metric": 3}, "optimises one metric, given as a string, or several"),
        ({"mode": "minimize"}, "mode must be 'min' or 'max'"),
    ],
)
def test_bad_arguments_are_refused_with_the_fix(kwargs, message):
    with pytest.raises(ValueError) as e:
        OptunaSearch(
            {"x": uniform(0, 1), "z": randint(0, 3)}, **{"metric": "loss", "mode": "min", **kwargs}
        )
    assert message in str(e.value)


def test_results_are_intermediate_values_and_the_end_tells_the_last_result_or_a_failure():
    search = OptunaSearch({"x": uniform(0, 1)}, metric="loss", mode="min", seed=0)
    for trial_id in ("ok", "failed", "never-reported"):
        search.suggest(trial_id)
    for i, loss in enumerate([0.9, 0.4, 0.6], start=1):
        search.on_trial_result("ok", {"loss": loss, "training_iteration": i})
    search.on_trial_result("failed", {"loss": 0.1, "training_iteration": 1})

    search.on_trial_complete("ok", {"loss": 0.6, "training_iteration": 3})
    search.on_trial_complete("failed", error=True)
    search.on_trial_complete("never-reported")
    search.on_trial_complete("ok", {"loss": 0.0})  # a second end is ignored

    ok, failed, pruned = search.study.trials
    assert (ok.state, ok.value, ok.intermediate_values) == (
        TrialState.COMPLETE,
        0.6,
        {1: 0.9, 2: 0.4, 3: 0.6},
    )
    assert (failed.state, failed.value) == (TrialState.FAIL, None)
    assert pruned.state == TrialState.PRUNED


def test_a_result_without_the_metric_is_an_error_naming_it():
    search = OptunaSearch({"x": uniform(0, 1)}, metric="loss", mode="min")
    search.suggest("t1")
    with pytest.raises(
        ValueError,
        match=r"Trial t1 reported a result without 'loss'.*\['acc', 'training_iteration'\]",
    ):
        search.on_trial_result("t1", {"acc": 0.5, "training_iteration": 1})
    with pytest.raises(ValueError, match="did not suggest trial t2"):
        search.on_trial_complete("t2", {"loss": 0.5})


def test_set_search_properties_gives_a_searcher_its_space_once():
    search = OptunaSearch(seed=0)
    with pytest.raises(ValueError, match="has no search space; pass space="):
        search.suggest("t0")

    assert search.set_search_properties("score", "max", {"x": uniform(0, 1), "tag": "a"}) is True
    assert search.set_search_properties("loss", "min", {"y": uniform(0, 1)}) is False

    assert (search.metric, search.mode) == ("score", "max")
    assert set(search.suggest("t0")) == {"x", "tag"}
    assert search.study.direction == optuna.study.StudyDirection.MAXIMIZE


def test_without_metric_or_mode_it_says_what_to_pass():
    search = OptunaSearch({"x": uniform(0, 1)}, metric="loss")
    with pytest.raises(
        ValueError, match=r"needs a metric and a mode, got metric='loss', mode=None"
    ):
        search.suggest("t0")


def test_any_optuna_sampler_and_distribution_can_be_given():
    sampler = optuna.samplers.RandomSampler(seed=1)
    search = OptunaSearch(
        {"x": FloatDistribution(0.0, 1.0), "y": uniform(2, 3)},
        metric="loss",
        mode="min",
        sampler=sampler,
    )
    config = search.suggest("t0")
    assert search.study.sampler is sampler
    assert 0.0 <= config["x"] <= 1.0 and 2 <= config["y"] <= 3


def test_an_evaluated_point_is_a_finished_trial_of_its_state():
    search = OptunaSearch(
        {"x": uniform(0, 1), "opt": choice(["adam", "sgd"]), "fixed": 3},
        metric="loss",
        mode="min",
        seed=0,
    )
    search.add_evaluated_point(
        {"x": 0.2, "opt": "sgd", "fixed": 3}, 0.5, intermediate_values=[0.9, 0.5]
    )
    search.add_evaluated_point({"x": 0.4, "opt": "adam"}, None, error=True)
    search.add_evaluated_point({"x": 0.6, "opt": "adam"}, None, pruned=True)
    search.add_evaluated_point(
        {"x": 0.8, "opt": "adam"}, None
    )  # no value and not pruned: it failed

    done, failed, pruned, no_value = search.study.trials
    assert (done.params, done.value, done.state, done.intermediate_values) == (
        {"x": 0.2, "opt": "sgd"},
        0.5,
        TrialState.COMPLETE,
        {0: 0.9, 1: 0.5},
    )
    assert (failed.state, pruned.state, no_value.state) == (
        TrialState.FAIL,
        TrialState.PRUNED,
        TrialState.FAIL,
    )
    assert search.study.best_params == {"x": 0.2, "opt": "sgd"}
    config = search.suggest("t0")  # a new trial: asked, not one of those
    assert config["fixed"] == 3 and config["x"] not in (0.2, 0.4, 0.6, 0.8)


def test_an_evaluated_point_outside_the_space_is_refused_naming_the_key():
    search = OptunaSearch({"x": uniform(0, 1)}, metric="loss", mode="min")
    with pytest.raises(
        ValueError, match=r"add_evaluated_point parameters key 'x': 2.0 is outside its domain"
    ):
        search.add_evaluated_point({"x": 2.0}, 0.1)
    with pytest.raises(ValueError, match=r"key 'y' is not in the search space"):
        search.add_evaluated_point({"y": 0.5}, 0.1)
    assert search.study.trials == []  # nothing half-added


def test_a_resume_skips_the_points_to_evaluate_handed_out_and_draws_new_points():
    """A second process resuming a run that had asked twice: points_to_evaluate[2] comes next,
    and the default sampler, reseeded from seed and the count, does not draw the first process's
    points again (a fresh sampler of the same seed would)."""
    points = [{"x": 0.1}, {"x": 0.2}, {"x": 0.3}]

    def searcher():
        return OptunaSearch(
            {"x": uniform(0, 1)}, metric="loss", mode="min", points_to_evaluate=points, seed=7
        )

    first = searcher()
    before = [first.suggest(f"t{i}")["x"] for i in range(6)]
    assert before[:3] == [0.1, 0.2, 0.3]

    resumed = searcher()
    resumed.resume_after(2)
    after = [resumed.suggest(f"u{i}")["x"] for i in range(4)]
    assert after[0] == 0.3
    assert not set(after[1:]) & set(before[3:])

    again = searcher()  # a resume is reproducible: the same seed and count, the same points
    again.resume_after(2)
    assert [again.suggest(f"v{i}")["x"] for i in range(4)] == after
    unchanged = searcher()
    unchanged.resume_after(0)  # nothing asked before: as a fresh searcher
    assert [unchanged.suggest(f"w{i}")["x"] for i in range(6)] == before
