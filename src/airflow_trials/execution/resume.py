"""Where a trial that ran before resumes: the checkpoints the trials DB records that are complete
on the storage, the newest of them to restore from.

The actors delete a dropped checkpoint only after the trials DB stopped naming it
(:meth:`~airflow_trials.core.checkpoint.CheckpointManager.release`), so the recorded ones are
there unless something else removed them (a bucket's lifecycle rule, a person). Such a checkpoint
is marked deleted and the next newest is taken: a missing checkpoint is the storage's matter and
never costs the trial one of its ``max_failures``.

The trial takes the recorded checkpoints over as its own kept set, oldest first, so that its keep
policy goes on where the lost incarnation left it: the best-scoring one stays the best, and one
too many (a drop the trials DB never heard of) is dropped and deleted like any other.

Example::

    newest = adopt_recorded_checkpoints(trial, store, executor.storage)
    executor.launch(trial)        # restores trial.restore_source(): that newest checkpoint
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from airflow_trials.core.checkpoint import CheckpointRecord

if TYPE_CHECKING:
    from airflow_trials.core.trial import Trial
    from airflow_trials.storage.trial_storage import TrialStorage
    from airflow_trials.store import TrialStore

log = logging.getLogger(__name__)


def adopt_recorded_checkpoints(
    trial: Trial, store: TrialStore, storage: TrialStorage
) -> CheckpointRecord | None:
    """Give ``trial`` the checkpoints the trials DB records for it (not deleted) that are complete
    on ``storage`` (their metadata file, written last, is there), as its kept set; returns the
    newest, which the trial restores from, or None when there is none. Each recorded one that is
    not on the storage is marked deleted in the store, with a warning naming it."""
    attr = trial.checkpoint_score_attr
    adopted = []
    for row in store.reader.live_checkpoints(trial.trial_id):  # newest first
        if not storage.has_checkpoint(row.path):
            log.warning(
                "Trial %s: its recorded checkpoint %s (iteration %d) is not on the storage; "
                "marking it "
                "deleted and resuming from an earlier one. Check what else deletes under the "
                "experiment's "
                "storage_path.",
                trial.trial_id,
                row.path,
                row.iteration,
            )
            store.mark_checkpoint_deleted(trial.trial_id, row.path)
            continue
        metrics = {attr.removeprefix("min-"): row.score} if attr and row.score is not None else {}
        adopted.append(CheckpointRecord(row.path, row.iteration, metrics))
    for record in reversed(adopted):
        trial.checkpoint_manager.on_checkpoint(record)
    return trial.checkpoint
