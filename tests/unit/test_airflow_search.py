"""The Airflow path's ask (operators/tuning.py, OptunaSearch.suggest_after): each trial task asks
a fresh study built from the run's ended trials, as Optuna's distributed workers ask one shared
study. Pure: no Ray, no Airflow components."""

from __future__ import annotations

from types import SimpleNamespace

import optuna
import pytest

from airflow_trials import OptunaSearch
from airflow_trials.core.search import choice, grid_search, uniform
from airflow_trials.core.status import TrialStatus
from airflow_trials.operators.tuning import airflow_searcher, ended_trials, judged_rule

SPACE = {"x": uniform(0.0, 1.0), "act": choice(["relu", "gelu", "tanh"]), "fixed": 7}


def _finished(n):
    """n ended trials: (config, value), the value best near x = 0.3 with gelu."""
    out = []
    for i in range(n):
        x = (i * 0.37) % 1.0
        act = ["relu", "gelu", "tanh"][i % 3]
        out.append(
            ({"x": x, "act": act, "fixed": 7}, (x - 0.3) ** 2 + (0.0 if act == "gelu" else 0.5))
        )
    return out


def test_a_suggestion_is_optunas_own_ask_on_a_study_holding_the_ended_trials():
    search = airflow_searcher(OptunaSearch(), SPACE, "loss", "min")
    finished = _finished(14) + [
        ({"x": 0.9, "act": "relu", "fixed": 7}, None)
    ]  # the last one failed
    ours = search.suggest_after("t15", finished, index=15, seed=123)

    study = optuna.create_study(direction="minimize", sampler=optuna.samplers.TPESampler(seed=123))
    dists = {
        "x": optuna.distributions.FloatDistribution(0.0, 1.0),
        "act": optuna.distributions.CategoricalDistribution([0, 1, 2]),
    }
    for config, value in finished:
        params = {"x": config["x"], "act": ["relu", "gelu", "tanh"].index(config["act"])}
        state = optuna.trial.TrialState.FAIL if value is None else optuna.trial.TrialState.COMPLETE
        study.add_trial(
            optuna.trial.create_trial(params=params, distributions=dists, value=value, state=state)
        )
    params = study.ask(fixed_distributions=dists).params
    assert ours == {"x": params["x"], "act": ["relu", "gelu", "tanh"][params["act"]], "fixed": 7}
    assert search._study is None  # the searcher's own study is never touched


def test_trials_asking_at_once_get_different_points_and_the_same_trial_the_same_point():
    search = airflow_searcher(OptunaSearch(), SPACE, "loss", "min")
    finished = _finished(12)
    points = {search.suggest_after(f"t{i}", finished, index=i, seed=i)["x"] for i in range(12, 16)}
    assert len(points) == 4
    assert search.suggest_after("t12", finished, 12, seed=12) == search.suggest_after(
        "t12", finished, 12, seed=12
    )


def test_the_searchers_own_seed_is_mixed_into_each_ask():
    finished = _finished(12)
    asks = {
        seed: airflow_searcher(OptunaSearch(seed=seed), SPACE, "loss", "min").suggest_after(
            "t12", finished, 12, 5
        )
        for seed in (None, 0, 1)
    }
    assert len({a["x"] for a in asks.values()}) == 3
    again = airflow_searcher(OptunaSearch(seed=1), SPACE, "loss", "min").suggest_after(
        "t12", finished, 12, 5
    )
    assert again == asks[1]


def test_points_to_evaluate_go_to_the_trials_in_their_order():
    search = airflow_searcher(
        OptunaSearch(points_to_evaluate=[{"x": 0.25}, {"x": 0.5, "act": "tanh"}]),
        SPACE,
        "loss",
        "min",
    )
    assert search.suggest_after("t0", [], 0, seed=1)["x"] == 0.25
    second = search.suggest_after("t1", _finished(1), 1, seed=2)
    assert (second["x"], second["act"]) == (0.5, "tanh")
    assert search.suggest_after("t2", _finished(2), 2, seed=3)["x"] not in (0.25, 0.5)


def test_a_given_sampler_is_copied_and_reseeded_so_concurrent_asks_differ():
    sampler = optuna.samplers.RandomSampler(seed=0)
    search = airflow_searcher(OptunaSearch(sampler=sampler), SPACE, "loss", "min")
    first, second = (search.suggest_after(f"t{i}", [], i, seed=0)["x"] for i in range(2))
    assert first != second
    assert (
        optuna.samplers.RandomSampler(seed=0)._rng.rng.random() == sampler._rng.rng.random()
    )  # untouched


def test_ended_trials_are_what_the_searcher_learns_from():
    def record(trial_id, status, config, last=None):
        return SimpleNamespace(trial_id=trial_id, status=status, config=config, last_result=last)

    trials = [
        record(
            "a", TrialStatus.TERMINATED, {"x": 0.1}, {"loss": 0.4}
        ),  # finished, or stopped by ASHA
        record("b", TrialStatus.ERROR, {"x": 0.2}, {"loss": 0.1}),  # failed for good
        record("c", TrialStatus.RUNNING, {"x": 0.3}, {"loss": 0.2}),  # not ended
        record("d", TrialStatus.TERMINATED, {"x": 0.4}, None),  # stopped before it reported
        record("e", TrialStatus.TERMINATED, {"x": 0.5}, {"loss": float("nan")}),
        record("me", TrialStatus.PENDING, {}, None),
    ]
    assert ended_trials(trials, "loss", exclude="me") == [({"x": 0.1}, 0.4), ({"x": 0.2}, None)]


@pytest.mark.parametrize(
    ("search_alg", "space", "message"),
    [
        (object(), SPACE, r"takes search_alg=OptunaSearch\(\.\.\.\) only, got object"),
        (
            OptunaSearch(metric="acc"),
            SPACE,
            r"disagree on metric 'acc' vs 'loss' \(search_alg vs experiment\)",
        ),
        (
            OptunaSearch(SPACE),
            SPACE,
            r"has a search space of its own and the experiment has one too",
        ),
        (OptunaSearch(), {"x": grid_search([1, 2])}, r"'x'.*Optuna picks every value itself"),
    ],
)
def test_a_searcher_the_airflow_path_cannot_ask_is_refused(search_alg, space, message):
    with pytest.raises(ValueError, match=message):
        airflow_searcher(search_alg, space, "loss", "min")


def test_a_searcher_with_its_own_space_takes_the_experiments_metric():
    search = airflow_searcher(OptunaSearch(SPACE), {}, "loss", "min")
    assert (search.metric, search.mode) == ("loss", "min")


def test_the_bracket_is_drawn_from_the_ids_the_same_on_every_try():
    settings = {
        "metric": "loss",
        "mode": "min",
        "max_t": 81,
        "grace_period": 1,
        "reduction_factor": 3,
        "brackets": 3,
        "time_attr": "training_iteration",
        "stop_last_trials": True,
    }
    draws = [judged_rule(settings, "trial", 7, f"t{i}")[1] for i in range(200)]
    assert draws == [judged_rule(settings, "trial", 7, f"t{i}")[1] for i in range(200)]
    assert set(draws) == {0, 1, 2}
    assert judged_rule(None, "trial", None, "t1") == (None, 0)
    with pytest.raises(ValueError, match="needs experiment_run_id"):
        judged_rule(settings, "trial", None, "t1")


def test_a_constrained_search_asks_after_the_ended_trials_with_their_last_results():
    from airflow_trials.operators.tuning import suggested_config

    class Recording(OptunaSearch):
        def suggest_after(self, trial_id, finished, index, seed):
            self.asked_after = list(finished)
            return super().suggest_after(trial_id, finished, index, seed)

    def record(trial_id, status, config, last=None):
        return SimpleNamespace(trial_id=trial_id, status=status, config=config, last_result=last)

    fast = {"loss": 0.4, "latency": 2.0, "training_iteration": 3}
    slow = {"loss": 0.1, "latency": 9.0, "training_iteration": 3}
    trials = [
        record("a", TrialStatus.TERMINATED, {"x": 0.1, "act": "relu", "fixed": 7}, fast),
        record("b", TrialStatus.TERMINATED, {"x": 0.2, "act": "gelu", "fixed": 7}, slow),
        record("c", TrialStatus.ERROR, {"x": 0.3, "act": "tanh", "fixed": 7}, None),
        record("me", TrialStatus.PENDING, {}, None),
    ]
    store = SimpleNamespace(reader=SimpleNamespace(list_trials=lambda experiment_run_id: trials))
    search = airflow_searcher(Recording(constraints=["latency <= 5"]), SPACE, "loss", "min")
    config = suggested_config(store, search, 1, "me", index=3)
    assert set(config) == {"x", "act", "fixed"} and 0.0 <= config["x"] <= 1.0
    assert search.asked_after == [
        ({"x": 0.1, "act": "relu", "fixed": 7}, 0.4, fast),
        ({"x": 0.2, "act": "gelu", "fixed": 7}, 0.1, slow),
        ({"x": 0.3, "act": "tanh", "fixed": 7}, None, {}),
    ]
    # Told by value only, the same search refuses: it cannot compute the constraints.
    with pytest.raises(ValueError, match="comes without its last result"):
        search.suggest_after("me", [(c, v) for c, v, _ in search.asked_after], 3, seed=1)
