"""A tuning experiment as an Airflow task group: the builder, its tasks' bodies, per-run settings
and the warm start from an earlier run.

- ``builder.py``: :func:`tuning_experiment`, which declares suggest -> mapped trials -> select best;
- ``plan.py``: :class:`TuningPlan`, what the builder declared, and the bodies of its tasks;
- ``settings.py``: what one DAG run uses (its seed, trial ids, Params form and Asset);
- ``warm_start_source.py``: the earlier run a warm start reads, ranked and turned into seeds.

These run in the Airflow worker (a task) and in the DAG processor (parsing).
"""

from __future__ import annotations

from airflow_trials.experiment.builder import (
    PARAM_SETTINGS,
    ExperimentDeadline,
    ExperimentSettings,
    TuningPlan,
    WarmStart,
    best_trial_asset,
    reconcile_trial_ends,
    run_seed,
    trial_ids,
    tuning_experiment,
)

__all__ = [
    "PARAM_SETTINGS",
    "ExperimentDeadline",
    "ExperimentSettings",
    "TuningPlan",
    "WarmStart",
    "best_trial_asset",
    "reconcile_trial_ends",
    "run_seed",
    "trial_ids",
    "tuning_experiment",
]
