"""SlotPool: a trial's placement group and the actor in it, cached between trials for reuse."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import ray
from ray.actor import ActorHandle
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from airflow_trials.core.resources import Resources
from airflow_trials.core.trial import Trial
from airflow_trials.execution.actor_spec import Autorun, trial_spec
from airflow_trials.execution.handles import actor_name, slot_name
from airflow_trials.execution.ray_state import kill_actor

# The one import of the worker's code in the driver's: the class Ray starts a trial's actor from.
from airflow_trials.execution.worker.actor import TrialActor
from airflow_trials.storage.trial_storage import TrialStorage

_RemoteTrialActor = ray.remote(TrialActor)


@dataclass
class Slot:
    """A placement group, and the actor in it when there is one; cached between trials for reuse."""

    resources: Resources
    pg: PlacementGroup | None
    actor: ActorHandle | None = None
    # The cached actor's stop (its trainable's cleanup, the copy of the trial's logs): waited for
    # before the actor is killed, so that the last trial it ran keeps its logs.
    stopping: ray.ObjectRef | None = None


class SlotPool:
    """Hands out slots to trials and takes them back, keeping finished ones for the next trial.

    A slot given back stays cached (its actor stopped, or only its placement group) when reuse is
    on and the trial ended cleanly; a later trial of the same resources takes it. Everything else
    is killed and removed.

    :param storage: where the actors write checkpoints and logs.
    :param namespace: Ray namespace of the named actors.
    :param detached: create detached actors and placement groups that outlive this process.
    :param capture_output: have the actors write the trial's stdout/stderr to files.
    :param reuse_actors: cache a finished trial's live actor (reset for the next trial); default
        False.
    :param reuse_placement_groups: cache a finished trial's placement group; default False.
    :param stop_timeout_s: how long a stopping trial's cleanup may take before its actor is
        killed; default 10.
    """

    def __init__(
        self,
        storage: TrialStorage,
        *,
        namespace: str,
        detached: bool,
        capture_output: bool,
        reuse_actors: bool = False,
        reuse_placement_groups: bool = False,
        stop_timeout_s: float = 10.0,
    ) -> None:
        self.storage = storage
        self.namespace = namespace
        self.detached = detached
        self.capture_output = capture_output
        self.reuse_actors = reuse_actors
        self.reuse_placement_groups = reuse_placement_groups or reuse_actors
        self.stop_timeout_s = stop_timeout_s
        self._cache: list[Slot] = []

    def acquire(self, trial: Trial, autorun: Autorun | None = None) -> Slot:
        """A slot for ``trial``: a cached one of its shape (its actor reset), else a new one.

        With ``autorun``, a new actor starts the trial from its constructor
        (see :meth:`TrialActorClient.launch`). The slot's actor is never None.
        """
        for i, cached in enumerate(self._cache):
            if cached.resources == trial.resources:
                slot = self._cache.pop(i)
                slot.stopping = None
                if slot.actor is not None:
                    slot.actor.reset.remote(trial_spec(trial))
                    return slot
                slot.actor = self._create_actor(trial, slot.pg, autorun)
                return slot
        # A cached placement group of another shape would hold resources this trial may need.
        self.evict()
        bundles = trial.resources.bundles  # one, or a PlacementGroupFactory's
        pg = None
        if bundles:
            pg = placement_group(
                bundles,
                strategy=trial.resources.strategy,
                name=self._name(trial, self.reuse_placement_groups),
                lifetime="detached" if self.detached else None,
            )
        slot = Slot(trial.resources, pg)
        slot.actor = self._create_actor(trial, pg, autorun)
        return slot

    def _create_actor(
        self, trial: Trial, pg: PlacementGroup | None, autorun: Autorun | None
    ) -> ActorHandle:
        return create_trial_actor(
            trial,
            pg,
            self.storage,
            namespace=self.namespace,
            detached=self.detached,
            capture_output=self.capture_output,
            autorun=autorun,
            name=self._name(trial, self.reuse_actors),
        )

    @staticmethod
    def _name(trial: Trial, reusable: bool) -> str:
        """The Ray name of what is created for ``trial``: the trial's own unless it may serve later
        trials too, whose names it cannot take (Ray names are fixed at creation)."""
        return (
            slot_name(trial.experiment_name)
            if reusable
            else actor_name(trial.experiment_name, trial.trial_id)
        )

    def give_back(self, slot: Slot, *, reusable: bool, idle: bool) -> None:
        """Cache the slot of a finished trial for reuse, or kill its actor and remove its group.

        :param reusable: the trial ended cleanly (not in error), so its slot may serve again.
        :param idle: no call is in flight on the actor, so it may be stopped gracefully and kept.
        """
        assert slot.actor is not None
        if reusable and self.reuse_actors and idle:
            slot.stopping = slot.actor.stop.remote()
            self._cache.append(slot)
            return
        self._retire_actor(slot.actor, graceful=reusable and idle)
        slot.actor = None
        if reusable and self.reuse_placement_groups:
            self._cache.append(slot)
        elif slot.pg is not None:
            remove_placement_group(slot.pg)

    def _retire_actor(self, actor: ActorHandle, graceful: bool) -> None:
        """Kill the actor; when graceful, first let the trainable's cleanup run (up to
        stop_timeout_s).

        Killing after cleanup frees the bundle much sooner than Ray's own graceful exit, which
        matters when hundreds of short trials each get a fresh actor.
        """
        if graceful:
            ray.wait([actor.stop.remote()], timeout=self.stop_timeout_s)
        kill_actor(actor)

    @staticmethod
    def destroy(slot: Slot) -> None:
        """Kill the slot's actor and remove its placement group, whatever they are doing."""
        if slot.actor is not None:
            kill_actor(slot.actor)
        if slot.pg is not None:
            remove_placement_group(slot.pg)

    def evict(self) -> None:
        """Kill every cached actor (once its stop ran, up to stop_timeout_s) and remove every
        cached placement group."""
        stopping = [s.stopping for s in self._cache if s.actor is not None and s.stopping]
        if stopping:
            ray.wait(stopping, num_returns=len(stopping), timeout=self.stop_timeout_s)
        for slot in self._cache:
            if slot.actor is not None:
                ray.kill(slot.actor, no_restart=True)
            if slot.pg is not None:
                remove_placement_group(slot.pg)
        self._cache.clear()

    def has_cached(self) -> bool:
        return bool(self._cache)

    def trim(self, wanted: list[Resources]) -> None:
        """Drop cached actors and placement groups that no trial in ``wanted`` could reuse."""
        keep = [s for s in self._cache if s.resources in wanted]
        drop = [s for s in self._cache if s.resources not in wanted]
        self._cache = drop
        self.evict()
        self._cache = keep


def create_trial_actor(
    trial: Trial,
    pg: PlacementGroup | None,
    storage: TrialStorage,
    *,
    namespace: str,
    detached: bool,
    capture_output: bool,
    autorun: Autorun | None = None,
    name: str | None = None,
) -> ActorHandle:
    """A named TrialActor for ``trial`` holding its resources, in bundle 0 of ``pg`` when given.

    With several bundles (a :class:`~airflow_trials.PlacementGroupFactory`) the actor takes bundle
    0's resources (none when it is empty, as in Ray Tune); the tasks and actors its trainable
    starts are captured by the group (``placement_group_capture_child_tasks``), so they run in the
    other bundles, and ``ray.util.get_current_placement_group()`` in the trainable returns it.

    Its Ray name is :func:`actor_name` of the trial unless ``name`` says otherwise (a reusable
    actor's :func:`slot_name`).

    Creation does not wait for Ray to place the actor. With ``autorun`` the actor starts the trial
    from its constructor, so the trial runs once Ray places it, whoever is still listening.
    """
    res = trial.resources.head
    options: dict[str, Any] = {
        "num_cpus": res.cpu,
        "num_gpus": res.gpu,
        "max_restarts": 0,
        "name": name or actor_name(trial.experiment_name, trial.trial_id),
        "namespace": namespace,
    }
    if res.memory:
        options["memory"] = res.memory
    if res.custom_resources:
        options["resources"] = dict(res.custom_resources)
    if detached:
        options["lifetime"] = "detached"
    if pg is not None:
        options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
            pg, placement_group_bundle_index=0, placement_group_capture_child_tasks=True
        )
    actor: ActorHandle = _RemoteTrialActor.options(**options).remote(  # type: ignore[assignment]
        trial_spec(trial),
        storage.storage_path,
        storage.local_log_path,
        capture_output,
        autorun,
    )
    return actor
