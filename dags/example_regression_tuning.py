"""The bundled example experiment: a grid of a NumPy logistic-regression trainable, run on Ray.

Triggered by ``./scripts/run.sh`` (the main job); trigger it from the Airflow UI too.
"""

from __future__ import annotations

import datetime

from airflow.sdk import DAG

from airflow_trials.core.search import grid_search
from airflow_trials.experiment import tuning_experiment

with DAG(
    "example_regression_tuning",
    schedule=None,
    start_date=datetime.datetime(2026, 1, 1),
    catchup=False,
    tags=["airflow_trials", "example"],
) as dag:
    tuning_experiment(
        experiment_name="example_regression_tuning",
        trainable="airflow_trials.examples.regression:train",
        search_space={
            "lr": grid_search([1.0, 0.3, 0.1, 0.03]),
            "l2": grid_search([0.0, 0.01]),
            "batch_size": 128,
            "num_samples": 20_000,
        },
        metric="val_loss",
        mode="min",
        stop={"training_iteration": 10},
        resources_per_trial={"cpu": 0.25},
        max_failures=1,
        retry_delay=datetime.timedelta(seconds=5),
        keep_checkpoints_num=2,
        poll_interval_seconds=1.0,
    )
