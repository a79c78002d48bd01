"""Trial actors as Ray's GCS sees them, read without Ray's GlobalStateAccessor; the one reader of
Ray's actor states (the rest of the package reads :class:`ActorInfo` and
:class:`~airflow_trials.core.fate.ActorState`, never Ray's state names).

Ray's ``ray._private.state`` (behind ``placement_group_table``, ``ray.nodes`` and friends) aborts
the whole process with a C++ check failure once the GCS it talks to has restarted
("WrongClusterID"). The Airflow triggerer hosts hundreds of triggers in one process, so what a
trigger calls must read the GCS through the core worker's ``GcsClient`` instead, which raises a
Python error. Everything here does; :func:`remove_placement_groups_named` is the one exception
(there is no other lookup of a placement group by name) and is for short-lived task processes only.

Ray's public State API (``ray.util.state.get_actor``) would give the same records, but it asks
Ray's dashboard, which a head started without it (``include_dashboard=False``, as the tests and
many clusters run) does not have, and it waits on HTTP. So the reads stay on the GCS client.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from dataclasses import dataclass
from typing import Any, cast

import ray
from ray import ActorID, PlacementGroupID
from ray.actor import ActorHandle
from ray.exceptions import RayActorError
from ray.util.client import ray as ray_client
from ray.util.placement_group import PlacementGroup, placement_group_table, remove_placement_group

from airflow_trials.core.fate import ActorState
from airflow_trials.core.status import TrialStatus
from airflow_trials.core.update import TrialUpdate

# GCS actor states of an actor that waits for resources (its constructor has not run yet).
WAITING_STATES = frozenset({"DEPENDENCIES_UNREADY", "PENDING_CREATION"})
# Why an actor died, when the cause is the cluster rather than the trial: a lost node. (An actor
# killed with ray.kill, or whose worker process crashed, failed as far as the trial is concerned.)
INFRASTRUCTURE_DEATHS = frozenset({"NODE_DIED"})
GCS_TIMEOUT_SECONDS = 10.0
# How long a task starting a try waits for a live trial's actor to say its status before it fails.
ATTACH_TIMEOUT_SECONDS = 60.0
# What a placed trial actor's own status (its poll) means to a try that starts.
_ACTOR_STATES = {
    TrialStatus.RUNNING: ActorState.RUNNING,
    TrialStatus.TERMINATED: ActorState.TERMINATED,
}


@dataclass(frozen=True)
class ActorInfo:
    """What the GCS knows of one actor.

    :param state: ``DEPENDENCIES_UNREADY``/``PENDING_CREATION`` (waiting for resources),
        ``ALIVE``, ``RESTARTING`` or ``DEAD``.
    :param placement_group_id: hex id of the placement group it was scheduled in, if any.
    :param death_reason: for a DEAD actor, Ray's reason (``RAY_KILL``, ``NODE_DIED``,
        ``WORKER_DIED``, ``OUT_OF_MEMORY``, ...); else None.
    :param death_message: Ray's words on the death; empty when alive.
    """

    state: str
    placement_group_id: str | None = None
    death_reason: str | None = None
    death_message: str = ""

    @property
    def waiting(self) -> bool:
        return self.state in WAITING_STATES

    @property
    def dead(self) -> bool:
        return self.state == "DEAD"

    @property
    def lost_to_infrastructure(self) -> bool:
        """Did it die because its node did, rather than because of the trial or a user?"""
        return self.dead and self.death_reason in INFRASTRUCTURE_DEATHS


def _info_from_table_data(data: Any) -> ActorInfo:
    from ray.core.generated.gcs_pb2 import ActorTableData  # type: ignore[attr-defined]

    state = ActorTableData.ActorState.Name(data.state)
    pg = data.placement_group_id.hex() or None
    if state != "DEAD" or not data.HasField("death_cause"):
        return ActorInfo(state, pg)
    cause = data.death_cause
    context = cause.WhichOneof("context")
    if context == "actor_died_error_context":
        died = cause.actor_died_error_context
        reason = type(died).Reason.Name(died.reason)
        return ActorInfo(state, pg, reason, died.error_message)
    if context == "oom_context":
        return ActorInfo(state, pg, "OUT_OF_MEMORY", cause.oom_context.error_message)
    return ActorInfo(state, pg, (context or "UNSPECIFIED").upper(), str(cause)[:500])


async def async_actor_info(actor_id: str, timeout_s: float = GCS_TIMEOUT_SECONDS) -> ActorInfo:
    """The GCS's record of an actor (by hex id), awaited without blocking the event loop.

    An actor the GCS does not know (the cluster restarted since) reads as DEAD, lost with its node.
    Raises Ray's RpcError when the GCS does not answer within ``timeout_s``.
    """
    gcs = ray._private.worker.global_worker.gcs_client  # type: ignore[attr-defined]
    table = await gcs.async_get_all_actor_info(
        actor_id=ActorID(bytes.fromhex(actor_id)), timeout=timeout_s
    )
    if not table:
        return ActorInfo("DEAD", None, "NODE_DIED", "The Ray cluster no longer knows this actor.")
    return _info_from_table_data(next(iter(table.values())))


def _actor_info_in_cluster(actor_id: str) -> ActorInfo:
    return asyncio.run(async_actor_info(actor_id))


# Under Ray Client (ray://) this process has no GCS connection of its own: ask from the cluster.
_remote_actor_info = ray.remote(num_cpus=0)(_actor_info_in_cluster)


def actor_info(actor: ActorHandle) -> ActorInfo:
    """The GCS's record of ``actor``, from synchronous code (any thread, with or without a loop)."""
    return actor_info_by_id(actor._actor_id.hex())


def actor_info_by_id(actor_id: str) -> ActorInfo:
    """The GCS's record of the actor with this hex id (see :func:`actor_info`)."""
    if ray_client.is_connected():
        info: ActorInfo = ray.get(_remote_actor_info.remote(actor_id))
        return info
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return _actor_info_in_cluster(actor_id)
    # Called from inside an event loop's thread: asyncio.run needs a thread of its own.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(_actor_info_in_cluster, actor_id).result()


def actor_state(actor: ActorHandle) -> str:
    """GCS's state of an actor: ``PENDING_CREATION`` while it waits for resources, ``ALIVE``,
    ``RESTARTING`` or ``DEAD``. Read from the GCS, so it works without Ray's dashboard."""
    return actor_info(actor).state


def send_poll(
    actor: ActorHandle,
    since: int = 0,
    wait_s: float = 0.0,
    output_from: dict[str, int] | None = None,
    recorded_version: int | None = None,
) -> ray.ObjectRef:
    """Ask a trial's actor for its progress (the one call of
    :meth:`~airflow_trials.execution.worker.actor.TrialActor.poll`, whose parameters these are);
    returns the answer's ObjectRef, for the caller to ``ray.get`` or batch with ``ray.wait`` (the
    triggerer's poller). It lives here, below the driver's ``TrialActorClient.poll`` (this
    function), so the triggerer's poller and :func:`trial_actor_state` reach it too."""
    return actor.poll.remote(since, wait_s, output_from, recorded_version)


def trial_actor_state(
    actor: ActorHandle | None, timeout_s: float = ATTACH_TIMEOUT_SECONDS
) -> ActorState:
    """What a try that starts finds of its trial's actor (``None``: the executor found none).

    QUEUED while Ray has not placed it; once placed, what the actor says of its trial (asked
    with a poll, which raises GetTimeoutError past ``timeout_s``); GONE when it died as we asked
    (the previous try's trigger, cancelled because the task was cleared, stopped it).
    """
    if actor is None:
        return ActorState.GONE
    if actor_info(actor).waiting:
        return ActorState.QUEUED  # it starts its trial when Ray places it
    try:
        update = cast(TrialUpdate, ray.get(send_poll(actor, 10**9), timeout=timeout_s))
    except RayActorError:
        return ActorState.GONE
    if update.status is None:  # the actor always says its status: no state we know otherwise
        return ActorState.STALE
    return _ACTOR_STATES.get(TrialStatus(update.status), ActorState.STALE)


def kill_actor(actor: ActorHandle, settle_s: float = 3.0) -> ActorInfo:
    """``ray.kill`` once Ray has finished creating the actor (or after ``settle_s``); returns what
    the GCS knew of it just before (its placement group, say).

    A kill that reaches a worker while it is still receiving the actor's creation task is ignored
    there (Ray logs "Mismatched ActorID ... ignoring KillActor"), and that worker then keeps the
    actor's resources, so the next trial never starts. Waiting out PENDING_CREATION avoids it; an
    actor that waits for resources (no worker yet) is killed after ``settle_s`` by the GCS.
    """
    deadline = time.monotonic() + settle_s
    info = actor_info(actor)
    while info.waiting and time.monotonic() < deadline:
        time.sleep(0.05)
        info = actor_info(actor)
    ray.kill(actor, no_restart=True)
    return info


def current_cluster_id() -> str | None:
    """Hex id of the Ray cluster this process is connected to; None under Ray Client or when not
    connected. A new head at the same address is a new cluster, with a new id."""
    if not ray.is_initialized() or ray_client.is_connected():
        return None
    return str(ray._private.worker.global_worker.gcs_client.cluster_id.hex())  # type: ignore[attr-defined]


def remove_placement_group_by_id(placement_group_id: str | None) -> None:
    """Remove a placement group by hex id (a no-op for None); safe in a long-lived process."""
    if placement_group_id:
        remove_placement_group(PlacementGroup(PlacementGroupID(bytes.fromhex(placement_group_id))))


def remove_placement_groups_named(name: str) -> int:
    """Remove every live placement group called ``name``; returns how many.

    Uses Ray's placement group table (GlobalStateAccessor): call it from a task's process, never
    from the triggerer.
    """
    removed = 0
    for pg_id, info in placement_group_table().items():
        if info.get("name") == name and info.get("state") != "REMOVED":
            remove_placement_group_by_id(pg_id)
            removed += 1
    return removed
