"""The example DAGs in dags/: they import cleanly, and each runs."""

from __future__ import annotations

import importlib.util
import os
import shutil

import pytest

from airflow_trials.operators.trial_operator import MAX_INFRASTRUCTURE_RESTARTS
from tests.airflow.conftest import dags_folder
from tests.conftest import REPO

EXAMPLES = os.path.join(REPO, "dags")


def load(name):
    """Copy the example into the test's DAGs folder (dag.test() serializes from there) and import
    it."""
    target = os.path.join(dags_folder(), name)
    shutil.copy(os.path.join(EXAMPLES, name), target)
    spec = importlib.util.spec_from_file_location(f"example_{name[:-3]}", target)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name", sorted(n for n in os.listdir(EXAMPLES) if n.endswith(".py")))
def test_example_dags_import_cleanly(airflow_home, name):
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=os.path.join(EXAMPLES, name))
    assert bag.import_errors == {}
    assert bag.dags


def test_nightly_schedule_pool_retries_and_asset(airflow_home):
    module = load("nightly_regression_tuning.py")
    dag = module.dag
    assert dag.catchup is False
    trial = dag.get_task("nightly_regression_tuning.trial")
    assert trial.partial_kwargs["pool"] == "gpu" and trial.partial_kwargs["pool_slots"] == 1
    assert trial.partial_kwargs["retries"] == 2 + MAX_INFRASTRUCTURE_RESTARTS  # max_failures=2
    assert module.BEST in dag.get_task("nightly_regression_tuning.select_best").outlets


def test_nightly_search_runs_and_publishes_its_best_trial(trials_env):
    module = load("nightly_regression_tuning.py")
    # Airflow 3.3.2's dag.test() fails as it ends a run of a DAG with a Deadline Alert (it looks
    # the DAG's alerts up by id, and gets their serialized form); the scheduler does not (the
    # alert's own test, tests/faults/test_deadline_alert.py, runs it there); docs/airflow.md.
    module.dag.deadline = None
    run = module.dag.test()
    assert run.state == "success"
    (exp_run,) = trials_env.store.reader.list_experiment_runs("nightly_regression_tuning")
    board = trials_env.store.reader.leaderboard(exp_run.id, "val_loss", "min")
    assert len(board) == 8 and all(r.status.value == "TERMINATED" for r in board)
    # OptunaSearch chose the configs; ASHA judged every trial at its first rung (iteration 2).
    trials = trials_env.store.reader.list_trials(experiment_run_id=exp_run.id)
    assert len({(t.config["lr"], t.config["l2"]) for t in trials}) == 8
    assert all(
        2.0 in {r.milestone for r in trials_env.store.reader.trial_rungs(t.trial_id)}
        for t in trials
    )


def test_the_sweep_runs_its_trials_in_one_task_and_asha_stops_the_worse(trials_env):
    module = load("sweep_regression_tuning.py")
    assert module.dag.get_task("sweep_regression_tuning.sweep").max_concurrent_trials == 4
    run = module.dag.test()
    assert run.state == "success"
    (exp_run,) = trials_env.store.reader.list_experiment_runs("sweep_regression_tuning")
    trials = trials_env.store.reader.list_trials(experiment_run_id=exp_run.id)
    assert len(trials) == 12 and all(t.status.value == "TERMINATED" for t in trials)
    iterations = sorted(t.last_result["training_iteration"] for t in trials)
    # ASHA stopped some at its rungs (2 or 4); the best ran the full 8 iterations.
    assert iterations[0] < 8 and iterations[-1] == 8, iterations
