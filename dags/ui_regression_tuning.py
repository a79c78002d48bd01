"""Tuning triggered from the Airflow UI: a validated Params form chooses the values, never the code.

Open the DAG in the UI and press *Trigger*: the form asks for the number of trials, the learning
rate and weight-decay bounds, the epochs, the metric and its mode, the GPUs per trial and
``max_failures``. Airflow checks each field against its JSON schema when the run is triggered
(the UI and the REST API refuse an out-of-range, NaN or wrongly typed value with the field's
name), and ``suggest_configs`` refuses what a schema cannot express, before any trial starts or
anything is written: ``lr_min < lr_max`` (``settings_from_params`` below), a count sent as a
float (``4.0``), and ``conf`` keys that are not fields of the form.

The trainable is fixed in this file: params pick values, never which code runs.

GPUs per trial is one of ``GPU_CHOICES``. Airflow fixes a task's pool slots when it creates the
task instance, so each choice has its own trial task (``trial_gpu_0``, ``trial_gpu_0_5``, ...) with
the right slots of the ``gpu`` pool, and ``route_trials`` runs the one this run asked for.
GPU choices need a Ray cluster with GPUs; on a CPU-only cluster ``suggest_configs`` refuses the
run's params, naming ``gpus_per_trial`` and its default as the fix.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any

from airflow.sdk import DAG, Param

from airflow_trials.core.search import loguniform, uniform
from airflow_trials.experiment import tuning_experiment

EXPERIMENT = "ui_regression_tuning"
GPU_CHOICES = [0, 0.25, 0.5, 1]
MAX_FAILURES = (
    3  # sets the trial tasks' retries (3 + 3 for infrastructure losses); the form may ask for fewer
)
# JSON Schema's range keywords all let NaN through (every comparison with NaN is false), and a
# Python client sends float("nan") as the bare token NaN. No number is both >= 1 and <= 0, but
# NaN passes both tests: so this refuses NaN, and only NaN, when the run is triggered.
NOT_NAN = {
    "not": {"$comment": "NaN is not a number: send a finite number", "minimum": 1, "maximum": 0}
}


def settings_from_params(params: Mapping[str, Any]) -> dict[str, Any]:
    """This run's experiment settings from its (schema-validated) params."""
    if params["lr_min"] >= params["lr_max"]:
        raise ValueError(
            f"lr_min ({params['lr_min']}) must be below lr_max ({params['lr_max']}); "
            "lower lr_min or raise lr_max"
        )
    l2 = uniform(0.0, params["l2_max"]) if params["l2_max"] > 0 else 0.0
    return {
        "search_space": {
            "lr": loguniform(params["lr_min"], params["lr_max"]),
            "l2": l2,
            "batch_size": 128,
            "num_samples": 20_000,
        },  # the data set's size, not the trials
        "num_samples": params["num_samples"],
        "stop": {"training_iteration": params["epochs"]},
        "metric": params["metric"],
        "mode": params["mode"],
        "resources_per_trial": {"cpu": 0.25, "gpu": params["gpus_per_trial"]},
        "max_failures": params["max_failures"],
    }


with DAG(
    EXPERIMENT,
    schedule=None,
    start_date=datetime.datetime(2026, 1, 1),
    catchup=False,
    tags=["airflow_trials", "example"],
    params={
        "num_samples": Param(
            4,
            type="integer",
            minimum=1,
            maximum=32,
            title="Trials",
            description="How many configs to sample (1 to 32).",
        ),
        "lr_min": Param(
            0.01,
            type="number",
            exclusiveMinimum=0,
            maximum=10,
            title="Learning rate: lower bound",
            description="Sampled log-uniformly between the bounds; must be > 0 and below the upper "
            "bound.",
            **NOT_NAN,
        ),
        "lr_max": Param(
            1.0,
            type="number",
            exclusiveMinimum=0,
            maximum=10,
            title="Learning rate: upper bound",
            **NOT_NAN,
        ),
        "l2_max": Param(
            0.01,
            type="number",
            minimum=0,
            maximum=1,
            title="Weight decay: upper bound",
            description="Sampled uniformly from 0; 0 turns weight decay off.",
            **NOT_NAN,
        ),
        "epochs": Param(10, type="integer", minimum=1, maximum=100, title="Epochs per trial"),
        "metric": Param(
            "val_loss",
            type="string",
            enum=["val_loss", "val_accuracy", "train_loss"],
            title="Metric to rank trials by",
        ),
        "mode": Param(
            "min",
            type="string",
            enum=["min", "max"],
            title="Mode",
            description="min for losses, max for accuracy.",
        ),
        "gpus_per_trial": Param(
            0,
            type="number",
            enum=GPU_CHOICES,
            title="GPUs per trial",
            description="Fractions share a GPU; the gpu pool admits as many trials as fit.",
        ),
        "max_failures": Param(
            1,
            type="integer",
            minimum=0,
            maximum=MAX_FAILURES,
            title="max_failures",
            description="Retries of a failed trial, each from its latest checkpoint.",
        ),
    },
) as dag:
    tuning_experiment(
        experiment_name=EXPERIMENT,
        trainable="airflow_trials.examples.regression:train",
        # The defaults below are replaced, per run, by what settings_from_params returns.
        search_space={"lr": loguniform(0.01, 1.0), "l2": uniform(0.0, 0.01), "batch_size": 128},
        num_samples=4,
        metric="val_loss",
        mode="min",
        stop={"training_iteration": 10},
        resources_per_trial={"cpu": 0.25, "gpu": 0},
        max_failures=MAX_FAILURES,
        retry_delay=datetime.timedelta(seconds=5),
        gpu_pool="gpu",
        gpus_per_trial_choices=GPU_CHOICES,
        from_params=settings_from_params,
        keep_checkpoints_num=2,
        poll_interval_seconds=1.0,
    )
