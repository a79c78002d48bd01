"""Where a trial that ran before resumes: the newest checkpoint the trials DB records that is
complete on the storage.

The actors delete a dropped checkpoint only after the trials DB stopped naming it
(:meth:`~airflow_trials.core.checkpoint.CheckpointManager.release`), so the recorded newest is
there unless something else removed it (a bucket's lifecycle rule, a person). Such a checkpoint
is marked deleted and the next newest is taken: a missing checkpoint is the storage's matter and
never costs the trial one of its ``max_failures``.

Example::

    newest = resume_checkpoint(store, executor.storage, "t-3")
    if newest is not None:
        trial.checkpoint_manager.on_checkpoint(newest)   # restores from it; may drop it later
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from airflow_trials.core.checkpoint import CheckpointRecord

if TYPE_CHECKING:
    from airflow_trials.execution.storage import TrialStorage
    from airflow_trials.store import TrialStore

log = logging.getLogger(__name__)


def resume_checkpoint(store: TrialStore, storage: TrialStorage, trial_id: str) -> CheckpointRecord | None:
    """The newest of ``trial_id``'s recorded checkpoints that is complete on ``storage`` (its
    metadata file, written last, is there), or None when none is; each newer one that is not is
    marked deleted in the store, with a warning naming it."""
    for row in store.live_checkpoints(trial_id):
        if storage.has_checkpoint(row.path):
            return CheckpointRecord(row.path, row.iteration)
        log.warning(
            "Trial %s: its recorded checkpoint %s (iteration %d) is not on the storage; marking it deleted "
            "and resuming from an earlier one. Check what else deletes under the experiment's storage_path.",
            trial_id, row.path, row.iteration,
        )
        store.mark_checkpoint_deleted(trial_id, row.path)
    return None
