"""Two metrics at once: the regression example's accuracy against the size of its weights.

``metric`` and ``mode`` are lists, so OptunaSearch runs a multi-objective study, and
``select_best`` returns the run's Pareto front with the trial ``pick`` chooses from it; the
Asset event carries both, for a downstream DAG. README.md shows this DAG.
"""

from __future__ import annotations

import datetime

from airflow.sdk import DAG

from airflow_trials import OptunaSearch
from airflow_trials.core.search import loguniform
from airflow_trials.experiment import tuning_experiment

with DAG(
    "two_objective_tuning", schedule=None, start_date=datetime.datetime(2026, 1, 1), catchup=False
) as dag:
    tuning_experiment(
        experiment_name="two_objective_tuning",
        trainable="airflow_trials.examples.regression:train",
        search_space={
            "lr": loguniform(0.01, 1.0),
            "l2": loguniform(1e-4, 0.3),
            "num_samples": 4000,
        },
        num_samples=6,
        metric=["val_accuracy", "weight_norm"],
        mode=["max", "min"],  # one mode per metric
        search_alg=OptunaSearch(seed=0),  # a multi-objective study: each trial task asks it
        # The front's trial with the highest val_accuracy - 0.01 * weight_norm; or the best
        # val_accuracy within bounds:
        # pick={"metric": "val_accuracy", "bounds": {"weight_norm": [None, 2.0]}},
        pick={"weights": {"val_accuracy": 1.0, "weight_norm": -0.01}},
        max_concurrent_trials=2,
        stop={"training_iteration": 4},
        resources_per_trial={"cpu": 0.5},
    )
