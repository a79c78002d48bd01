"""A sweep: every trial of the experiment in one task, run by a driver on Ray.

Copy this when a search has more trials than Airflow should map (``[core] max_map_length``, 1024 by
default), many short trials, or a scheduler that judges each result as it comes. The ``sweep``
task starts the driver (a detached Ray actor) and defers; the driver runs at most
``max_concurrent_trials`` trials at a time, asks ASHA after every result, and stops the worse
trials at its rungs (iterations 2 and 4). A retry of the task re-attaches to the live driver, or
resumes the run from the trials DB: ended trials are not run again (docs/airflow.md).
"""

from __future__ import annotations

import datetime

from airflow.sdk import DAG

from airflow_trials import ASHAScheduler
from airflow_trials.core.search import choice, loguniform
from airflow_trials.experiment import tuning_experiment

with DAG(
    "sweep_regression_tuning",
    schedule=None,
    start_date=datetime.datetime(2026, 1, 1),
    catchup=False,
    tags=["airflow_trials", "example"],
) as dag:
    tuning_experiment(
        experiment_name="sweep_regression_tuning",
        trainable="airflow_trials.examples.regression:train",
        search_space={
            "lr": loguniform(0.01, 1.0),
            "l2": choice([0.0, 0.001, 0.01]),
            "batch_size": 128,
            "num_samples": 20_000,
        },
        num_samples=12,
        seed=7,
        metric="val_loss",
        mode="min",
        stop={"training_iteration": 8},
        scheduler=ASHAScheduler(max_t=8, grace_period=2, reduction_factor=2),
        resources_per_trial={"cpu": 0.5},
        max_concurrent_trials=4,
        sweep=True,
        max_failures=1,
        retry_delay=datetime.timedelta(seconds=10),
        keep_checkpoints_num=2,
    )
