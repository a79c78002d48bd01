"""Nightly tuning: a cron-scheduled experiment whose trials share GPUs through an Airflow pool.

Copy this for your own nightly search. It needs:
- a GPU pool made for deferred tasks: ``airflow-trials pool set --gpus <N>`` (or
  ``airflow pools set gpu <N*4> "GPUs" --include-deferred``);
- a Ray cluster with GPUs (``ray_default`` connection or ``RAY_ADDRESS``).

Each trial task asks ``OptunaSearch`` (TPE) for its config when it gets a GPU slot, after the
trials that ended before it, and ASHA stops the worse trials early at its rungs. Each night
starts from the previous night's best three trials: they run first, from their best checkpoints,
and TPE learns their results before its first suggestion (the first night starts cold, with a
warning in its log).
Each trial task gets ``max_failures`` + 3 ``retries`` (the 3 for losses of infrastructure, which
spend no ``max_failures``), and a retry resumes the trial from its latest checkpoint. The best trial
is published on an Asset; ``nightly_regression_publish``
(below) is scheduled on that Asset and runs after every successful search. The best model is due
by 6:00, four hours after the 2:00 slot: a run still going then raises an Airflow Deadline Alert,
and the triggerer logs a warning naming the run (give ``callback=`` your team's notifier to page).
"""

from __future__ import annotations

import datetime

from airflow.sdk import DAG, task

from airflow_trials import ASHAScheduler, OptunaSearch, WarmStart
from airflow_trials.core.search import choice, loguniform
from airflow_trials.experiment import ExperimentDeadline, best_trial_asset, tuning_experiment

EXPERIMENT = "nightly_regression_tuning"
BEST = best_trial_asset(EXPERIMENT)

with DAG(
    EXPERIMENT,
    schedule="0 2 * * *",
    start_date=datetime.datetime(2026, 1, 1),
    catchup=False,
    tags=["airflow_trials", "example"],
) as dag:
    tuning_experiment(
        experiment_name=EXPERIMENT,
        trainable="airflow_trials.examples.regression:train",
        search_space={
            "lr": loguniform(0.01, 1.0),
            "l2": choice([0.0, 0.001, 0.01]),
            "batch_size": 128,
        },
        num_samples=8,
        metric="val_loss",
        mode="min",
        stop={"training_iteration": 20},
        # Each trial task asks TPE for its config when a GPU slot frees, after the trials that
        # ended;
        # ASHA stops the worse trials at iterations 2 and 6 (and 18), so they spend fewer GPU hours.
        search_alg=OptunaSearch(),
        scheduler=ASHAScheduler(max_t=20, grace_period=2, reduction_factor=3),
        resources_per_trial={"cpu": 0.5, "gpu": 0.25},
        gpu_pool="gpu",
        slots_per_gpu=4,
        max_failures=2,
        retry_delay=datetime.timedelta(minutes=1),
        keep_checkpoints_num=2,
        warm_start=WarmStart(source="previous", top_k=3, from_checkpoints=True),
        asset=BEST,
        deadline=ExperimentDeadline(datetime.timedelta(hours=4), reference="logical_date"),
    )

with DAG(
    "nightly_regression_publish",
    schedule=[BEST],
    start_date=datetime.datetime(2026, 1, 1),
    catchup=False,
    tags=["airflow_trials", "example"],
) as publish_dag:

    @task
    def publish(**context):
        """Read the best trial the search published (its checkpoint is what you would deploy)."""
        events = context["triggering_asset_events"][BEST]
        best = events[-1].extra
        print(
            f"Best trial {best['trial_id']}: {best['metric']} = {best['value']} "
            f"(config {best['config']}), best checkpoint {best['best_checkpoint']}"
        )
        return best

    publish()
