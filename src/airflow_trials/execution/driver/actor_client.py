"""TrialActorClient: the one client of trial actors. It starts a trial in a detached, named actor
that drives itself, and finds, tells and ends it from any process: what the Airflow hook hands out
(to operators, sensors and triggers), and what RayTrialExecutor composes for the runner."""

from __future__ import annotations

import logging

import ray
from ray.actor import ActorHandle
from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

from airflow_trials.core.resources import Resources
from airflow_trials.core.status import TrialStatus
from airflow_trials.core.trial import Trial
from airflow_trials.exceptions import TrialError
from airflow_trials.execution import handles
from airflow_trials.execution.actor_spec import HoldSpec
from airflow_trials.execution.driver.cluster import ResourceLedger
from airflow_trials.execution.driver.errors import trial_error
from airflow_trials.execution.driver.slots import SlotPool
from airflow_trials.execution.handles import DEFAULT_NAMESPACE, actor_name, find_trial_actor
from airflow_trials.execution.parameter_refs import parameter_refs
from airflow_trials.execution.ray_state import (
    actor_info,
    kill_actor,
    remove_placement_group_by_id,
    remove_placement_groups_named,
    send_poll,
)
from airflow_trials.execution.trainable_api import check_accepts_parameters, load_trainable
from airflow_trials.storage.trial_storage import TrialStorage

log = logging.getLogger(__name__)


class TrialActorClient:
    """Runs each trial in its own named actor that takes it to the end, with no driver process.

    This is what the Airflow hook hands out (``TrialsHook.get_actor_client``), as Databricks' hook
    is the client its triggers use: the task that launches a trial may exit (it defers), and the
    trigger finds the trial's actor again by name::

        client = TrialActorClient(storage_path="/shared/results")
        client.check_fits_cluster(trial)                # InsufficientResourcesError if it never can
        actor = client.launch(trial, start_timeout_s=None)     # returns at once, maybe queued
        client.is_placed(actor)                         # False while Ray waits for resources
        ray.get(client.poll(actor, since=0))            # its progress: a TrialUpdate
        # ... in another process (the trigger):
        actor = client.attach(experiment_name, trial_id)       # None when it is gone
        client.decide(actor, iteration, "continue", "", "")    # a scheduler's verdict on a hold
        client.release(experiment_name, trial_id)       # kill it, free its placement group
        client.terminate(experiment_name, trial_id)     # same, orphaned groups too (tasks only)

    Its results are polled in batches by the triggerer's poller
    (:mod:`~airflow_trials.execution.triggerer.poller`), not one call per trial.

    :param storage_path: local directory or fsspec URL for checkpoints and trial metadata; default
        ``$AIRFLOW_TRIALS_STORAGE`` or ``~/airflow_trials_results``.
    :param queue_trials: launch a trial although the cluster can never fit it now, so an
        autoscaler can add nodes; default False.
    :param refresh_period_s: how often cluster totals are re-read from Ray; default 1.
    :param namespace: Ray namespace of the named actors; default ``"airflow_trials"``.
    :param detached: create detached named actors that outlive this process, so another process
        (the Airflow trigger) can find a trial by id; default True.
    :param capture_output: write each trial's stdout/stderr to files; default True.
    :param local_log_path: where those files go; default the storage root when it is local.
    """

    def __init__(
        self,
        storage_path: str | None = None,
        *,
        queue_trials: bool = False,
        refresh_period_s: float = 1.0,
        namespace: str = DEFAULT_NAMESPACE,
        detached: bool = True,
        capture_output: bool = True,
        local_log_path: str | None = None,
    ) -> None:
        self.storage = TrialStorage(storage_path, local_log_path)
        self.namespace = namespace
        self.detached = detached
        self.ledger = ResourceLedger(queue_trials=queue_trials, refresh_period_s=refresh_period_s)
        self.slots = SlotPool(
            self.storage, namespace=namespace, detached=detached, capture_output=capture_output
        )
        self.experiment_of: dict[str, str] = {}
        self._trainables_checked: set[tuple[str, tuple[str, ...]]] = set()

    # -- cluster resources -------------------------------------------------------------------------
    def refresh_cluster_resources(self, force: bool = False) -> None:
        """Re-read the cluster's totals from Ray if ``refresh_period_s`` passed (or ``force``)."""
        self.ledger.refresh(force)

    def cluster_resources(self) -> Resources:
        """Everything the live cluster has, re-read at most every ``refresh_period_s``."""
        return self.ledger.total()

    def fits_cluster(self, resources: Resources) -> bool:
        """Could ``resources`` ever be granted on this cluster, with nothing else running?"""
        return self.ledger.fits_cluster(resources)

    def check_fits_cluster(self, trial: Trial) -> None:
        """Raise InsufficientResourcesError if the trial can never fit (unless queue_trials)."""
        self.ledger.check_fits_cluster(trial)

    def resource_string(self) -> str:
        return self.ledger.summary_string()

    def check_trainable(self, trial: Trial) -> None:
        """Raise TrainableNotFoundError if the trial's trainable cannot be imported here, does not
        take its with_parameters constants, or lost them (a resumed trial); puts them in Ray's
        object store the first time."""
        key = (trial.trainable, trial.parameter_names)
        if key not in self._trainables_checked:
            trainable = load_trainable(trial.trainable)
            check_accepts_parameters(trainable, trial.trainable, trial.parameter_names)
            self._trainables_checked.add(key)
        parameter_refs(trial)

    # -- autonomous trials -------------------------------------------------------------------------
    def launch(
        self,
        trial: Trial,
        start_timeout_s: float | None = 600.0,
        holds: HoldSpec | None = None,
        wait_for_capacity: bool = False,
    ) -> ActorHandle:
        """Start ``trial`` in its own detached, named actor that drives itself to the end.

        The actor restores the trial's newest checkpoint (or ``restore_path``), applies its
        stopping criterion and checkpoint policy, and ends TERMINATED or ERROR; poll it with
        ``client.poll(actor, since)`` from any process (:func:`find_trial_actor`). The launcher
        does not own it afterwards: end it with :meth:`terminate`.

        The actor starts the trial from its constructor, which Ray's GCS keeps for a detached
        actor: a trial waiting for free resources starts when Ray places it, even after the
        launching process exited (an Airflow task that deferred). With ``start_timeout_s=None``
        this returns at once (the trial may be queued: :meth:`is_placed`); otherwise it returns
        once the trial runs, or raises TrialError, removing the actor, if Ray could not place it
        in time. Raises TrainableNotFoundError or InsufficientResourcesError before any Ray work.
        With ``holds`` the trial waits for its scheduler's verdict at each hold point
        (:mod:`~airflow_trials.execution.worker.holds`). ``wait_for_capacity``: launch it even if
        the cluster lacks its resources now (a trial that ran before, whose node was lost), to
        wait until a node with room joins.
        """
        self.check_trainable(trial)
        if not wait_for_capacity:
            self.check_fits_cluster(trial)
        self.experiment_of[trial.trial_id] = trial.experiment_name
        if self.detached:
            # A detached launch never reuses a cached actor: the autorun must be the constructor's.
            self.slots.evict()
            self._remove_orphaned_placement_group(trial)
        autorun = (trial.to_json_state(), trial.restore_source(), dict(holds) if holds else None)
        slot = self.slots.acquire(trial, autorun)
        assert slot.actor is not None
        # A reused (reset) actor was built without autorun: hand it the trial now. Only an
        # executor that lives on (not detached) reuses actors, so the call cannot be dropped.
        started: ray.ObjectRef = (
            slot.actor.run.remote(*autorun) if not self.detached else slot.actor.ping.remote()
        )
        if start_timeout_s is not None:
            self._wait_until_started(trial, started, start_timeout_s)
        if trial.status != TrialStatus.RUNNING:
            log.debug("Trial %s: %s -> %s", trial.trial_id, trial.status, TrialStatus.RUNNING)
            trial.set_status(TrialStatus.RUNNING)
        return slot.actor

    def _wait_until_started(
        self, trial: Trial, started: ray.ObjectRef, start_timeout_s: float
    ) -> None:
        """Wait for the launched trial's actor to answer; remove it and raise if it never does."""
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
            raise trial_error(trial, e, "starting") from e

    def _remove_orphaned_placement_group(self, trial: Trial) -> None:
        """Remove a placement group left under this trial's name by a process that died between
        creating it and creating the actor (a task's worker killed mid-``execute``): it would hold
        the trial's resources for ever, and the new one could not take its name."""
        removed = remove_placement_groups_named(actor_name(trial.experiment_name, trial.trial_id))
        if removed:
            log.warning(
                "Removed %d placement group(s) of trial %s of experiment %s left by a process that "
                "died before it started the trial's actor.",
                removed,
                trial.trial_id,
                trial.experiment_name,
            )

    def attach(
        self, experiment_name: str, trial_id: str, timeout_s: float = 60.0
    ) -> ActorHandle | None:
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
        if info.dead:
            return None
        try:
            ray.get(actor.ping.remote(), timeout=timeout_s)
        except (RayActorError, GetTimeoutError):
            return None
        return actor

    is_placed = staticmethod(handles.is_placed)
    # The one way to ask a trial's actor for its progress: returns the ObjectRef (ray.get it, or
    # batch it with ray.wait). The triggerer's poller, which holds no client, calls the same
    # function in ray_state.
    poll = staticmethod(send_poll)

    def release(
        self,
        experiment_name: str,
        trial_id: str,
        placement_group_id: str | None = None,
        actor: ActorHandle | None = None,
    ) -> None:
        """Kill a trial's actor, if it lives, and remove its placement group (the actor's, else
        ``placement_group_id``). Reads the GCS only through calls that survive a GCS restart, so
        the triggerer may call it. ``actor``: that handle, not whatever actor has the trial's name
        now (a later try may have started a new one)."""
        if actor is None:
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

    @staticmethod
    def decide(
        actor: ActorHandle,
        iteration: int,
        decision: str,
        reason: str | None,
        stop_kind: str,
        timeout_s: float,
    ) -> None:
        """Give a trial's actor its scheduler's verdict on the result it holds at (or a STOP):
        ``decision`` and ``stop_kind`` are the verdict's enum values. Raises Ray's error when the
        actor is dead or does not answer within ``timeout_s``."""
        ray.get(actor.decide.remote(iteration, decision, reason, stop_kind), timeout=timeout_s)

    @staticmethod
    def release_checkpoints(actor: ActorHandle, version: int, timeout_s: float) -> None:
        """Let an ended trial's actor delete the checkpoints it dropped, now that the trials DB
        holds its kept set as of ``version``. Raises Ray's error as :meth:`decide` does."""
        ray.get(actor.release_checkpoints.remote(version), timeout=timeout_s)

    # -- logs --------------------------------------------------------------------------------------
    def _log_path(self, trial_id: str, experiment_name: str | None, index: int) -> str:
        experiment = experiment_name or self.experiment_of.get(trial_id)
        if experiment is None:
            raise KeyError(
                f"Trial {trial_id} is unknown to this executor; pass experiment_name to read its "
                "logs."
            )
        return self.storage.log_paths(experiment, trial_id)[index]

    def stdout(self, trial_id: str, experiment_name: str | None = None) -> list[str]:
        """Lines the trial printed to stdout (local log files)."""
        return _read_lines(self._log_path(trial_id, experiment_name, 0))

    def stderr(self, trial_id: str, experiment_name: str | None = None) -> list[str]:
        """Lines the trial printed to stderr (local log files)."""
        return _read_lines(self._log_path(trial_id, experiment_name, 1))


def _read_lines(path: str) -> list[str]:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read().splitlines()
    except FileNotFoundError:
        return []
