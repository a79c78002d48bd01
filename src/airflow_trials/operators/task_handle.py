"""A trial task's handle in Airflow's task state store (AIP-103): which trial and Ray actor the
task instance is attached to, shown in Airflow's UI and REST API.

Each try reads the handle and then writes its own, ``{trial_id, actor_name, try_number,
run_key}`` under :data:`HANDLE_KEY`, before it registers the trial in the trials DB or starts
anything on Ray. A handle that names this trial keeps the re-attach (the trials DB and Ray then
decide it, as before). A handle a user cleared (the UI, or ``DELETE
.../taskInstances/{task_id}/state-store``) after an earlier try of this task instance registered
the trial makes the try start afresh, as a cleared task does
(:func:`~airflow_trials.core.fate.on_start`'s ``handle_kept``). The trials DB stays the record of
the trial: the handle only says which trial the task holds."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from airflow_trials.exceptions import TrialNotFoundError
from airflow_trials.execution.handles import actor_name

HANDLE_KEY = "airflow_trials.trial"


@dataclass(frozen=True)
class TaskHandle:
    """What the task state store holds for a trial's task instance.

    :param trial_id: the trial the task runs.
    :param actor_name: its detached Ray actor's name (namespace ``airflow_trials``).
    :param try_number: the try that wrote it (the latest to start or re-attach).
    :param run_key: the DAG run's run_id, the trial's run in the trials DB.
    """

    trial_id: str
    actor_name: str
    try_number: int
    run_key: str


def read_handle(context: Any) -> TaskHandle | None:
    """The handle an earlier try wrote; None when there is none or no task state store (a
    context built outside Airflow's task runner)."""
    state_store = context.get("task_state_store")
    stored = state_store.get(HANDLE_KEY) if state_store is not None else None
    if not isinstance(stored, dict):
        return None
    return TaskHandle(**stored)


def write_handle(context: Any, experiment: str, trial_id: str) -> None:
    """Record this try's handle; it lives as long as the DAG run (no retention expiry)."""
    from airflow.sdk.execution_time.context import NEVER_EXPIRE

    state_store = context.get("task_state_store")
    if state_store is None:
        return
    ti = context["ti"]
    handle = TaskHandle(trial_id, actor_name(experiment, trial_id), ti.try_number, ti.run_id)
    state_store.set(HANDLE_KEY, asdict(handle), retention=NEVER_EXPIRE)


def handle_kept(context: Any, store: Any, experiment: str, trial_id: str) -> bool:
    """Does the task state store still hold this trial's handle, wherever it should?

    Reads the task state store first: a handle naming this trial and its actor keeps the
    re-attach. None, or one naming another trial or actor, counts as cleared by a user only when an
    earlier try of this task instance registered the trial (that try wrote its handle first).
    Call it before this try writes its handle and registers the trial. Without a task state
    store: True.
    """
    ti = context["ti"]
    if ti.try_number == 1 or context.get("task_state_store") is None:
        return True
    handle = read_handle(context)
    if handle is not None and (handle.trial_id, handle.actor_name) == (
        trial_id,
        actor_name(experiment, trial_id),
    ):
        return True
    try:
        before = store.reader.get_trial(trial_id)
    except TrialNotFoundError:
        return True
    ours = (before.dag_id, before.run_id, before.task_id, before.map_index) == (
        ti.dag_id,
        ti.run_id,
        ti.task_id,
        ti.map_index if ti.map_index is not None else -1,
    )
    return not ours
