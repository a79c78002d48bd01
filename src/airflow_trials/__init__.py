"""airflow_trials: hyperparameter tuning on Ray, run as Apache Airflow DAGs.

Importing this package loads neither Ray nor Airflow; the Ray-facing classes are imported on
first use, so parsing a DAG file stays cheap.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from airflow_trials.core.callback import Callback
from airflow_trials.core.checkpoint import CheckpointManager, CheckpointRecord
from airflow_trials.core.parameters import TrainableWithParameters, with_parameters
from airflow_trials.core.resources import (
    InsufficientResourcesError,
    PlacementGroupFactory,
    Resources,
)
from airflow_trials.core.scheduler import Decision, FIFOScheduler, TrialScheduler
from airflow_trials.core.searcher import ConcurrencyLimiter, Searcher
from airflow_trials.core.status import TrialStatus
from airflow_trials.core.stopping import Stopper
from airflow_trials.core.train_resources import RayTrainResources
from airflow_trials.core.trial import Trial
from airflow_trials.core.warm_start import WarmStart
from airflow_trials.exceptions import (
    AirflowTrialsError,
    CheckpointError,
    CheckpointNotFoundError,
    CheckpointStorageError,
    ExperimentNotFoundError,
    ExperimentStateError,
    InvalidTransitionError,
    RegressionError,
    RunnerFinishedError,
    SearcherError,
    StoreError,
    TrainableNotFoundError,
    TrialError,
    TrialNotFoundError,
)
from airflow_trials.execution.trainable_api import Trainable
from airflow_trials.execution.worker.trainable import (
    get_checkpoint,
    get_trial_id,
    get_trial_resources,
    report,
)
from airflow_trials.schedulers.asha.async_hyperband import ASHAScheduler, AsyncHyperBandScheduler
from airflow_trials.schedulers.hyperband import HyperBandScheduler
from airflow_trials.schedulers.median.median_stopping import MedianStoppingRule
from airflow_trials.schedulers.moasha.moasha_scheduler import MOASHA
from airflow_trials.schedulers.pbt.pbt_scheduler import Exploit, PopulationBasedTraining
from airflow_trials.storage.trial_storage import load_checkpoint

__version__ = "0.1.0"

if TYPE_CHECKING:
    from airflow_trials.execution.driver.executor import RayTrialExecutor
    from airflow_trials.execution.driver.runner import TrialRunner
    from airflow_trials.execution.driver.trials_db_callback import TrialsDbCallback
    from airflow_trials.execution.handles import find_trial_actor
    from airflow_trials.results import ResultGrid, TrialResult
    from airflow_trials.searchers.optuna_search import OptunaSearch

_LAZY = {
    "RayTrialExecutor": "airflow_trials.execution.driver.executor",
    "find_trial_actor": "airflow_trials.execution.handles",
    "TrialRunner": "airflow_trials.execution.driver.runner",
    "TrialsDbCallback": "airflow_trials.execution.driver.trials_db_callback",
    "ResultGrid": "airflow_trials.results",
    "TrialResult": "airflow_trials.results",
    "OptunaSearch": "airflow_trials.searchers.optuna_search",
    "TrialReportCallback": "airflow_trials.execution.worker.ray_train",
    "trial_scaling_config": "airflow_trials.execution.worker.ray_train",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'airflow_trials' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def get_provider_info() -> dict[str, Any]:
    """Provider metadata read by Airflow through the ``apache_airflow_provider`` entry point.

    It follows Airflow's ``provider_info.schema.json`` (tests/airflow/test_provider_info.py checks
    it, and that every module defining an operator, a sensor or a trigger is listed). ``config``
    declares the ``[airflow_trials]`` settings that ``airflow config list`` shows
    (:mod:`airflow_trials.provider_config`).
    """
    from airflow_trials.provider_config import provider_config

    return {
        "package-name": "airflow-trials",
        "name": "Airflow Trials",
        "description": "Hyperparameter-tuning experiments on Ray, run as Airflow DAGs.",
        "versions": [__version__],
        "connection-types": [
            {"connection-type": "ray", "hook-class-name": "airflow_trials.hooks.trials.RayHook"},
            {
                "connection-type": "trials_db",
                "hook-class-name": "airflow_trials.hooks.trials.TrialsDbHook",
            },
        ],
        "hooks": _modules_of("airflow_trials.hooks.trials"),
        "operators": _modules_of(
            "airflow_trials.operators.trial_operator",
            "airflow_trials.operators.sweep_operator",
        ),
        "sensors": _modules_of("airflow_trials.sensors.trial_sensor"),
        "triggers": _modules_of(
            "airflow_trials.triggers.trial_trigger",
            "airflow_trials.triggers.sweep_trigger",
            "airflow_trials.triggers.dataset_version_trigger",
        ),
        # The callback of tuning_experiment(deadline=...)'s Deadline Alert (experiment/deadline.py).
        "notifications": ["airflow_trials.triggers.deadline_notifier.ExperimentDeadlineNotifier"],
        "extra-links": [
            "airflow_trials.operators.links.TrialDashboardLink",
            "airflow_trials.operators.links.SweepDashboardLink",
        ],
        "config": provider_config(),
        "plugins": [
            {
                "name": "airflow_trials_dashboard",
                "plugin-class": "airflow_trials.plugins.dashboard.TrialsDashboardPlugin",
            }
        ],
        "integrations": [
            {
                "integration-name": "Airflow Trials",
                "external-doc-url": "https://docs.ray.io/",
                "tags": ["software"],
            }
        ],
    }


def _modules_of(*modules: str) -> list[dict[str, Any]]:
    """One kind's entry of the provider info: its modules, all of the one integration."""
    return [{"integration-name": "Airflow Trials", "python-modules": list(modules)}]


__all__ = [
    "ASHAScheduler",
    "AirflowTrialsError",
    "AsyncHyperBandScheduler",
    "Callback",
    "CheckpointError",
    "CheckpointNotFoundError",
    "CheckpointStorageError",
    "CheckpointManager",
    "CheckpointRecord",
    "ConcurrencyLimiter",
    "Decision",
    "ExperimentNotFoundError",
    "ExperimentStateError",
    "Exploit",
    "FIFOScheduler",
    "HyperBandScheduler",
    "InsufficientResourcesError",
    "InvalidTransitionError",
    "MOASHA",
    "MedianStoppingRule",
    "OptunaSearch",
    "PlacementGroupFactory",
    "RayTrainResources",
    "PopulationBasedTraining",
    "RayTrialExecutor",
    "RegressionError",
    "Resources",
    "ResultGrid",
    "RunnerFinishedError",
    "Searcher",
    "SearcherError",
    "Stopper",
    "StoreError",
    "Trainable",
    "TrainableNotFoundError",
    "TrainableWithParameters",
    "Trial",
    "TrialError",
    "TrialNotFoundError",
    "TrialResult",
    "TrialRunner",
    "TrialScheduler",
    "TrialStatus",
    "TrialReportCallback",
    "TrialsDbCallback",
    "WarmStart",
    "__version__",
    "find_trial_actor",
    "get_checkpoint",
    "load_checkpoint",
    "get_provider_info",
    "get_trial_id",
    "get_trial_resources",
    "trial_scaling_config",
    "report",
    "with_parameters",
]
