"""Ray Train inside each trial: 4 trials of a ``TorchTrainer`` with 2 data-parallel workers (gloo on
the CPU), judged by ASHA on the loss the workers report.

Each trial's actor is the Train driver (``airflow_trials.examples.torch_train:train``). Its
``RayTrainResources`` declare the driver's bundle and Train's 2 workers (0.25 CPU each): Train V2
reserves the workers in a placement group of its own, and the runner, the cluster check and a GPU
pool count them with the trial. ``placement_strategy="SPREAD"`` puts the two workers on different
nodes where the cluster has several (each result's ``worker_node_ids`` says where they ran); a
worker that dies is started again by Train from its latest checkpoint (``train_max_failures``),
without failing the trial. Needs PyTorch (the ``torch`` extra) and Ray Train V2 (on by default
since Ray 2.51). Trigger it from the Airflow UI.
"""

from __future__ import annotations

import datetime

from airflow.sdk import DAG

from airflow_trials import ASHAScheduler, RayTrainResources
from airflow_trials.core.search import grid_search
from airflow_trials.experiment import tuning_experiment

with DAG(
    "ray_train_tuning",
    schedule=None,
    start_date=datetime.datetime(2026, 1, 1),
    catchup=False,
    tags=["airflow_trials", "example"],
) as dag:
    tuning_experiment(
        experiment_name="ray_train_tuning",
        trainable="airflow_trials.examples.torch_train:train",
        search_space={
            "lr": grid_search([0.1, 0.03, 0.01, 0.001]),
            "hidden": 32,
            "n_samples": 2000,
            "train_max_failures": 2,
        },
        metric="loss",
        mode="min",
        scheduler=ASHAScheduler(max_t=8, grace_period=2, reduction_factor=2),
        stop={"training_iteration": 8},
        resources_per_trial=RayTrainResources(
            driver={"CPU": 0.25},
            num_workers=2,
            resources_per_worker={"CPU": 0.25},
            placement_strategy="SPREAD",
        ),
        max_failures=1,
        retry_delay=datetime.timedelta(seconds=5),
        keep_checkpoints_num=2,
        checkpoint_score_attr="min-loss",
        poll_interval_seconds=1.0,
    )
