"""RayTrialExecutor: the TrialRunner's executor, which starts, steps, pauses, saves and stops trials
as Ray actors.

The parts it is built from: :mod:`~airflow_trials.execution.driver.actor_client` (the one client
of trial actors, which the Airflow path uses alone: launch, attach, release, terminate, the
cluster's resources), :mod:`~airflow_trials.execution.driver.slots` (placement groups and the
actors in them, reused) and :mod:`~airflow_trials.execution.driver.cluster` (resource accounting).
"""

from __future__ import annotations

import logging
from typing import Any

import ray
from ray.actor import ActorHandle
from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

from airflow_trials.core.checkpoint import CheckpointRecord
from airflow_trials.core.resources import Resources
from airflow_trials.core.result import HANDED_OVER, Result
from airflow_trials.core.status import TrialStatus
from airflow_trials.core.trial import Trial
from airflow_trials.exceptions import CheckpointError, TrainableNotFoundError
from airflow_trials.execution.actor_spec import trial_spec
from airflow_trials.execution.driver.actor_client import TrialActorClient
from airflow_trials.execution.driver.errors import trial_error
from airflow_trials.execution.driver.hand_over import Successor
from airflow_trials.execution.driver.slots import Slot, SlotPool
from airflow_trials.execution.handles import DEFAULT_NAMESPACE

log = logging.getLogger(__name__)


class RayTrialExecutor:
    """Runs trials as Ray actors, one placement group each, one result at a time for the
    TrialRunner.

    It composes a :class:`TrialActorClient` (``actors``: the cluster's resources, the trial
    storage, and the Airflow path's ``launch``, ``attach``, ``release``, ``terminate``), which it
    shares with the runner. How the runner drives a trial through it (start, fetch, continue,
    pause, stop): the method table in docs/engine.md.

    :param queue_trials: let one trial start although the cluster lacks free resources now, so
        an autoscaler can add nodes; default False.
    :param reuse_actors: hand a finished trial's actor to the next trial with the same resources
        (via ``reset_config``); default False.
    :param reuse_placement_groups: keep a finished trial's placement group for the next trial with
        the same resources; default False (the TrialRunner turns it on).
    :param delete_checkpoints: delete a trial's checkpoints once it TERMINATED; default False.
    :param stop_timeout_s: how long a stopping trial's cleanup may take before its actor is
        killed; default 10.
    :param hand_over: with ``reuse_actors``, let a trial's actor start the next trial the
        runner names as soon as a result ends the trial, without waiting for the runner
        (execution/driver/hand_over.py); default True.

    ``storage_path``, ``refresh_period_s``, ``namespace``, ``detached``, ``capture_output`` and
    ``local_log_path`` are :class:`TrialActorClient`'s.
    """

    def __init__(
        self,
        storage_path: str | None = None,
        *,
        queue_trials: bool = False,
        reuse_actors: bool = False,
        reuse_placement_groups: bool = False,
        refresh_period_s: float = 1.0,
        namespace: str = DEFAULT_NAMESPACE,
        detached: bool = True,
        delete_checkpoints: bool = False,
        capture_output: bool = True,
        local_log_path: str | None = None,
        stop_timeout_s: float = 10.0,
        hand_over: bool = True,
    ) -> None:
        self.actors = TrialActorClient(
            storage_path,
            queue_trials=queue_trials,
            refresh_period_s=refresh_period_s,
            namespace=namespace,
            detached=detached,
            capture_output=capture_output,
            local_log_path=local_log_path,
        )
        self.storage = self.actors.storage
        self.ledger = self.actors.ledger
        # Unlike the client, the executor gives slots back, so it may cache them for reuse.
        self.slots = SlotPool(
            self.storage,
            namespace=namespace,
            detached=detached,
            capture_output=capture_output,
            reuse_actors=reuse_actors,
            reuse_placement_groups=reuse_placement_groups,
            stop_timeout_s=stop_timeout_s,
        )
        self.delete_checkpoints = delete_checkpoints
        self.hand_over = hand_over and reuse_actors
        self._slots: dict[str, Slot] = {}
        self._futures: dict[ray.ObjectRef, Trial] = {}
        self._future_of: dict[str, ray.ObjectRef] = {}
        self._restore_refs: dict[str, ray.ObjectRef] = {}
        # Hand-over (execution/driver/hand_over.py): the successor each in-flight call offers; the
        # trials whose actor ended them and took over their successor; the successors' slots,
        # until the runner starts them; the trials whose actor failed to hand over.
        self._offered: dict[str, Trial] = {}
        self._handed: dict[str, Trial] = {}
        self._handed_slots: dict[str, tuple[Trial, Slot]] = {}
        self._retired: set[str] = set()
        self.num_hand_overs = 0  # trials that started on the actor of the trial before them

    # -- status and metadata ---------------------------------------------------------------------
    def set_status(self, trial: Trial, status: TrialStatus) -> None:
        """Change the trial's status; a terminal status also persists the trial's metadata."""
        if trial.status == status:
            return
        log.debug("Trial %s: %s -> %s", trial.trial_id, trial.status, status)
        trial.set_status(status)
        if status.is_terminal():  # its metadata, read back by get_checkpoints
            path = self.storage.trial_dir(trial.experiment_name, trial.trial_id)
            self.storage.write_json(f"{path}/trial.json", trial.to_json_state())

    def get_checkpoints(self) -> dict[str, dict[str, Any]]:
        """Trial id -> the metadata persisted at its last terminal transition, read back from
        the storage (not kept in memory: a 100,000-trial sweep's driver stays flat)."""
        states = {}
        for trial_id, experiment_name in self.actors.experiment_of.items():
            path = f"{self.storage.trial_dir(experiment_name, trial_id)}/trial.json"
            if self.storage.exists(path):
                states[trial_id] = self.storage.read_json(path)
        return states

    # -- resources ---------------------------------------------------------------------------------
    def committed_resources(self) -> Resources:
        """What the trials this executor runs hold now."""
        return self.ledger.committed

    def has_resources(self, resources: Resources) -> bool:
        """Can a trial with ``resources`` start now, given what running trials hold?"""
        return self.ledger.has_resources(resources)

    def could_start(self, resources: Resources) -> bool:
        """:meth:`has_resources`, asked without effect (it may let one trial queue on Ray)."""
        return self.ledger.could_start(resources)

    # -- starting and stopping -------------------------------------------------------------------
    def start_trial(
        self,
        trial: Trial,
        checkpoint_path: str | None = None,
        train: bool = True,
        run_ahead_below: int = 0,
    ) -> bool:
        """Start (or resume) ``trial``, restoring from ``checkpoint_path`` or its newest checkpoint.
        ``run_ahead_below``: see :meth:`continue_training`. A trial that an ended trial's actor
        took over (:meth:`take_handed_over`) starts on that actor, already training.

        Returns False, with the trial in ERROR, when the trainable cannot be imported.
        Never blocks on Ray: placement, actor start and the first result all arrive later.
        """
        try:
            self.actors.check_trainable(trial)
        except TrainableNotFoundError as e:
            trial.error_msg = str(e)
            self.set_status(trial, TrialStatus.ERROR)
            log.error("Trial %s could not start: %s", trial.trial_id, e)
            return False
        self.actors.experiment_of[trial.trial_id] = trial.experiment_name
        handed = self._handed_slots.pop(trial.trial_id, None)
        slot = handed[1] if handed is not None else self.slots.acquire(trial)
        self._slots[trial.trial_id] = slot
        self.ledger.commit(trial.resources)
        source = checkpoint_path or trial.restore_source()
        if source is not None:
            assert slot.actor is not None
            self._restore_refs[trial.trial_id] = slot.actor.restore.remote(source)
        self.set_status(trial, TrialStatus.RUNNING)
        if train:
            self.continue_training(trial, run_ahead_below)
        return True

    def _release(self, trial: Trial, reusable: bool, ended: bool = False) -> None:
        """Take the trial's actor away from it: cache it for reuse, or kill it. ``ended``: the
        trial ends TERMINATED, so an actor that took over its successor keeps it for the
        successor's start."""
        ref = self._future_of.pop(trial.trial_id, None)
        if ref is not None:
            self._futures.pop(ref, None)
        self._offered.pop(trial.trial_id, None)  # an offer stands only while its call does
        successor = self._handed.pop(trial.trial_id, None)
        retired = trial.trial_id in self._retired
        self._retired.discard(trial.trial_id)
        self._restore_refs.pop(trial.trial_id, None)
        self._drop_handed_slot(trial.trial_id)  # it was to start on a handed-over actor
        slot = self._slots.pop(trial.trial_id, None)
        if slot is None:
            return
        self.ledger.free(trial.resources)
        if successor is not None and ended and reusable and ref is None:
            self._handed_slots[successor.trial_id] = (successor, slot)
            return
        # An actor that runs another trial than this one (its successor, which stays PENDING and
        # starts elsewhere), or failed to hand over, is killed.
        busy = ref is not None or successor is not None or retired
        self.slots.give_back(slot, reusable=reusable, idle=not busy)

    # -- hand-over ---------------------------------------------------------------------------------
    def can_take_over(self, trial: Trial) -> bool:
        """Could ``trial`` take over another trial's actor (its trainable imports here)? One that
        cannot is left to :meth:`start_trial`, which puts it in ERROR."""
        try:
            self.actors.check_trainable(trial)
        except TrainableNotFoundError:
            return False
        return True

    def reserved_trial_ids(self) -> set[str]:
        """The waiting trials an in-flight call offers as a successor, or that a handed-over actor
        runs already: none may start anywhere else."""
        if not (self._offered or self._handed or self._handed_slots):
            return set()
        return {
            *(t.trial_id for t in self._offered.values()),
            *(t.trial_id for t in self._handed.values()),
            *self._handed_slots,
        }

    def handed_over(self, trial: Trial) -> bool:
        """Did ``trial``'s last fetched result end it on its actor, which took over its
        successor?"""
        return trial.trial_id in self._handed

    def take_handed_over(self) -> list[Trial]:
        """The successors whose actor is theirs now (their offering trial ended): start each with
        :meth:`start_trial`, or give it up with :meth:`drop_handed_over`."""
        return [trial for trial, _ in self._handed_slots.values()]

    def drop_handed_over(self, trial: Trial) -> None:
        """``trial`` will not start on the actor that took it over: kill that actor (its
        placement group is kept for reuse)."""
        self._drop_handed_slot(trial.trial_id)

    def _drop_handed_slot(self, trial_id: str) -> None:
        handed = self._handed_slots.pop(trial_id, None)
        if handed is not None:
            self.slots.give_back(handed[1], reusable=True, idle=False)

    def has_cached_slots(self) -> bool:
        return self.slots.has_cached()

    def trim_cache(self, wanted: list[Resources]) -> None:
        """Drop cached actors and placement groups that no trial in ``wanted`` could reuse."""
        self.slots.trim(wanted)

    def stop_trial(self, trial: Trial, error: bool = False, error_msg: str | None = None) -> None:
        """Stop the trial and free its resources: TERMINATED, or ERROR with ``error_msg``."""
        self._release(trial, reusable=not error, ended=not error)
        if error:
            trial.error_msg = error_msg or trial.error_msg
            self.set_status(trial, TrialStatus.ERROR)
        else:
            self.set_status(trial, TrialStatus.TERMINATED)
            if self.delete_checkpoints:
                self.delete_trial_checkpoints(trial)

    def requeue_trial(self, trial: Trial) -> None:
        """Free a failed trial's resources and put it back to PENDING to retry from its
        checkpoint."""
        self._release(trial, reusable=False)
        self.set_status(trial, TrialStatus.PENDING)

    def pause_trial(self, trial: Trial, save: bool = True) -> None:
        """Checkpoint the RUNNING trial (unless not ``save``: it takes over another state, see
        execution/driver/exploit.py), release its actor and GPUs, and mark it PAUSED."""
        if trial.status != TrialStatus.RUNNING:
            raise ValueError(
                f"Cannot pause trial {trial.trial_id}: it is {trial.status}, not RUNNING."
            )
        if trial.trial_id in self._future_of:
            raise ValueError(
                f"Cannot pause trial {trial.trial_id} while a result is in flight; fetch it first."
            )
        if self.handed_over(trial):
            raise ValueError(
                f"Cannot pause trial {trial.trial_id}: it ended, and its actor took over trial "
                f"{self._handed[trial.trial_id].trial_id}."
            )
        if save and self.save(trial) is None:
            log.warning(
                "Trial %s has no checkpoint to pause on; when resumed it starts from scratch.",
                trial.trial_id,
            )
        self._release(trial, reusable=True)
        self.set_status(trial, TrialStatus.PAUSED)

    def unpause_trial(self, trial: Trial) -> None:
        """PAUSED -> PENDING, so the scheduler can start it again."""
        if trial.status != TrialStatus.PAUSED:
            raise ValueError(
                f"Cannot unpause trial {trial.trial_id}: it is {trial.status}, not PAUSED."
            )
        self.set_status(trial, TrialStatus.PENDING)

    def resume_trial(self, trial: Trial) -> bool:
        """Start a PAUSED trial now, from the checkpoint it was paused on."""
        if trial.status != TrialStatus.PAUSED:
            raise ValueError(
                f"Cannot resume trial {trial.trial_id}: it is {trial.status}, not PAUSED."
            )
        return self.start_trial(trial)

    def reset_trial(self, trial: Trial, new_config: dict[str, Any]) -> bool:
        """Give a RUNNING trial a new config in its live actor (``Trainable.reset_config``)."""
        slot = self._slots.get(trial.trial_id)
        if slot is None or slot.actor is None or trial.trial_id in self._future_of:
            return False
        trial.config = dict(new_config)
        ray.get(slot.actor.reset.remote(trial_spec(trial)))
        return True

    # -- results ---------------------------------------------------------------------------------
    def continue_training(
        self, trial: Trial, run_ahead_below: int = 0, successor: Successor | None = None
    ) -> None:
        """Ask the trial's actor for its next result; if that result's ``training_iteration`` is
        below ``run_ahead_below`` (``core.fate.run_ahead_below``), the actor trains the one after
        it at once, without waiting to be asked.

        With ``successor``, a result that is sure to end the trial is followed on the actor by the
        successor's start (execution/driver/hand_over.py); until the result is fetched, the
        successor is reserved (:meth:`reserved_trial_ids`)."""
        slot = self._slots[trial.trial_id]
        assert slot.actor is not None
        ref: ray.ObjectRef
        if successor is None:
            ref = slot.actor.train.remote(run_ahead_below)
        else:
            self._offered[trial.trial_id] = successor.trial
            ref = slot.actor.train.remote(
                run_ahead_below, trial_spec(successor.trial), successor.hand_over_from
            )
        self._futures[ref] = trial
        self._future_of[trial.trial_id] = ref

    def has_result_in_flight(self, trial: Trial) -> bool:
        return trial.trial_id in self._future_of

    def get_running_trials(self) -> list[Trial]:
        return list(self._futures.values())

    def get_next_available_trial(self, timeout_s: float | None = None) -> Trial | None:
        """Wait up to ``timeout_s`` for any trial's next result; None if none arrived."""
        if not self._futures:
            return None
        ready, _ = ray.wait(list(self._futures), num_returns=1, timeout=timeout_s)
        return self._futures[ready[0]] if ready else None

    def fetch_result(self, trial: Trial) -> Result:
        """The trial's ready result; raises TrialError with the remote traceback if it failed."""
        ref = self._pop_future(trial)
        offered = self._offered.pop(trial.trial_id, None)
        self._check_restore(trial)
        try:
            result: Result = ray.get(ref)
        except (RayTaskError, RayActorError) as e:
            raise trial_error(trial, e) from e
        return self._note_hand_over(trial, offered, result)

    async def async_fetch_result(self, trial: Trial) -> Result:
        """Like fetch_result, awaiting the ObjectRef so an asyncio event loop is never blocked."""
        ref = self._future_of[trial.trial_id]
        try:
            result: Result = await ref
        except (RayTaskError, RayActorError) as e:
            self._pop_future(trial)
            self._offered.pop(trial.trial_id, None)
            raise trial_error(trial, e) from e
        self._pop_future(trial)
        offered = self._offered.pop(trial.trial_id, None)
        self._check_restore(trial)
        return self._note_hand_over(trial, offered, result)

    def _note_hand_over(self, trial: Trial, offered: Trial | None, result: Result) -> Result:
        """Take the actor's ``HANDED_OVER`` out of ``result``: whether it ended ``trial`` and took
        over ``offered``, or failed to (its actor is then retired when the trial ends)."""
        handed = result.pop(HANDED_OVER, None)
        if handed is None:
            return result
        if offered is not None and handed.get("trial_id") == offered.trial_id:
            self._handed[trial.trial_id] = offered
            self.num_hand_overs += 1
            log.debug("Trial %s ended; its actor took over trial %s", trial.trial_id, offered)
        else:
            self._retired.add(trial.trial_id)
            log.warning(
                "Trial %s ended, but its actor did not take over trial %s: %s",
                trial.trial_id,
                None if offered is None else offered.trial_id,
                handed.get("error"),
            )
        return result

    def _pop_future(self, trial: Trial) -> ray.ObjectRef:
        ref = self._future_of.pop(trial.trial_id)
        self._futures.pop(ref, None)
        return ref

    def _check_restore(self, trial: Trial) -> None:
        ref = self._restore_refs.pop(trial.trial_id, None)
        if ref is None:
            return
        try:
            ray.get(ref, timeout=0)
        except GetTimeoutError:
            # Restore runs before train on the same actor, so it finished if train did.
            self._restore_refs[trial.trial_id] = ref
        except (RayTaskError, RayActorError) as e:
            raise trial_error(trial, e, "restoring from its checkpoint") from e

    # -- checkpoints -----------------------------------------------------------------------------
    def save(self, trial: Trial) -> CheckpointRecord | None:
        """Persist the RUNNING trial's state now; registers and returns the checkpoint (None if
        none)."""
        slot = self._slots.get(trial.trial_id)
        if slot is None or slot.actor is None or self.handed_over(trial):
            raise ValueError(
                f"Cannot save trial {trial.trial_id}: it has no live actor ({trial.status})."
            )
        try:
            raw: Any = ray.get(slot.actor.save.remote())
        except (RayTaskError, RayActorError) as e:
            raise trial_error(trial, e, "saving a checkpoint") from e
        if raw is None:
            return None
        record = CheckpointRecord.from_dict(raw)
        self.register_checkpoint(trial, record)
        return record

    def register_checkpoint(self, trial: Trial, record: CheckpointRecord) -> None:
        """Add a persisted checkpoint to the trial. Those it pushes out are retired, not deleted:
        the runner deletes them once no record names them (``execution/driver/releaser.py``)."""
        trial.checkpoint_manager.on_checkpoint(record)

    def restore(self, trial: Trial, checkpoint_path: str | None = None) -> None:
        """Load ``checkpoint_path`` (default: the trial's newest) into its live actor."""
        slot = self._slots.get(trial.trial_id)
        source = checkpoint_path or trial.restore_source()
        if slot is None or slot.actor is None or source is None:
            raise ValueError(
                f"Cannot restore trial {trial.trial_id}: no live actor or no checkpoint."
            )
        try:
            ray.get(slot.actor.restore.remote(source))
        except (RayTaskError, RayActorError) as e:
            raise trial_error(trial, e, "restoring from its checkpoint") from e

    def copy_checkpoint(self, src: Trial, tgt: Trial) -> CheckpointRecord:
        """Copy ``src``'s newest checkpoint to ``tgt``, which then starts from it (Syne Tune's
        copy_checkpoint)."""
        newest = src.checkpoint
        if newest is None:
            raise CheckpointError(
                f"Trial {src.trial_id} has no checkpoint to copy to trial {tgt.trial_id}; "
                "checkpoint it first (checkpoint_freq, checkpoint_at_end or "
                "report(checkpoint=...))."
            )
        path = self.storage.copy_checkpoint(
            newest.path, tgt.experiment_name, tgt.trial_id, newest.iteration
        )
        record = CheckpointRecord(path, newest.iteration, newest.metrics)
        self.register_checkpoint(tgt, record)
        return record

    def delete_trial_checkpoints(self, trial: Trial) -> None:
        for record in trial.checkpoint_manager.clear():
            self.storage.delete(record.path)

    # -- actors ------------------------------------------------------------------------------------
    def get_actor(self, trial: Trial) -> ActorHandle | None:
        slot = self._slots.get(trial.trial_id)
        return None if slot is None else slot.actor

    def cleanup(self) -> None:
        """Kill every actor and remove every placement group this executor created."""
        for trial_id in list(self._slots):
            SlotPool.destroy(self._slots.pop(trial_id))
        for _, slot in self._handed_slots.values():
            SlotPool.destroy(slot)
        self._handed_slots.clear()
        self._offered.clear()
        self._handed.clear()
        self._retired.clear()
        self.slots.evict()
        self._futures.clear()
        self._future_of.clear()
        self._restore_refs.clear()
        self.ledger.committed = Resources(cpu=0)
