"""Seeds the trials store through the production write path.

Results and checkpoints go in as a trial's poller writes them: a
:class:`~airflow_trials.core.update.TrialUpdate` handed to ``TrialStore.record_progress``, so the
tests read back what production writes (each trial's maintained best, its last result, the run's
summary). A trial's other fields (failures, error, stop reason), which production writes with the
trial's end, and a metric's leaderboard index, which ``ensure_experiment`` makes, are set directly
by :func:`update_trial` and :func:`ensure_metric_index`: no production caller needs either alone.

Example::

    from tests.factories import add_checkpoint, add_results

    add_results(store, "t-1", [{"training_iteration": 1, "loss": 0.5}])
    add_checkpoint(store, "t-1", "/ckpt/t-1/1", 1, score=0.5)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from airflow_trials.core.update import KeptCheckpoint, TrialUpdate
from airflow_trials.store import TrialStore
from airflow_trials.store.experiments import ExperimentWriter
from airflow_trials.store.trial_writes import TrialWriter


def add_results(store: TrialStore, trial_id: str, results: Sequence[Mapping[str, Any]]) -> int:
    """Write a batch of the trial's results as its poller does; returns how many were new."""
    return store.record_progress([TrialUpdate(trial_id, results=results)])


def add_checkpoint(
    store: TrialStore, trial_id: str, path: str, iteration: int, score: float | None = None
) -> None:
    """Record a checkpoint the trial keeps, as its poller does."""
    kept = KeptCheckpoint(path, iteration, score)
    store.record_progress([TrialUpdate(trial_id, kept_checkpoints=[kept])])


def update_trial(store: TrialStore, trial_id: str, **fields: Any) -> None:
    """Set the trial's fields (``num_failures``, ``error_msg``, ``stop_reason``, ...), never its
    status (``TrialWriter.update_trial``)."""
    TrialWriter(store._db).update_trial(trial_id, **fields)


def ensure_metric_index(store: TrialStore, metric: str) -> None:
    """Create the leaderboard index of ``metric`` (``ensure_experiment`` does, given it)."""
    ExperimentWriter(store._db).ensure_metric_index(metric)
