"""SelfDrivingRun: a trial actor's autonomous mode, its trial driven to the end in a thread."""

from __future__ import annotations

import threading
import traceback
from dataclasses import dataclass
from typing import Any, Protocol

from airflow_trials.core import result as R
from airflow_trials.core.checkpoint import CheckpointRecord
from airflow_trials.core.fate import Action, after_result
from airflow_trials.core.status import TrialStatus
from airflow_trials.core.stop_kind import StopKind
from airflow_trials.core.trial import Trial
from airflow_trials.core.update import KeptCheckpoint, TrialUpdate
from airflow_trials.exceptions import (
    CheckpointNotFoundError,
    CheckpointStorageError,
    TrialError,
)
from airflow_trials.execution.actor_spec import HoldSpec
from airflow_trials.execution.worker.holds import Holds


class TrialHost(Protocol):
    """What a run needs of the actor that hosts it (``TrialActor``): the trial's ids, the steps
    that train, restore, save and stop its trainable, and the storage's mark of a drain."""

    trial_id: str
    experiment_name: str

    def train(self, run_ahead_below: int = 0) -> dict[str, Any]: ...

    def restore(self, path: str) -> int: ...

    def save(self) -> dict[str, Any] | None: ...

    def stop(self) -> None: ...

    def mark_drained(self, iteration: int | None) -> None: ...


class SelfDrivingRun:
    """One trial that its actor drives to the end by itself (the Airflow path), and the progress
    its watcher polls.

    The loop trains a result, asks ``core/fate.py`` ``after_result`` what follows, publishes the
    result and keeps its checkpoints; a drain (:meth:`drain`) pauses it after a checkpoint. With
    holds, it waits at each hold point for the verdict the trial's trigger gives (:meth:`decide`).
    The loop runs in a thread, so that the actor answers polls meanwhile; everything a poll reads
    is guarded by one lock.

    :param host: the actor hosting the trial; its ``train``, ``restore``, ``save`` and ``stop``
        are the loop's steps, and its ``trial_id`` and ``experiment_name`` name the trial.
    """

    def __init__(self, host: TrialHost) -> None:
        self._host = host
        self._lock = threading.Lock()
        self._loop: threading.Thread | None = None
        self._trial: Trial | None = None
        self._status = TrialStatus.PENDING
        self._results: list[dict[str, Any]] = []
        self._error: str | None = None
        # The trial could not start from its checkpoint (gone from storage): not its own failure.
        self._infrastructure = False
        self._stop_requested = False
        self._ended = threading.Event()  # set when the loop has ended
        # Set when a poll should answer at once: the loop ended, or it holds for a verdict.
        self._attention = threading.Event()
        self._holds: Holds | None = None
        # The result a hold published before after_result returned.
        self._published: int | None = None
        self._stop_reason: str | None = None
        self._scheduler_reason: str | None = None
        self._stop_kind: StopKind | None = None
        self._scheduler_kind = StopKind.SCHEDULER
        # A graceful stop's drain (:meth:`drain`): asked for, and the pause it ends in.
        self._drain_requested = False
        self._paused = threading.Event()
        self._resumed = threading.Event()
        self._checkpointed_at: int | None = None  # the iteration of the newest kept checkpoint

    def start(
        self, trial_state: dict[str, Any], restore_from: str | None, holds: HoldSpec | None
    ) -> None:
        """Start the loop in a thread (see ``TrialActor.run``); a second start does nothing."""
        if self._loop is not None:
            return
        self._trial = Trial.from_json_state(trial_state)
        self._holds = Holds.from_spec(holds)
        self._status = TrialStatus.RUNNING
        self._loop = threading.Thread(
            target=self._run_loop,
            args=(restore_from,),
            name=f"run-{self._host.trial_id}",
            daemon=True,
        )
        self._loop.start()

    def _run_loop(self, restore_from: str | None) -> None:
        trial, host = self._trial, self._host
        assert trial is not None
        status, error = TrialStatus.TERMINATED, None
        try:
            host.mark_drained(None)  # an earlier actor's pause is over: this one trains
            if restore_from:
                self._restore_or_give_up(restore_from)
            while not self._stop_requested:
                result = host.train()
                duplicate = bool(result.pop(R.DUPLICATE, False))
                decision = after_result(
                    trial,
                    result,
                    duplicate=duplicate,
                    scheduler=self._verdict if self._holds is not None else None,
                    scheduler_reason=lambda _: self._scheduler_reason,
                    scheduler_kind=lambda _: self._scheduler_kind,
                )
                if decision.fresh and self._published != result[R.TRAINING_ITERATION]:
                    self._publish(result)
                # After the result it came with: a poll never sees a checkpoint whose result it
                # does not see too, so a resume from the newest recorded one leaves no gap.
                if result.get(R.CHECKPOINT):
                    self._keep(
                        CheckpointRecord(result[R.CHECKPOINT], result[R.TRAINING_ITERATION], result)
                    )
                if decision.save_checkpoint:
                    self._save_and_keep()
                if decision.action is not Action.CONTINUE:
                    self._stop_reason = decision.reason
                    self._stop_kind = decision.stop_kind
                    break
                if self._drain_requested:
                    self._pause_drained(int(result[R.TRAINING_ITERATION]))
        except _CheckpointGone as e:
            status, error = TrialStatus.ERROR, str(e)
            self._infrastructure = True
        except TrialError as e:
            status, error = TrialStatus.ERROR, str(e)
            # The object store did not take a checkpoint: the storage's matter, not the trial's.
            if isinstance(e.__cause__, CheckpointStorageError):
                status, error = TrialStatus.ERROR, str(e.__cause__)
                self._infrastructure = True
        except CheckpointStorageError as e:
            status, error = TrialStatus.ERROR, str(e)
            self._infrastructure = True
        except Exception as e:  # a stopping criterion naming a missing metric, a storage failure
            status, error = (
                TrialStatus.ERROR,
                f"Trial {host.trial_id}: {e}\n{traceback.format_exc()}",
            )
        finally:
            host.stop()
            with self._lock:
                self._status, self._error = status, error
            self._ended.set()
            self._attention.set()

    def _restore_or_give_up(self, path: str) -> None:
        """Restore ``path``; a checkpoint that cannot be read from the storage is the storage's
        problem, not the trial's: it ends the loop as infrastructure, which the task's retry
        resumes from the newest checkpoint that exists, without counting a failure."""
        host = self._host
        try:
            host.restore(path)
        except TrialError as e:
            if not isinstance(e.__cause__, CheckpointNotFoundError):
                raise
            raise _CheckpointGone(
                f"Trial {host.trial_id} of experiment {host.experiment_name} could not start "
                f"from its checkpoint {path}: {e.__cause__}. Not a failure of the trial: its "
                "next try resumes it from the newest checkpoint that exists on the storage."
            ) from e

    def _publish(self, result: dict[str, Any]) -> None:
        with self._lock:
            self._results.append(result)
        self._published = result[R.TRAINING_ITERATION]

    def _verdict(self, trial: Trial, result: dict[str, Any]) -> str:
        """The scheduler's decision on a fresh result, as the trigger gives it: waited for at a
        hold point (the result is published first, so that the trigger sees it), else a STOP it
        gave earlier, else CONTINUE."""
        holds = self._holds
        assert holds is not None
        iteration = int(result[R.TRAINING_ITERATION])
        if holds.holds_at(result):
            self._publish(result)
            self._attention.set()
            try:
                decision, reason, kind = holds.hold(
                    iteration, float(result[holds.time_attr]), lambda: self._stop_requested
                )
            finally:
                if not self._ended.is_set():
                    self._attention.clear()
        else:
            decision, reason, kind = holds.told(iteration)
        self._scheduler_reason = reason
        self._scheduler_kind = kind
        return decision.value

    def decide(
        self,
        iteration: int,
        decision: str,
        reason: str | None = None,
        stop_kind: str = StopKind.SCHEDULER.value,
    ) -> bool:
        """Give the verdict on result ``iteration`` to the hold; False when it runs without."""
        if self._holds is None:
            return False
        self._holds.give(iteration, decision, reason, stop_kind)
        return True

    def request_stop(self) -> None:
        """End the loop (TERMINATED) after its current iteration, or at once from a hold."""
        self._stop_requested = True
        self._resumed.set()  # a paused loop ends too
        if self._holds is not None:
            self._holds.wake()

    # -- a graceful stop's drain -------------------------------------------------------------------
    def drain(self) -> DrainState:
        """Ask the loop to checkpoint after its current iteration and pause there, so that a
        stop that follows loses no reported result (``execution/driver/drain.py``); returns at
        once with where the loop is. Asking again only reads. A loop held for its scheduler's
        verdict pauses once the verdict came (the trigger still runs while the stack drains)."""
        if self._loop is not None and not self._ended.is_set():
            self._drain_requested = True
        with self._lock:
            last = self._trial.last_result if self._trial else None
        return DrainState(
            state=(
                "ended"
                if self._ended.is_set()
                else "paused"
                if self._paused.is_set()
                else "driven"
                if self._loop is None
                else "training"
            ),
            iteration=int(last[R.TRAINING_ITERATION]) if last else None,
            checkpoint_iteration=self._checkpointed_at,
        )

    def resume(self) -> None:
        """Let a drained loop train on (the stop it drained for was called off)."""
        self._drain_requested = False
        self._resumed.set()

    def _pause_drained(self, iteration: int) -> None:
        """Checkpoint ``iteration`` unless it has its checkpoint, then wait until resumed or
        stopped. The checkpoint's metadata holds the results since the previous one (the actor's
        ``_persist``), so a resume after the stop re-runs none of them. A function trainable
        cannot checkpoint on demand: its last reported checkpoint stays the newest."""
        if self._checkpointed_at != iteration:
            raw = self._host.save()
            record = CheckpointRecord.from_dict(raw) if raw is not None else None
            # A function trainable hands back the checkpoint it last reported: kept already.
            if record is not None and record.iteration != self._checkpointed_at:
                self._keep(record)
        # Its next try reads this actor gone as stopped with the stack, not as a failure.
        self._host.mark_drained(iteration)
        self._paused.set()
        self._resumed.wait()
        self._resumed.clear()
        self._paused.clear()
        self._host.mark_drained(None)

    def _save_and_keep(self) -> None:
        raw = self._host.save()
        if raw is not None:
            self._keep(CheckpointRecord.from_dict(raw))

    def _keep(self, record: CheckpointRecord) -> None:
        """Register a new checkpoint. Those it pushes out are not deleted here: the trials DB may
        still name one as the checkpoint to resume from, until its watcher records the kept set
        without it (:meth:`release`)."""
        assert self._trial is not None
        with self._lock:
            self._trial.checkpoint_manager.on_checkpoint(record)
        self._checkpointed_at = record.iteration

    def release(self, recorded_version: int) -> list[CheckpointRecord]:
        """The dropped checkpoints that no record names any more, now that the watcher wrote the
        kept set of ``recorded_version`` to the trials DB; the caller deletes them."""
        trial = self._trial
        if trial is None:
            return []
        with self._lock:
            return trial.checkpoint_manager.release(recorded_version)

    def wait(self, wait_s: float) -> None:
        """Wait up to ``wait_s`` for news a poll should have at once (an end, a hold)."""
        if wait_s > 0 and self._loop is not None:
            self._attention.wait(wait_s)

    def progress(self, trial_id: str, since: int) -> TrialUpdate:
        """The run's part of a poll's answer: its status, the results after the first
        ``since``, the checkpoints kept, its end and where it holds."""
        with self._lock:
            trial, status = self._trial, self._status
            manager = trial.checkpoint_manager if trial else None
            best = manager.best() if manager else None
            return TrialUpdate(
                trial_id,
                status=status,
                results=self._results[since:],
                num_results=len(self._results),
                last_result=scalar_fields(trial.last_result) if trial else None,
                kept_checkpoints=[
                    KeptCheckpoint(r.path, r.iteration, manager.score_value(r))
                    for r in manager.kept
                ]
                if manager
                else [],
                checkpoints_version=manager.version if manager else 0,
                best_checkpoint=best.path if best is not None else None,
                error=self._error,
                infrastructure=self._infrastructure,
                stop_reason=self._stop_reason if status is TrialStatus.TERMINATED else None,
                stop_kind=self._stop_kind if status is TrialStatus.TERMINATED else None,
                held_at=self._holds.held_at if self._holds is not None else None,
            )


@dataclass(frozen=True)
class DrainState:
    """Where a drained trial's loop is.

    ``state``: ``training`` (its current iteration runs on), ``paused`` (checkpointed and
    waiting), ``ended``, or ``driven`` (not self-driving: a runner or a sweep driver trains it,
    and it is not drained). ``iteration``: its last result's. ``checkpoint_iteration``: its
    newest checkpoint's (None: none yet). Paused or ended, what it reported is durable in its
    storage up to ``checkpoint_iteration``."""

    state: str
    iteration: int | None
    checkpoint_iteration: int | None

    @property
    def settled(self) -> bool:
        return self.state != "training"


class _CheckpointGone(Exception):
    """The checkpoint a trial was to start from cannot be read from the storage."""


def scalar_fields(result: dict[str, Any]) -> dict[str, Any]:
    """A result's plain values (numbers, strings, booleans, None): what a poll's last result and
    a checkpoint record carry."""
    return {k: v for k, v in result.items() if isinstance(v, (int, float, str, bool)) or v is None}
