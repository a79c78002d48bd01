"""Trial actors by name: how any process finds and asks about a trial's Ray actor (the driver
creates them: :mod:`airflow_trials.execution.driver.slots`)."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ray.actor import ActorHandle

# Ray is imported where it is used: the operators import actor_name when a DAG file is parsed,
# and a parse (by the DAG processor, and by each task's start and resume) need not load Ray.

DEFAULT_NAMESPACE = "airflow_trials"


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
    import ray

    try:
        return ray.get_actor(actor_name(experiment_name, trial_id), namespace=namespace)
    except ValueError:
        return None


def is_placed(actor: ActorHandle) -> bool:
    """Has Ray placed the actor (it runs, or ran, its trial), rather than queued it?"""
    from airflow_trials.execution.ray_state import actor_info

    return not actor_info(actor).waiting
