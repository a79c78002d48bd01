"""Constraints on reported metrics: the spelling (core/constraints.py), OptunaSearch steering a real
Optuna study away from an infeasible region, and ResultGrid's feasibility on a real SQLite
trials DB."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import optuna
import pytest
from sqlalchemy import update

from airflow_trials import OptunaSearch, ResultGrid, TrialStatus
from airflow_trials.core.constraints import Constraint, Constraints, constrained_ranks
from airflow_trials.core.end import TrialEnd
from airflow_trials.core.pareto import encode_metrics
from airflow_trials.core.search import uniform
from airflow_trials.store import TrialStore
from airflow_trials.store.models import ExperimentRow
from tests.factories import add_results

REPO = Path(__file__).resolve().parents[2]

# -- the spelling ---------------------------------------------------------------------------


def test_a_constraint_is_a_metric_an_operator_and_a_number():
    constraints = Constraints.parse(["latency <= 5.0", "size<=1e6", " val_acc >= 0.8 "])
    assert list(constraints) == [
        Constraint("latency", "<=", 5.0),
        Constraint("size", "<=", 1e6),
        Constraint("val_acc", ">=", 0.8),
    ]
    assert constraints.spec == ["latency <= 5.0", "size <= 1000000.0", "val_acc >= 0.8"]
    # the spec is plain JSON and reads back to the same constraints
    assert Constraints.parse(json.loads(json.dumps(constraints.spec))) == constraints
    assert constraints.metrics == ["latency", "size", "val_acc"]


def test_values_follow_optunas_convention_and_feasibility_needs_every_one():
    constraints = Constraints.parse(["latency <= 5", "val_acc >= 0.8"])
    inside = {"latency": 4.0, "val_acc": 0.9}
    assert constraints.values(inside) == [-1.0, pytest.approx(-0.1)]
    assert constraints.feasible(inside) and constraints.violations(inside) == {}
    on_the_bound = {"latency": 5.0, "val_acc": 0.8}
    assert constraints.feasible(on_the_bound)  # <= 0 is met, as in Optuna
    slow = {"latency": 7.5, "val_acc": 0.9}
    assert not constraints.feasible(slow)
    assert constraints.violations(slow) == {"latency <= 5.0": 2.5}
    assert constraints.total_violation({"latency": 7.5, "val_acc": 0.5}) == pytest.approx(2.8)
    # a constrained metric not reported (or not a finite number) is not known to be met
    for result in ({"val_acc": 0.9}, {"latency": float("nan"), "val_acc": 0.9}, None):
        assert not constraints.feasible(result)
    assert constraints.violations({"val_acc": 0.9}) == {"latency <= 5.0": math.inf}
    assert Constraints.parse(None).feasible({}) and Constraints.parse([]).feasible(None)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("latency <= 5", r"constraints='latency <= 5' is not a list of strings; give a list"),
        (["latency < 5"], r"constraints\[0\]='latency < 5' is not '<metric> <= <number>'"),
        (["latency == 5"], r"then <= or >= \(not <, >, == or !=\)"),
        (["5 >= latency"], r"constraints\[0\]='5 >= latency' is not '<metric> <= <number>'"),
        (["latency <= fast"], r"constraints\[0\]='latency <= fast': 'fast' is not a number"),
        (["latency <= inf"], r"the bound must be a finite number, not 'inf'"),
        ([("latency", "<=", 5)], r"constraints\[0\]=\('latency', '<=', 5\) is not a string"),
        (["a <= 1", "a <= 1.0"], r"gives 'a <= 1.0' more than once; give each constraint once"),
    ],
)
def test_a_bad_spelling_is_refused_naming_it_and_the_fix(spec, message):
    with pytest.raises(ValueError, match=message):
        Constraints.parse(spec)
    with pytest.raises(ValueError, match=r"^OptunaSearch: "):
        OptunaSearch({"x": uniform(0, 1)}, metric="loss", mode="min", constraints=spec)


def test_constrained_ranks_put_every_feasible_row_before_every_infeasible_one():
    rows = [[0.9, 30.0], [0.8, 10.0], [0.95, 5.0], [0.7, 40.0], [0.99, 1.0]]
    feasible = [True, True, False, True, False]
    # the infeasible rows 2 and 4 dominate every feasible one, yet rank after them
    assert constrained_ranks(rows, ["max", "min"], feasible) == [0, 0, 3, 1, 2]
    assert constrained_ranks(rows[2:3] + rows[4:], ["max", "min"], [False, False]) == [1, 0]
    with pytest.raises(ValueError, match="one flag per row"):
        constrained_ranks(rows, ["max", "min"], [True])


# -- OptunaSearch on a real study -------------------------------------------------------------


def _run_search(constraints, seed, trials=60):
    """Maximise x on [0, 1] while ``cost`` = x must stay <= 0.3: the best is at the bound, and
    70% of the space is infeasible. Returns the search and the x of each trial."""
    search = OptunaSearch(
        {"x": uniform(0.0, 1.0)}, metric="score", mode="max", seed=seed, constraints=constraints
    )
    xs = []
    for i in range(trials):
        x = search.suggest(f"t{i}")["x"]
        xs.append(x)
        search.on_trial_complete(f"t{i}", {"score": x, "cost": x, "training_iteration": 1})
    return search, xs


def test_the_search_steers_away_from_the_infeasible_region():
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    for seed in range(3):
        search, xs = _run_search(["cost <= 0.3"], seed)
        free, free_xs = _run_search(None, seed)
        after_startup, free_after = xs[20:], free_xs[20:]
        # Unconstrained TPE chases x -> 1; random search would draw x > 0.3 70% of the time and
        # x > 0.4 60%. Constrained TPE hugs the bound (the best feasible point), so some draws
        # land just over it, but few go deep into the infeasible region.
        assert sum(x > 0.3 for x in free_after) / len(free_after) > 0.8
        assert sum(x > 0.3 for x in after_startup) / len(after_startup) < 0.6, seed
        assert sum(x > 0.4 for x in after_startup) / len(after_startup) < 0.35, seed
        # the study's constraint values and its best trial are Optuna's own view
        best = search.study.best_trial
        assert best.params["x"] <= 0.3 and best.params["x"] > 0.2
        assert best.constraints == {"cost <= 0.3": pytest.approx(best.params["x"] - 0.3)}
        assert free.study.best_trial.params["x"] > 0.9


def test_several_metrics_with_a_constraint_keep_infeasible_trials_off_the_front():
    search = OptunaSearch(
        {"x": uniform(0.0, 1.0)},
        metric=["acc", "latency"],
        mode=["max", "min"],
        sampler=optuna.samplers.NSGAIISampler(seed=0, population_size=8),
        constraints=["latency <= 0.5"],
    )
    for i in range(24):
        x = search.suggest(f"t{i}")["x"]
        search.on_trial_complete(f"t{i}", {"acc": x, "latency": x, "training_iteration": 1})
    front = search.study.best_trials
    assert front and all(t.values[1] <= 0.5 for t in front)


def test_a_result_without_a_constrained_metric_is_an_error_naming_it():
    search = OptunaSearch(
        {"x": uniform(0, 1)}, metric="score", mode="max", seed=0, constraints=["cost <= 1"]
    )
    search.suggest("t0")
    with pytest.raises(ValueError, match=r"trial t0 reported no finite value of 'cost'"):
        search.on_trial_complete("t0", {"score": 1.0, "training_iteration": 1})


def test_evaluated_points_and_suggest_after_take_the_result_the_values_come_from():
    constraints = ["cost <= 0.3"]
    with pytest.raises(ValueError, match=r"evaluated_rewards .* add_evaluated_point"):
        OptunaSearch(
            {"x": uniform(0, 1)},
            metric="score",
            mode="max",
            points_to_evaluate=[{"x": 0.9}],
            evaluated_rewards=[0.9],
            constraints=constraints,
        )
    search = OptunaSearch(
        {"x": uniform(0, 1)}, metric="score", mode="max", seed=0, constraints=constraints
    )
    search.add_evaluated_point({"x": 0.9}, 0.9, result={"score": 0.9, "cost": 0.9})
    search.add_evaluated_point({"x": 0.2}, 0.2, result={"score": 0.2, "cost": 0.2})
    assert search.study.best_trial.params == {"x": 0.2}  # 0.9 scores higher but is infeasible
    finished = [({"x": 0.9}, 0.9, {"score": 0.9, "cost": 0.9}), ({"x": 0.5}, None, None)]
    config = search.suggest_after("t9", finished, index=0, seed=1)
    assert 0.0 <= config["x"] <= 1.0
    with pytest.raises(ValueError, match=r"finished trial 0, which comes without its last result"):
        search.suggest_after("t9", [({"x": 0.9}, 0.9)], index=0, seed=1)


# -- ResultGrid --------------------------------------------------------------------------------

EXPERIMENT = "constrained"
LAST = {  # trial id -> (val_acc, latency) of its last result
    "a": (0.99, 9.0),  # the most accurate, but too slow: infeasible
    "b": (0.90, 4.0),  # the best feasible
    "c": (0.80, 2.0),  # feasible, on the feasible front
    "d": (0.70, 3.0),  # feasible, dominated by c
    "e": (0.95, None),  # no latency reported: not known to be feasible
}


@pytest.fixture
def store(tmp_path):
    trial_store = TrialStore(f"sqlite:///{tmp_path / 'trials.db'}", create=True)
    yield trial_store
    trial_store.dispose()


def _record(store, metric, mode, last):
    store.ensure_experiment(EXPERIMENT)
    stored_metric, stored_mode = encode_metrics(metric, mode)
    with store._engine.begin() as connection:  # as test_result_grid_pareto.py records them
        connection.execute(
            update(ExperimentRow)
            .where(ExperimentRow.name == EXPERIMENT)
            .values(metric=stored_metric, mode=stored_mode)
        )
    run = store.create_experiment_run(EXPERIMENT, "night-1")
    for trial_id, (val_acc, latency) in last.items():
        store.upsert_trial(
            trial_id,
            trainable="pkg.mod:fn",
            config={"width": len(trial_id)},
            resources={"cpu": 1},
            max_failures=0,
            experiment_run_id=run,
        )
        result = {"training_iteration": 1, "val_acc": val_acc}
        if latency is not None:
            result["latency"] = latency
        add_results(store, trial_id, [result])
        store.record_end(TrialEnd(trial_id, EXPERIMENT, TrialStatus.TERMINATED, error=None), None)
    return run


def test_an_infeasible_trial_never_wins_while_a_feasible_one_is_there(store):
    _record(store, "val_acc", "max", LAST)
    free = ResultGrid.from_db(EXPERIMENT, store=store)
    assert free.get_best_result().trial_id == "a"
    assert "feasible" not in free.get_dataframe().columns
    grid = ResultGrid.from_db(EXPERIMENT, store=store, constraints=["latency <= 5"])
    assert grid.constraints.spec == ["latency <= 5.0"]
    assert grid.get_best_result().trial_id == "b"
    frame = grid.get_dataframe().set_index("trial_id")
    assert frame["feasible"].to_dict() == {"a": False, "b": True, "c": True, "d": True, "e": False}
    front = grid.get_pareto_front(["val_acc", "latency"], ["max", "min"])
    assert [r.trial_id for r in front] == ["b", "c"]  # a dominates b only by being too slow
    ranked = grid.get_dataframe(pareto_metric=["val_acc", "latency"], pareto_mode=["max", "min"])
    ranks = ranked.set_index("trial_id")["pareto_rank"].to_dict()
    assert ranks["b"] == ranks["c"] == 0 and ranks["d"] == 1 and ranks["a"] == 2
    assert ranked.set_index("trial_id")["pareto_rank"].isna().to_dict()["e"]  # no latency


def test_with_no_feasible_trial_every_one_is_ranked_and_a_warning_says_so(store, caplog):
    _record(store, ["val_acc", "latency"], ["max", "min"], LAST)
    grid = ResultGrid.from_db(EXPERIMENT, store=store, constraints=["latency <= 0.5"])
    with caplog.at_level("WARNING"):
        assert grid.get_best_result("val_acc").trial_id == "a"  # as with no constraints
    assert "meets the constraints ['latency <= 0.5']" in caplog.text
    assert [r.trial_id for r in grid.get_pareto_front()] == ["a", "b", "c"]
    assert not grid.get_dataframe()["feasible"].any()


def test_a_bad_constraint_on_the_grid_is_refused_naming_it(store):
    _record(store, "val_acc", "max", LAST)
    with pytest.raises(ValueError, match=r"ResultGrid.from_db: constraints\[0\]='latency < 5'"):
        ResultGrid.from_db(EXPERIMENT, store=store, constraints=["latency < 5"])


# -- docs/engine.md --------------------------------------------------------------------------


def test_the_engine_docs_example_of_constraints_runs():
    text = (REPO / "docs" / "engine.md").read_text(encoding="utf-8")
    blocks = re.findall(
        r"<!-- runs: tests/unit/test_constraints.py -->\n```python\n(.*?)```", text, re.S
    )
    assert len(blocks) == 1
    namespace: dict = {}
    exec(compile(blocks[0], "docs/engine.md", "exec"), namespace)
    best = namespace["best"]
    assert 0.3 < best.params["width"] <= 0.4
    assert best.constraints == {"latency <= 0.4": pytest.approx(best.params["width"] - 0.4)}


def test_the_grid_reads_the_experiment_s_stored_constraints_by_default(store):
    _record(store, "val_acc", "max", LAST)
    store.ensure_experiment(EXPERIMENT, constraints=["latency <= 5"])  # as tuning_experiment does
    grid = ResultGrid.from_db(EXPERIMENT, store=store)
    assert grid.constraints.spec == ["latency <= 5.0"]
    assert grid.get_best_result().trial_id == "b"
    # Given ones win; an empty list judges none.
    unconstrained = ResultGrid.from_db(EXPERIMENT, store=store, constraints=[])
    assert not unconstrained.constraints and unconstrained.get_best_result().trial_id == "a"
