"""Where a trial that ran before resumes: its newest complete checkpoint on the storage, with
every result up to it in the trials DB.

The storage is the record of a trial's progress, and the trials DB catches up. Each checkpoint's
metadata, written last, carries the results since the trial's previous checkpoint
(``TrialActor._persist``), so results are durable when their checkpoint is. A trial that trained
on while nobody recorded it (Airflow stopped, the triggerer down, a sweep's driver gone) left
checkpoints the trials DB never heard of: :func:`backfill_saved_progress` writes their results and
the checkpoints themselves, once, through the one write path, as far as the chain of results runs
without a gap from what the DB holds. The checkpoints the lost actor had dropped and not deleted yet
are deleted (:func:`delete_leftover_checkpoints`). Then the recorded checkpoints are adopted as
before.

The actors delete a dropped checkpoint only after the trials DB stopped naming it
(:meth:`~airflow_trials.core.checkpoint.CheckpointManager.release`), so the recorded ones are
there unless something else removed them (a bucket's lifecycle rule, a person). Such a checkpoint
is marked deleted and the next newest is taken: a missing checkpoint is the storage's matter and
never costs the trial one of its ``max_failures``.

The trial takes the recorded checkpoints over as its own kept set, oldest first, so that its keep
policy goes on where the lost incarnation left it: the best-scoring one stays the best, and one
too many (a drop the trials DB never heard of) is dropped and deleted like any other.

Example::

    newest = adopt_checkpoints(trial, store, client.storage)
    executor.launch(trial)        # restores trial.restore_source(): that newest checkpoint
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from airflow_trials.core import result as R
from airflow_trials.core.checkpoint import CheckpointRecord
from airflow_trials.core.update import KeptCheckpoint, TrialUpdate
from airflow_trials.storage.trial_storage import RESULTS_KEY

if TYPE_CHECKING:
    from airflow_trials.core.trial import Trial
    from airflow_trials.storage.trial_storage import TrialStorage
    from airflow_trials.store import TrialStore

log = logging.getLogger(__name__)


def adopt_checkpoints(
    trial: Trial, store: TrialStore, storage: TrialStorage
) -> CheckpointRecord | None:
    """Backfill what the trial's storage holds past the trials DB
    (:func:`backfill_saved_progress`), delete what its lost actor dropped and left
    (:func:`delete_leftover_checkpoints`), then adopt the recorded checkpoints
    (:func:`adopt_recorded_checkpoints`); returns the newest, which the trial restores from."""
    backfill_saved_progress(trial, store, storage)
    delete_leftover_checkpoints(trial, store, storage)
    return adopt_recorded_checkpoints(trial, store, storage)


def backfill_saved_progress(trial: Trial, store: TrialStore, storage: TrialStorage) -> int:
    """Record the trial's complete checkpoints newer than its newest recorded one, with the
    results their metadata carries past the trials DB's last result, in one write; returns how
    many results it wrote. Results the DB holds are never written again (:func:`saved_progress`
    says which checkpoints count)."""
    recorded = store.reader.live_checkpoints(trial.trial_id)  # newest first
    last = store.reader.get_trial(trial.trial_id).last_result or {}
    results, kept = saved_progress(
        trial,
        storage,
        covered=int(last.get(R.TRAINING_ITERATION, 0)),
        after=recorded[0].iteration if recorded else 0,
    )
    if not kept:
        return 0
    store.record_progress([TrialUpdate(trial.trial_id, results=results, kept_checkpoints=kept)])
    _log_backfill(trial, results, kept)
    return len(results)


def delete_leftover_checkpoints(
    trial: Trial, store: TrialStore, storage: TrialStorage
) -> list[str]:
    """Delete the trial's checkpoints on the storage that the trials DB does not name and that
    are older than the newest one it names; returns their paths.

    They are what a lost actor had dropped and not deleted yet: an actor deletes a dropped
    checkpoint only once a poll tells it that the trials DB recorded its kept set without it
    (:meth:`~airflow_trials.core.checkpoint.CheckpointManager.release`), and one lost before that
    poll leaves them, whether the DB recorded the drop or never heard of them; nothing else would
    ever delete them. Nothing can name them: the trial resumes from the newest recorded one, after
    the backfill (:func:`backfill_saved_progress`) has recorded every complete newer one. The
    newer ones left unrecorded (cut short, or past a gap) stay: the resumed trial writes them
    again."""
    live = store.reader.live_checkpoints(trial.trial_id)  # newest first
    if not live:
        return []
    named = {row.path for row in live}
    on_storage = storage.checkpoint_dirs(trial.experiment_name, trial.trial_id)
    leftovers = [
        path
        for iteration, path in sorted(on_storage.items())
        if iteration < live[0].iteration and path not in named
    ]
    deleted = storage.delete_released(trial.trial_id, leftovers)
    if deleted:
        log.info(
            "Trial %s: deleted %d checkpoint(s) that its lost actor had dropped and left on the "
            "storage: %s",
            trial.trial_id,
            len(deleted),
            ", ".join(deleted),
        )
    return deleted


def adopt_saved_progress(trial: Trial, storage: TrialStorage) -> list[dict]:
    """The runner's resume (``TrialRunner(resume=True)``, whose experiment state is saved every
    ``checkpoint_period_s``): take the trial's complete checkpoints newer than the state names as
    its own, and its results up to them as recorded (``Trial.record_result``); returns those
    results, for the runner to hand its callbacks (the trials DB's among them)."""
    newest = trial.checkpoint
    results, kept = saved_progress(
        trial,
        storage,
        covered=trial.last_recorded_iteration,
        after=newest.iteration if newest else 0,
    )
    by_iteration = {int(r[R.TRAINING_ITERATION]): r for r in results}
    for result in results:
        trial.record_result(result)
    for checkpoint in kept:
        metrics = by_iteration.get(checkpoint.iteration, {})
        trial.checkpoint_manager.on_checkpoint(
            CheckpointRecord(checkpoint.path, checkpoint.iteration, metrics)
        )
    if kept:
        _log_backfill(trial, results, kept)
    return results


def saved_progress(
    trial: Trial, storage: TrialStorage, covered: int, after: int
) -> tuple[list[dict], list[KeptCheckpoint]]:
    """The trial's complete checkpoints on ``storage`` past iteration ``after``, oldest first,
    and the results their metadata carries past iteration ``covered`` (what the caller's record
    holds). It stops at the first checkpoint whose results leave a gap after ``covered`` (its
    actor kept no more than ``UNSAVED_RESULTS_MAX``): no checkpoint past a gap is taken, so none
    is resumed from."""
    results: list[dict] = []
    kept: list[KeptCheckpoint] = []
    for path, meta in storage.saved_checkpoints(trial.experiment_name, trial.trial_id, after):
        iteration = int(meta.get("iteration", 0))
        saved = meta.get(RESULTS_KEY, ())
        new = [r for r in saved if int(r[R.TRAINING_ITERATION]) > covered]
        if [int(r[R.TRAINING_ITERATION]) for r in new] != list(range(covered + 1, iteration + 1)):
            break  # a gap: this checkpoint's results do not follow on from what is recorded
        results += new
        own: dict = next((r for r in saved if int(r[R.TRAINING_ITERATION]) == iteration), {})
        kept.append(KeptCheckpoint(path, iteration, _score(trial, own)))
        covered = max(covered, iteration)
    return results, kept


def _log_backfill(trial: Trial, results: list[dict], kept: list[KeptCheckpoint]) -> None:
    log.info(
        "Trial %s: took %d result(s) and %d checkpoint(s), up to iteration %d, that its storage "
        "held and its record did not (it trained on while nobody recorded it).",
        trial.trial_id,
        len(results),
        len(kept),
        kept[-1].iteration,
    )


def _score(trial: Trial, result: dict) -> float | None:
    """The value that ranks a checkpoint taken with ``result``, as its actor's keep rule reads
    it."""
    iteration = int(result.get(R.TRAINING_ITERATION, 0))
    return trial.checkpoint_manager.score_value(CheckpointRecord("", iteration, result))


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
