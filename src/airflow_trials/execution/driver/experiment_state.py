"""The runner's experiment state file: every trial's state, saved and loaded for ``resume=True``."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

from airflow_trials.core.status import TrialStatus
from airflow_trials.core.stopping import StopFn, Stopper
from airflow_trials.core.trial import Trial
from airflow_trials.exceptions import ExperimentStateError
from airflow_trials.storage.trial_storage import TrialStorage

log = logging.getLogger(__name__)

EXPERIMENT_STATE_FILE = "experiment_state.json"
_STATE_VERSION = 1


def state_path(storage: TrialStorage, experiment_name: str) -> str:
    return f"{storage.experiment_dir(experiment_name)}/{EXPERIMENT_STATE_FILE}"


def save_experiment_state(
    storage: TrialStorage, experiment_name: str, trials: Sequence[Trial]
) -> str:
    """Write every trial's state to ``<experiment_dir>/experiment_state.json``; returns the path."""
    state: dict[str, Any] = {
        "version": _STATE_VERSION,
        "experiment_name": experiment_name,
        "saved_at": time.time(),
        "trials": [t.to_json_state() for t in trials],
    }
    path = state_path(storage, experiment_name)
    storage.write_json(path, state)
    return path


def load_experiment_state(
    storage: TrialStorage,
    experiment_name: str,
    stop_criterion: Mapping[str, float] | StopFn | Stopper | None,
) -> list[Trial]:
    """The trials saved by :func:`save_experiment_state`, with their statuses as saved.

    Raises ExperimentStateError, naming the file and the fix, when there is none or it is
    unreadable.
    """
    path = state_path(storage, experiment_name)
    if not storage.exists(path):
        raise ExperimentStateError(
            f"Cannot resume experiment {experiment_name}: no saved state at {path}; "
            f"run it without resume=True first, or check storage_path."
        )
    try:
        state = storage.read_json(path)
        trials = [
            Trial.from_json_state(s, stopping_criterion=stop_criterion) for s in state["trials"]
        ]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ExperimentStateError(
            f"Cannot resume experiment {experiment_name}: its state file {path} is "
            f"unreadable ({e}); restore it from a backup or start the experiment afresh."
        ) from e
    log.info("Resumed experiment %s with %s trials from %s", experiment_name, len(trials), path)
    return trials


def trials_to_resume(
    storage: TrialStorage,
    experiment_name: str,
    stop_criterion: Mapping[str, float] | StopFn | Stopper | None,
    run_errored_only: bool,
) -> list[Trial]:
    """The saved trials, made ready to run again: RUNNING and PAUSED ones lost their actors and
    continue from their newest checkpoint (PENDING); with ``run_errored_only``, ERROR ones are
    reset to run again from their latest checkpoint; TERMINATED ones stay as they are."""
    trials = load_experiment_state(storage, experiment_name, stop_criterion)
    for trial in trials:
        if trial.status in (TrialStatus.RUNNING, TrialStatus.PAUSED):
            trial.set_status(TrialStatus.PENDING)
        elif trial.status == TrialStatus.ERROR and run_errored_only:
            trial.reset_for_rerun()
    return trials
