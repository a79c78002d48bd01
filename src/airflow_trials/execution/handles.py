"""Trial actors by name: how any process creates, finds and asks about a trial's Ray actor."""

from __future__ import annotations

import uuid
from typing import Any

import ray
from ray.actor import ActorHandle
from ray.util.placement_group import PlacementGroup
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from airflow_trials.core.trial import Trial
from airflow_trials.execution.parameter_refs import parameter_refs
from airflow_trials.execution.ray_state import actor_info
from airflow_trials.execution.storage import TrialStorage
from airflow_trials.execution.worker.actor import TrialActor, TrialSpec

DEFAULT_NAMESPACE = "airflow_trials"
_RemoteTrialActor = ray.remote(TrialActor)

# What a launched actor runs from its constructor: the trial's JSON state, the checkpoint to
# restore first (None: start from scratch) and its holds (None: no scheduler's verdicts).
Autorun = tuple[dict[str, Any], str | None, dict[str, Any] | None]


def actor_name(experiment_name: str, trial_id: str) -> str:
    """The Ray actor name of a trial; with its namespace, another process finds the trial by id."""
    return f"trial.{experiment_name}.{trial_id}"


def slot_name(experiment_name: str) -> str:
    """The Ray name of an actor or placement group that serves several trials in turn (actor or
    placement-group reuse): a Ray name cannot change, so it names no trial, only the experiment."""
    return f"trial.{experiment_name}.slot-{uuid.uuid4().hex[:12]}"


def find_trial_actor(
    experiment_name: str, trial_id: str, namespace: str = DEFAULT_NAMESPACE
) -> ActorHandle | None:
    """The live actor of a trial started by any process, or None when there is none.

    A trial that runs in a reused actor (``TrialRunner(reuse_actors=True)``) is not found by
    name: its actor is named for its slot (:func:`slot_name`), since it hosts several trials in
    turn; ask that runner's executor (``get_actor``) instead.
    """
    try:
        return ray.get_actor(actor_name(experiment_name, trial_id), namespace=namespace)
    except ValueError:
        return None


def is_placed(actor: ActorHandle) -> bool:
    """Has Ray placed the actor (it runs, or ran, its trial), rather than queued it?"""
    return not actor_info(actor).waiting


def trial_spec(trial: Trial) -> TrialSpec:
    """What a trial actor needs to know of its trial to build the trainable; its with_parameters
    constants travel as ObjectRefs, which Ray passes by reference, never copied into the spec."""
    return {
        "trial_id": trial.trial_id,
        "experiment_name": trial.experiment_name,
        "trainable": trial.trainable,
        "config": trial.config,
        "parameters": parameter_refs(trial),
    }


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

    Its Ray name is :func:`actor_name` of the trial unless ``name`` says otherwise (a reusable
    actor's :func:`slot_name`).

    Creation does not wait for Ray to place the actor. With ``autorun`` the actor starts the trial
    from its constructor, so the trial runs once Ray places it, whoever is still listening.
    """
    res = trial.resources
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
