"""RayTrialExecutor: starts, stops, pauses, saves and restores trials as Ray actors in placement groups."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import ray
from ray.actor import ActorHandle
from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError
from ray.util.placement_group import (
    PlacementGroup,
    placement_group,
    remove_placement_group,
)
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from airflow_trials.core.checkpoint import CheckpointRecord
from airflow_trials.core.resources import Resources
from airflow_trials.core.result import Result
from airflow_trials.core.status import TrialStatus
from airflow_trials.core.trial import Trial
from airflow_trials.exceptions import (
    CheckpointError,
    InsufficientResourcesError,
    TrainableNotFoundError,
    TrialError,
)
from airflow_trials.execution.actor import TrialActor, TrialSpec
from airflow_trials.execution.ray_state import (
    actor_info,
    actor_info_by_id,
    kill_actor,
    remove_placement_group_by_id,
    remove_placement_groups_named,
)
from airflow_trials.execution.storage import TrialStorage
from airflow_trials.execution.trainable import load_trainable

log = logging.getLogger(__name__)

DEFAULT_NAMESPACE = "airflow_trials"
_RemoteTrialActor = ray.remote(TrialActor)


def actor_name(experiment_name: str, trial_id: str) -> str:
    """The Ray actor name of a trial; with its namespace, another process finds the trial by id."""
    return f"trial.{experiment_name}.{trial_id}"


def find_trial_actor(
    experiment_name: str, trial_id: str, namespace: str = DEFAULT_NAMESPACE
) -> ActorHandle | None:
    """The live actor of a trial started by any process, or None when there is none."""
    try:
        return ray.get_actor(actor_name(experiment_name, trial_id), namespace=namespace)
    except ValueError:
        return None


@dataclass
class _Slot:
    """A placement group, and the actor in it when there is one; cached between trials for reuse."""

    resources: Resources
    pg: PlacementGroup | None
    actor: ActorHandle | None = None


class RayTrialExecutor:
    """Runs trials as Ray actors, one placement group each.

    Lifecycle of a trial through the executor::

        executor = RayTrialExecutor(storage_path="/shared/results")
        trial = Trial("my_pkg.train:train", {"lr": 0.1}, resources={"cpu": 1, "gpu": 0.5})
        if executor.has_resources(trial.resources):
            executor.start_trial(trial)               # PENDING -> RUNNING, first train() in flight
        ready = executor.get_next_available_trial()   # blocks up to a timeout for any result
        result = executor.fetch_result(ready)         # raises TrialError if the trial failed
        executor.continue_training(ready)             # ask for the next result ...
        executor.pause_trial(ready)                   # ... or checkpoint and free its GPUs
        executor.start_trial(ready)                   # resume from that checkpoint
        executor.stop_trial(ready)                    # -> TERMINATED, metadata persisted
        executor.cleanup()                            # kill every actor and placement group

    :param storage_path: local directory or fsspec URL for checkpoints and trial metadata; default
        ``$AIRFLOW_TRIALS_STORAGE`` or ``~/airflow_trials_results``.
    :param queue_trials: let one trial start although the cluster lacks free resources now, so
        an autoscaler can add nodes; default False.
    :param reuse_actors: hand a finished trial's actor to the next trial with the same resources
        (via ``reset_config``); default False.
    :param reuse_placement_groups: keep a finished trial's placement group for the next trial with
        the same resources; default False (the TrialRunner turns it on).
    :param refresh_period_s: how often cluster totals are re-read from Ray; default 1.
    :param namespace: Ray namespace of the named actors; default ``"airflow_trials"``.
    :param detached: create detached named actors that outlive this process, so another process
        (the Airflow trigger) can find a trial by id; default True.
    :param delete_checkpoints: delete a trial's checkpoints once it TERMINATED; default False.
    :param capture_output: write each trial's stdout/stderr to files; default True.
    :param local_log_path: where those files go; default the storage root when it is local.
    :param stop_timeout_s: how long a stopping trial's cleanup may take before its actor is
        killed; default 10.
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
    ) -> None:
        self.storage = TrialStorage(storage_path, local_log_path)
        self.queue_trials = queue_trials
        self.reuse_actors = reuse_actors
        self.reuse_placement_groups = reuse_placement_groups or reuse_actors
        self.refresh_period_s = refresh_period_s
        self.namespace = namespace
        self.detached = detached
        self.delete_checkpoints = delete_checkpoints
        self.capture_output = capture_output
        self.stop_timeout_s = stop_timeout_s

        self._slots: dict[str, _Slot] = {}
        self._cache: list[_Slot] = []
        self._futures: dict[ray.ObjectRef, Trial] = {}
        self._future_of: dict[str, ray.ObjectRef] = {}
        self._restore_refs: dict[str, ray.ObjectRef] = {}
        self._experiment_of: dict[str, str] = {}
        self._trainables_checked: set[str] = set()
        self._committed = Resources(cpu=0)
        self._total = Resources(cpu=0)
        self._last_refresh = float("-inf")
        self._trial_queued = False
        self._trial_states: dict[str, dict[str, Any]] = {}

    # -- status and metadata ---------------------------------------------------------------------
    def set_status(self, trial: Trial, status: TrialStatus) -> None:
        """Change the trial's status; a terminal status also persists the trial's metadata."""
        if trial.status == status:
            return
        log.debug("Trial %s: %s -> %s", trial.trial_id, trial.status, status)
        trial.set_status(status)
        if status.is_terminal():
            self.persist_metadata(trial)

    def persist_metadata(self, trial: Trial) -> None:
        state = trial.to_json_state()
        self._trial_states[trial.trial_id] = state
        path = self.storage.trial_dir(trial.experiment_name, trial.trial_id)
        self.storage.write_json(f"{path}/trial.json", state)

    def get_checkpoints(self) -> dict[str, dict[str, Any]]:
        """Trial id -> the metadata persisted at its last terminal transition."""
        return dict(self._trial_states)

    # -- resources ---------------------------------------------------------------------------------
    def refresh_cluster_resources(self, force: bool = False) -> None:
        """Re-read the cluster's totals from Ray if ``refresh_period_s`` passed (or ``force``)."""
        now = time.monotonic()
        if force or now - self._last_refresh >= self.refresh_period_s:
            self._total = Resources.from_ray(ray.cluster_resources())
            self._last_refresh = now

    def cluster_resources(self) -> Resources:
        """Everything the live cluster has, re-read at most every ``refresh_period_s``."""
        self.refresh_cluster_resources()
        return self._total

    def committed_resources(self) -> Resources:
        """What the trials this executor runs hold now."""
        return self._committed

    def fits_cluster(self, resources: Resources) -> bool:
        """Could ``resources`` ever be granted on this cluster, with nothing else running?"""
        return resources.fits_in(self.cluster_resources())

    def check_fits_cluster(self, trial: Trial) -> None:
        """Raise InsufficientResourcesError if the trial can never fit (unless queue_trials)."""
        if self.queue_trials or self.fits_cluster(trial.resources):
            return
        total = self.cluster_resources()
        missing = ", ".join(f"{k} by {v:g}" for k, v in trial.resources.shortfall(total).items())
        raise InsufficientResourcesError(
            f"Trial {trial.trial_id} of experiment {trial.experiment_name} needs "
            f"{trial.resources.summary_string()} but the Ray cluster has {total.summary_string()} "
            f"in total (short of {missing}); lower the trial's resources, add nodes, or pass "
            f"queue_trials=True on an autoscaling cluster."
        )

    def has_resources(self, resources: Resources) -> bool:
        """Can a trial with ``resources`` start now, given what running trials hold?"""
        self.refresh_cluster_resources()
        if resources.fits_in(self._total - self._committed):
            self._trial_queued = False
            return True
        if self.queue_trials and not self._trial_queued:
            # One trial may wait in Ray's queue for the autoscaler; more would only pile up.
            self._trial_queued = True
            log.warning(
                "Starting a trial needing %s although the cluster has only %s free; it waits for "
                "the autoscaler to add resources.",
                resources,
                self._total - self._committed,
            )
            return True
        return False

    def resource_string(self) -> str:
        total = self.cluster_resources()
        return f"{self._committed.summary_string()} used of {total.summary_string()}"

    # -- starting and stopping -------------------------------------------------------------------
    def _spec(self, trial: Trial) -> TrialSpec:
        return {
            "trial_id": trial.trial_id,
            "experiment_name": trial.experiment_name,
            "trainable": trial.trainable,
            "config": trial.config,
        }

    def _check_trainable(self, trial: Trial) -> None:
        if trial.trainable not in self._trainables_checked:
            load_trainable(trial.trainable)
            self._trainables_checked.add(trial.trainable)

    def start_trial(self, trial: Trial, checkpoint_path: str | None = None, train: bool = True) -> bool:
        """Start (or resume) ``trial``, restoring from ``checkpoint_path`` or its newest checkpoint.

        Returns False, with the trial in ERROR, when the trainable cannot be imported.
        Never blocks on Ray: placement, actor start and the first result all arrive later.
        """
        try:
            self._check_trainable(trial)
        except TrainableNotFoundError as e:
            trial.error_msg = str(e)
            self.set_status(trial, TrialStatus.ERROR)
            log.error("Trial %s could not start: %s", trial.trial_id, e)
            return False
        self._experiment_of[trial.trial_id] = trial.experiment_name
        slot = self._acquire_slot(trial)
        self._slots[trial.trial_id] = slot
        self._committed = self._committed + trial.resources
        source = checkpoint_path or trial.restore_source()
        if source is not None:
            assert slot.actor is not None
            self._restore_refs[trial.trial_id] = slot.actor.restore.remote(source)
        self.set_status(trial, TrialStatus.RUNNING)
        if train:
            self.continue_training(trial)
        return True

    def _acquire_slot(self, trial: Trial, autorun: tuple[dict[str, Any], str | None] | None = None) -> _Slot:
        """A slot for ``trial``: a cached one of its shape (its actor reset), else a new one.

        With ``autorun``, a new actor starts the trial from its constructor (see :meth:`launch`).
        """
        spec = self._spec(trial)
        for i, cached in enumerate(self._cache):
            if cached.resources == trial.resources:
                slot = self._cache.pop(i)
                if slot.actor is not None:
                    slot.actor.reset.remote(spec)
                    return slot
                slot.actor = self._create_actor(trial, slot.pg, autorun)
                return slot
        # A cached placement group of another shape would hold resources this trial may need.
        self._evict_cache()
        bundle = trial.resources.to_ray_bundle()
        pg = None
        if bundle:
            pg = placement_group(
                [bundle],
                name=actor_name(trial.experiment_name, trial.trial_id),
                lifetime="detached" if self.detached else None,
            )
        slot = _Slot(trial.resources, pg)
        slot.actor = self._create_actor(trial, pg, autorun)
        return slot

    def _create_actor(
        self, trial: Trial, pg: PlacementGroup | None, autorun: tuple[dict[str, Any], str | None] | None = None
    ) -> ActorHandle:
        res = trial.resources
        options: dict[str, Any] = {
            "num_cpus": res.cpu,
            "num_gpus": res.gpu,
            "max_restarts": 0,
            "name": actor_name(trial.experiment_name, trial.trial_id),
            "namespace": self.namespace,
        }
        if res.memory:
            options["memory"] = res.memory
        if res.custom_resources:
            options["resources"] = dict(res.custom_resources)
        if self.detached:
            options["lifetime"] = "detached"
        if pg is not None:
            options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
                pg, placement_group_bundle_index=0, placement_group_capture_child_tasks=True
            )
        actor: ActorHandle = _RemoteTrialActor.options(**options).remote(  # type: ignore[assignment]
            self._spec(trial), self.storage.storage_path, self.storage.local_log_path, self.capture_output,
            autorun,
        )
        return actor

    def _release(self, trial: Trial, reusable: bool) -> None:
        """Take the trial's actor away from it: cache it for reuse, or kill it."""
        ref = self._future_of.pop(trial.trial_id, None)
        if ref is not None:
            self._futures.pop(ref, None)
        self._restore_refs.pop(trial.trial_id, None)
        slot = self._slots.pop(trial.trial_id, None)
        if slot is None:
            return
        self._committed = self._committed - trial.resources
        assert slot.actor is not None
        if reusable and self.reuse_actors and ref is None:
            slot.actor.stop.remote()
            self._cache.append(slot)
            return
        self._retire_actor(slot.actor, graceful=reusable and ref is None)
        slot.actor = None
        if reusable and self.reuse_placement_groups:
            self._cache.append(slot)
        elif slot.pg is not None:
            remove_placement_group(slot.pg)

    def _retire_actor(self, actor: ActorHandle, graceful: bool) -> None:
        """Kill the actor; when graceful, first let the trainable's cleanup run (up to stop_timeout_s).

        Killing after cleanup frees the bundle much sooner than Ray's own graceful exit, which
        matters when hundreds of short trials each get a fresh actor.
        """
        if graceful:
            ray.wait([actor.stop.remote()], timeout=self.stop_timeout_s)
        kill_actor(actor)

    def _evict_cache(self) -> None:
        for slot in self._cache:
            if slot.actor is not None:
                ray.kill(slot.actor, no_restart=True)
            if slot.pg is not None:
                remove_placement_group(slot.pg)
        self._cache.clear()

    def has_cached_slots(self) -> bool:
        return bool(self._cache)

    def trim_cache(self, wanted: list[Resources]) -> None:
        """Drop cached actors and placement groups that no trial in ``wanted`` could reuse."""
        keep = [s for s in self._cache if s.resources in wanted]
        drop = [s for s in self._cache if s.resources not in wanted]
        self._cache = drop
        self._evict_cache()
        self._cache = keep

    def stop_trial(self, trial: Trial, error: bool = False, error_msg: str | None = None) -> None:
        """Stop the trial and free its resources: TERMINATED, or ERROR with ``error_msg``."""
        self._release(trial, reusable=not error)
        if error:
            trial.error_msg = error_msg or trial.error_msg
            self.set_status(trial, TrialStatus.ERROR)
        else:
            self.set_status(trial, TrialStatus.TERMINATED)
            if self.delete_checkpoints:
                self.delete_trial_checkpoints(trial)

    def requeue_trial(self, trial: Trial) -> None:
        """Free a failed trial's resources and put it back to PENDING to retry from its checkpoint."""
        self._release(trial, reusable=False)
        self.set_status(trial, TrialStatus.PENDING)

    def pause_trial(self, trial: Trial) -> None:
        """Checkpoint the RUNNING trial, release its actor and GPUs, and mark it PAUSED."""
        if trial.status != TrialStatus.RUNNING:
            raise ValueError(f"Cannot pause trial {trial.trial_id}: it is {trial.status}, not RUNNING.")
        if trial.trial_id in self._future_of:
            raise ValueError(
                f"Cannot pause trial {trial.trial_id} while a result is in flight; fetch it first."
            )
        record = self.save(trial)
        if record is None:
            log.warning(
                "Trial %s has no checkpoint to pause on; when resumed it starts from scratch.",
                trial.trial_id,
            )
        self._release(trial, reusable=True)
        self.set_status(trial, TrialStatus.PAUSED)

    def unpause_trial(self, trial: Trial) -> None:
        """PAUSED -> PENDING, so the scheduler can start it again."""
        if trial.status != TrialStatus.PAUSED:
            raise ValueError(f"Cannot unpause trial {trial.trial_id}: it is {trial.status}, not PAUSED.")
        self.set_status(trial, TrialStatus.PENDING)

    def resume_trial(self, trial: Trial) -> bool:
        """Start a PAUSED trial now, from the checkpoint it was paused on."""
        if trial.status != TrialStatus.PAUSED:
            raise ValueError(f"Cannot resume trial {trial.trial_id}: it is {trial.status}, not PAUSED.")
        return self.start_trial(trial)

    def reset_trial(self, trial: Trial, new_config: dict[str, Any]) -> bool:
        """Give a RUNNING trial a new config in its live actor (``Trainable.reset_config``)."""
        slot = self._slots.get(trial.trial_id)
        if slot is None or slot.actor is None or trial.trial_id in self._future_of:
            return False
        trial.config = dict(new_config)
        ray.get(slot.actor.reset.remote(self._spec(trial)))
        return True

    # -- results ---------------------------------------------------------------------------------
    def continue_training(self, trial: Trial) -> None:
        """Ask the trial's actor for its next result."""
        slot = self._slots[trial.trial_id]
        assert slot.actor is not None
        ref: ray.ObjectRef = slot.actor.train.remote()
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
        self._check_restore(trial)
        try:
            return ray.get(ref)
        except (RayTaskError, RayActorError) as e:
            raise self._trial_error(trial, e) from e

    async def async_fetch_result(self, trial: Trial) -> Result:
        """Like fetch_result, awaiting the ObjectRef so an asyncio event loop is never blocked."""
        ref = self._future_of[trial.trial_id]
        try:
            result = await ref
        except (RayTaskError, RayActorError) as e:
            self._pop_future(trial)
            raise self._trial_error(trial, e) from e
        self._pop_future(trial)
        self._check_restore(trial)
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
            raise self._trial_error(trial, e, "restoring from its checkpoint") from e

    def _trial_error(self, trial: Trial, error: Exception, doing: str = "training") -> TrialError:
        cause = getattr(error, "cause", None)
        if isinstance(cause, TrialError) and cause.traceback_text:
            text = cause.traceback_text
        else:
            text = str(error)
        infrastructure = False
        if isinstance(error, RayActorError) and not isinstance(error, RayTaskError):
            infrastructure = _lost_with_its_node(error)
            what = ("its Ray actor was lost with its node (infrastructure, not counted as a failure)"
                    if infrastructure else "its Ray actor died (out of memory, crashed, or killed)")
        else:
            what = "its trainable raised"
        return TrialError(
            f"Trial {trial.trial_id} of experiment {trial.experiment_name} failed while {doing}: "
            f"{what}.\n{text}",
            trial_id=trial.trial_id,
            traceback_text=text,
            infrastructure=infrastructure,
        )

    # -- checkpoints -----------------------------------------------------------------------------
    def save(self, trial: Trial) -> CheckpointRecord | None:
        """Persist the RUNNING trial's state now; registers and returns the checkpoint (None if none)."""
        slot = self._slots.get(trial.trial_id)
        if slot is None or slot.actor is None:
            raise ValueError(f"Cannot save trial {trial.trial_id}: it has no live actor ({trial.status}).")
        try:
            raw: Any = ray.get(slot.actor.save.remote())
        except (RayTaskError, RayActorError) as e:
            raise self._trial_error(trial, e, "saving a checkpoint") from e
        if raw is None:
            return None
        record = CheckpointRecord.from_dict(raw)
        self.register_checkpoint(trial, record)
        return record

    def register_checkpoint(self, trial: Trial, record: CheckpointRecord) -> None:
        """Add a persisted checkpoint to the trial; those it pushes out are deleted from storage."""
        for dropped in trial.checkpoint_manager.on_checkpoint(record):
            self.storage.delete(dropped.path)

    def restore(self, trial: Trial, checkpoint_path: str | None = None) -> None:
        """Load ``checkpoint_path`` (default: the trial's newest) into its live actor."""
        slot = self._slots.get(trial.trial_id)
        source = checkpoint_path or trial.restore_source()
        if slot is None or slot.actor is None or source is None:
            raise ValueError(f"Cannot restore trial {trial.trial_id}: no live actor or no checkpoint.")
        try:
            ray.get(slot.actor.restore.remote(source))
        except (RayTaskError, RayActorError) as e:
            raise self._trial_error(trial, e, "restoring from its checkpoint") from e

    def copy_checkpoint(self, src: Trial, tgt: Trial) -> CheckpointRecord:
        """Copy ``src``'s newest checkpoint to ``tgt``, which then starts from it (Syne Tune's copy_checkpoint)."""
        newest = src.checkpoint
        if newest is None:
            raise CheckpointError(
                f"Trial {src.trial_id} has no checkpoint to copy to trial {tgt.trial_id}; "
                f"checkpoint it first (checkpoint_freq, checkpoint_at_end or report(checkpoint=...))."
            )
        path = self.storage.copy_checkpoint(newest.path, tgt.experiment_name, tgt.trial_id, newest.iteration)
        record = CheckpointRecord(path, newest.iteration, newest.metrics)
        self.register_checkpoint(tgt, record)
        return record

    def delete_trial_checkpoints(self, trial: Trial) -> None:
        for record in trial.checkpoint_manager.clear():
            self.storage.delete(record.path)

    # -- autonomous trials (the Airflow path) ---------------------------------------------------
    def launch(self, trial: Trial, start_timeout_s: float | None = 600.0) -> ActorHandle:
        """Start ``trial`` in its own detached, named actor that drives itself to the end.

        The actor restores the trial's newest checkpoint (or ``restore_path``), applies its
        stopping criterion and checkpoint policy, and ends TERMINATED or ERROR; poll it with
        ``actor.poll.remote(since)`` from any process (:func:`find_trial_actor`). The executor
        does not own it afterwards: end it with :meth:`terminate`.

        The actor starts the trial from its constructor, which Ray's GCS keeps for a detached
        actor: a trial waiting for free resources starts when Ray places it, even after the
        launching process exited (an Airflow task that deferred). With ``start_timeout_s=None``
        this returns at once (the trial may be queued: :meth:`is_placed`); otherwise it returns
        once the trial runs, or raises TrialError, removing the actor, if Ray could not place it
        in time. Raises TrainableNotFoundError or InsufficientResourcesError before any Ray work.
        """
        self._check_trainable(trial)
        self.check_fits_cluster(trial)
        self._experiment_of[trial.trial_id] = trial.experiment_name
        if self.detached:
            # A detached launch never reuses a cached actor: the autorun must be the constructor's.
            self._evict_cache()
            self._remove_orphaned_placement_group(trial)
        autorun = (trial.to_json_state(), trial.restore_source())
        slot = self._acquire_slot(trial, autorun)
        assert slot.actor is not None
        # A reused (reset) actor was built without autorun: hand it the trial now. Only an
        # executor that lives on (not detached) reuses actors, so the call cannot be dropped.
        started: ray.ObjectRef = slot.actor.run.remote(*autorun) if not self.detached else slot.actor.ping.remote()
        if start_timeout_s is not None:
            try:
                ray.get(started, timeout=start_timeout_s)
            except GetTimeoutError as e:
                self.terminate(trial.experiment_name, trial.trial_id)
                raise TrialError(
                    f"Trial {trial.trial_id} of experiment {trial.experiment_name} could not be placed "
                    f"on Ray within {start_timeout_s:g} s (it needs {trial.resources}; the cluster has "
                    f"{self.resource_string()}); it was removed. Free resources or limit concurrent "
                    f"trials with a pool, then retry.",
                    trial_id=trial.trial_id,
                ) from e
            except (RayTaskError, RayActorError) as e:
                self.terminate(trial.experiment_name, trial.trial_id)
                raise self._trial_error(trial, e, "starting") from e
        if trial.status != TrialStatus.RUNNING:
            self.set_status(trial, TrialStatus.RUNNING)
        return slot.actor

    def _remove_orphaned_placement_group(self, trial: Trial) -> None:
        """Remove a placement group left under this trial's name by a process that died between
        creating it and creating the actor (a task's worker killed mid-``execute``): it would hold
        the trial's resources for ever, and the new one could not take its name."""
        removed = remove_placement_groups_named(actor_name(trial.experiment_name, trial.trial_id))
        if removed:
            log.warning(
                "Removed %d placement group(s) of trial %s of experiment %s left by a process that "
                "died before it started the trial's actor.", removed, trial.trial_id, trial.experiment_name,
            )

    def attach(self, experiment_name: str, trial_id: str, timeout_s: float = 60.0) -> ActorHandle | None:
        """The actor of a trial started by any process, or None when it is gone.

        An actor Ray has not placed yet (waiting for resources) counts: it starts its trial when
        placed. Tell the two apart with :meth:`is_placed`.
        """
        actor = find_trial_actor(experiment_name, trial_id, namespace=self.namespace)
        if actor is None:
            return None
        info = actor_info(actor)
        if info.waiting:
            return actor
        if info.state == "DEAD":
            return None
        try:
            ray.get(actor.ping.remote(), timeout=timeout_s)
        except (RayActorError, GetTimeoutError):
            return None
        return actor

    @staticmethod
    def is_placed(actor: ActorHandle) -> bool:
        """Has Ray placed the actor (it runs, or ran, its trial), rather than queued it?"""
        return not actor_info(actor).waiting

    def release(self, experiment_name: str, trial_id: str, placement_group_id: str | None = None) -> None:
        """Kill a trial's actor, if it lives, and remove its placement group (the actor's, else
        ``placement_group_id``). Reads the GCS only through calls that survive a GCS restart, so
        the triggerer may call it."""
        actor = find_trial_actor(experiment_name, trial_id, namespace=self.namespace)
        if actor is not None:
            placement_group_id = kill_actor(actor).placement_group_id or placement_group_id
        remove_placement_group_by_id(placement_group_id)

    def terminate(self, experiment_name: str, trial_id: str) -> None:
        """Kill a trial's actor and remove every placement group of the trial, whichever process
        started them, orphans included. Looks placement groups up by name through Ray's global
        state, which aborts a process whose GCS restarted: for task processes; triggers call
        :meth:`release`."""
        self.release(experiment_name, trial_id)
        remove_placement_groups_named(actor_name(experiment_name, trial_id))

    # -- logs and actors ---------------------------------------------------------------------------
    def _log_path(self, trial_id: str, experiment_name: str | None, index: int) -> str:
        experiment = experiment_name or self._experiment_of.get(trial_id)
        if experiment is None:
            raise KeyError(
                f"Trial {trial_id} is unknown to this executor; pass experiment_name to read its logs."
            )
        return self.storage.log_paths(experiment, trial_id)[index]

    def stdout(self, trial_id: str, experiment_name: str | None = None) -> list[str]:
        """Lines the trial printed to stdout (local log files)."""
        return _read_lines(self._log_path(trial_id, experiment_name, 0))

    def stderr(self, trial_id: str, experiment_name: str | None = None) -> list[str]:
        """Lines the trial printed to stderr (local log files)."""
        return _read_lines(self._log_path(trial_id, experiment_name, 1))

    def get_actor(self, trial: Trial) -> ActorHandle | None:
        slot = self._slots.get(trial.trial_id)
        return None if slot is None else slot.actor

    def cleanup(self) -> None:
        """Kill every actor and remove every placement group this executor created."""
        for trial_id in list(self._slots):
            slot = self._slots.pop(trial_id)
            if slot.actor is not None:
                kill_actor(slot.actor)
            if slot.pg is not None:
                remove_placement_group(slot.pg)
        self._evict_cache()
        self._futures.clear()
        self._future_of.clear()
        self._restore_refs.clear()
        self._committed = Resources(cpu=0)


def _lost_with_its_node(error: RayActorError) -> bool:
    """Did the actor behind ``error`` die because its node did (as the GCS recorded it)?"""
    actor_id = getattr(error, "actor_id", None)
    if not actor_id:
        return False
    try:
        return actor_info_by_id(actor_id.hex() if hasattr(actor_id, "hex") else str(actor_id)).lost_to_infrastructure
    except Exception:  # the GCS does not answer: say nothing rather than guess
        log.warning("Could not ask Ray why actor %s died", actor_id, exc_info=True)
        return False


def _read_lines(path: str) -> list[str]:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read().splitlines()
    except FileNotFoundError:
        return []
