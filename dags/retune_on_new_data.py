"""Re-tuning when new data lands: a tuning run per new dataset version.

The DAG is scheduled on the dataset's Asset, which an ``AssetWatcher`` updates: its trigger,
``NewDatasetVersionTrigger``, watches a directory (``$RETUNE_DATA_DIR``, default
``/tmp/airflow_trials/regression_data``) and fires once for each version that lands there, a
file or a directory such as ``v0008`` (write it as ``.v0008.tmp`` and rename it when whole). Each
run is warm-started from the best trials of the last successful run, records the version it tuned
on (the run page shows it), and its best-trial Asset event carries it as ``data_version``.
Triggered by hand, a run takes the version from the trigger form's "Data version" field.
"""

from __future__ import annotations

import datetime
import os

from airflow.sdk import DAG, Asset, AssetWatcher

from airflow_trials.core.search import loguniform, uniform
from airflow_trials.experiment import tuning_experiment
from airflow_trials.triggers.dataset_version_trigger import NewDatasetVersionTrigger

DATA_DIR = os.environ.get("RETUNE_DATA_DIR", "/tmp/airflow_trials/regression_data")

DATASET = Asset(
    "regression_dataset",
    uri=f"file://{DATA_DIR}",
    watchers=[
        AssetWatcher(
            name="new_regression_data_version",
            trigger=NewDatasetVersionTrigger(directory=DATA_DIR, poll_interval_seconds=30.0),
        )
    ],
)

with DAG(
    "retune_on_new_data",
    schedule=[DATASET],
    start_date=datetime.datetime(2026, 1, 1),
    catchup=False,
    tags=["airflow_trials", "example"],
) as dag:
    tuning_experiment(
        experiment_name="retune_on_new_data",
        trainable="airflow_trials.examples.regression:train",
        search_space={
            "lr": loguniform(0.01, 1.0),
            "l2": uniform(0.0, 0.05),
            "batch_size": 128,
            "num_samples": 20_000,
        },
        metric="val_loss",
        mode="min",
        num_samples=6,
        stop={"training_iteration": 6},
        resources_per_trial={"cpu": 0.25},
        warm_start="previous",  # the last successful run's best 3 configs run first
        data_version=DATASET,  # the version the triggering event carries
        poll_interval_seconds=1.0,
    )
