"""tuning_experiment with a constrained OptunaSearch: a real run (dag.test, Ray, the trials DB) asks
Optuna with each ended trial's last result, records the constraints with the experiment, and picks
a feasible best trial; the next run warm-starts from it."""

from __future__ import annotations

from airflow_trials import OptunaSearch
from airflow_trials.core.search import choice
from tests.airflow.conftest import load_dag_source
from tests.airflow.test_experiment_dag import task_states, xcom
from tests.airflow.test_several_metrics import (
    REPORTED,
    declare,
    finished_run,
    run_select_best,
    trials_db,  # noqa: F401  (a fixture)
)

SPACE = {"scale": choice([1.0, 2.0, 3.0]), "cost": choice([0.5, 5.0])}


def test_select_best_of_several_metrics_picks_from_the_feasible_front(trials_db):  # noqa: F811
    # The suggest task records the DAG's constraints with the experiment; the board judges by them.
    suggested = finished_run(trials_db, REPORTED, constraints=["latency <= 5"])
    dag = declare(search_alg=OptunaSearch(constraints=["latency <= 5"]))
    best, extra = run_select_best(dag, suggested)
    # t-accurate (val_acc 0.95) would be picked, but its latency is 12: only t-fast is feasible.
    assert best["trial_id"] == "t-fast" and best["feasible"] is True
    assert best["constraints"] == ["latency <= 5.0"]
    assert [e["trial_id"] for e in best["pareto_front"]] == ["t-fast"]
    assert best["pareto_ranks"] == {"t-fast": 0}
    assert extra == best


# The first trial reaches the best score (9.0) but costs too much; the second is feasible. The
# third asks Optuna after both ended, which needs their last results to compute the constraint.
DAG_SOURCE = """
import datetime
from airflow.sdk import DAG
from airflow_trials import OptunaSearch
from airflow_trials.core.search import choice
from airflow_trials.experiment import tuning_experiment

START = datetime.datetime(2026, 1, 1)
with DAG("constrained", schedule=None, start_date=START, catchup=False) as dag:
    tuning_experiment(
        experiment_name="constrained",
        group_id="tune",
        trainable="tests.trainables:two_metrics",
        search_space={"scale": choice([1.0, 2.0, 3.0]), "cost": choice([0.5, 5.0])},
        metric="score",
        mode="max",
        num_samples=3,
        max_concurrent_trials=1,
        warm_start=__import__("airflow_trials").WarmStart(top_k=1),
        stop={"training_iteration": 3},
        resources_per_trial={"cpu": 0.5},
        poll_interval_seconds=0.05,
        search_alg=OptunaSearch(
            constraints=["cost <= 1"],
            points_to_evaluate=[{"scale": 3.0, "cost": 5.0}, {"scale": 2.0, "cost": 0.5}],
            seed=0,
        ),
    )
"""


def test_a_constrained_search_runs_and_its_best_trial_is_feasible(trials_env):
    from airflow_trials.results import ResultGrid

    dag = load_dag_source("constrained", DAG_SOURCE)
    run = dag.test()
    assert run.state == "success", task_states(run)

    store = trials_env.store
    assert store.reader.get_experiment("constrained").constraint_spec == ["cost <= 1.0"]
    (exp_run,) = store.reader.list_experiment_runs("constrained")
    trials = {t.trial_id: t for t in store.reader.list_trials(experiment_run_id=exp_run.id)}
    # The third trial's ask learnt from the first two, constraint values included.
    assert len(trials) == 3 and {t.status.value for t in trials.values()} == {"TERMINATED"}
    infeasible = [t for t in trials.values() if t.last_result["cost"] > 1.0]
    assert any(t.config == {"scale": 3.0, "cost": 5.0} for t in infeasible)

    best = xcom(run, "tune.select_best")
    chosen = trials[best["trial_id"]]
    assert chosen.last_result["cost"] <= 1.0  # feasible, though a trial scored 9.0 at cost 5.0
    feasible_scores = [t.last_result["score"] for t in trials.values() if t not in infeasible]
    assert best["value"] == max(feasible_scores)
    assert (best["feasible"], best["constraints"]) == (True, ["cost <= 1.0"])

    board = store.reader.leaderboard(exp_run.id, "score", "max")
    assert board[0].trial_id == best["trial_id"] and board[0].feasible is True
    assert {r.trial_id for r in board if r.feasible is False} == {t.trial_id for t in infeasible}
    assert board[-1].violations == {"cost <= 1.0": 4.0}
    # ResultGrid reads the stored constraints by default and agrees.
    grid = ResultGrid.from_db("constrained", store=store)
    assert grid.constraints.spec == ["cost <= 1.0"]
    assert grid.get_best_result().trial_id == best["trial_id"]

    # The next night warm-starts from the feasible best (not the infeasible trial that scored
    # more), and its searcher learns that seed with its last result, constraint values included.
    second = dag.test()
    assert second.state == "success", task_states(second)
    night2 = [
        r for r in store.reader.list_experiment_runs("constrained") if r.run_key == second.run_id
    ]
    seeds = [t for t in store.reader.list_trials(experiment_run_id=night2[0].id) if t.warm_start]
    assert [(t.config, t.warm_start["trial_id"]) for t in seeds] == [
        (chosen.config, best["trial_id"])
    ]
