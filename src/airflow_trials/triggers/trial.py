"""TrialTrigger: watches a trial on Ray from the triggerer, recording its results, without blocking."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_trials.exceptions import StoreError
from airflow_trials.hooks.trials import DEFAULT_RAY_CONN_ID, DEFAULT_TRIALS_CONN_ID, TrialsHook

TERMINAL = ("TERMINATED", "ERROR")
# How long a trigger keeps trying while Ray does not answer (its head restarting, say) before it
# gives the trial up as lost to infrastructure; the task then resumes it from its latest checkpoint.
RAY_OUTAGE_TIMEOUT_SECONDS = 120.0
# Slack over a poll's own wait before an unanswered poll counts as Ray not answering.
POLL_GRACE_SECONDS = 30.0



class TrialTrigger(BaseTrigger):
    """Polls a trial's Ray actor, writes its new results and checkpoints to the trials store, and
    yields one event when the trial ends (or its actor is gone).

    Every Ray and database call is awaited (ObjectRefs) or run in a thread, so the triggerer's
    event loop never blocks. Results are written idempotently, so a trigger that runs again after
    a triggerer restart re-sends them harmlessly.

    :param experiment_name: the trial's experiment.
    :param trial_id: the trial.
    :param ray_conn_id: Ray connection; default ``ray_default``.
    :param trials_conn_id: trials DB connection; default ``trials_default``.
    :param poll_interval_seconds: time between polls; default 2.
    :param ray_outage_timeout_seconds: how long to keep trying while Ray does not answer before
        the trial counts as lost to infrastructure; default 120.
    :param ray_cluster_id: hex id of the Ray cluster the trial was launched on; when the cluster
        at Ray's address is another one and the actor is gone, the trial was lost with the old
        cluster (infrastructure), not through its own code. Default None: not checked.
    """

    def __init__(
        self,
        experiment_name: str,
        trial_id: str,
        ray_conn_id: str = DEFAULT_RAY_CONN_ID,
        trials_conn_id: str = DEFAULT_TRIALS_CONN_ID,
        poll_interval_seconds: float = 2.0,
        ray_outage_timeout_seconds: float = RAY_OUTAGE_TIMEOUT_SECONDS,
        ray_cluster_id: str | None = None,
    ) -> None:
        super().__init__()
        self.experiment_name = experiment_name
        self.trial_id = trial_id
        self.ray_conn_id = ray_conn_id
        self.trials_conn_id = trials_conn_id
        self.poll_interval_seconds = poll_interval_seconds
        self.ray_outage_timeout_seconds = ray_outage_timeout_seconds
        self.ray_cluster_id = ray_cluster_id

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            "airflow_trials.triggers.trial.TrialTrigger",
            {
                "experiment_name": self.experiment_name,
                "trial_id": self.trial_id,
                "ray_conn_id": self.ray_conn_id,
                "trials_conn_id": self.trials_conn_id,
                "poll_interval_seconds": self.poll_interval_seconds,
                "ray_outage_timeout_seconds": self.ray_outage_timeout_seconds,
                "ray_cluster_id": self.ray_cluster_id,
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        hook = TrialsHook(self.ray_conn_id, self.trials_conn_id)
        store = await asyncio.to_thread(hook.get_store)
        watch = _Watch(self, hook, store)
        try:
            event = await watch.until_end()
        except asyncio.CancelledError:
            # Cancelled: a triggerer restart (the task is still deferred, leave the trial running)
            # or the task was cleared, marked or killed (then stop the trial on Ray).
            if not await self._task_still_deferred():
                self.log.info("Task of trial %s is gone; stopping the trial on Ray.", self.trial_id)
                await watch.release()
                await asyncio.to_thread(
                    store.update_trial, self.trial_id, status="TERMINATED",
                    error_msg="Stopped because its Airflow task was cleared or marked while deferred.",
                )
            raise
        finally:
            # Closing pooled connections can block on the network: not in the event loop.
            await asyncio.to_thread(store.dispose)
        yield TriggerEvent(event)

    def _record(self, store: Any, snapshot: dict[str, Any], recorded: set[str], seen: int) -> int:
        results = snapshot["results"]
        if results:
            store.add_results(self.trial_id, results)
        kept = {c["path"]: c for c in snapshot["checkpoints"]}
        for path, ckpt in kept.items():
            if path not in recorded:
                store.add_checkpoint(self.trial_id, path, ckpt["iteration"], ckpt["score"])
                recorded.add(path)
        for path in recorded - kept.keys():
            store.mark_checkpoint_deleted(self.trial_id, path)
            recorded.discard(path)
        return seen + len(results)

    def _finished_in_store(self, store: Any) -> dict[str, Any] | None:
        record = store.get_trial(self.trial_id)
        if record.status.value != "TERMINATED":
            return None
        return stored_end_event(store, self.experiment_name, record)

    def _lost(self, why: str, *, infrastructure: bool = False, released: bool = False) -> dict[str, Any]:
        """The ERROR event of a trial whose actor is gone (``infrastructure``: with its node or its
        cluster, not because of the trial) or that this trigger had to stop."""
        return {
            "trial_id": self.trial_id,
            "experiment_name": self.experiment_name,
            "status": "ERROR",
            "error": f"Trial {self.trial_id} of experiment {self.experiment_name} failed: {why}.",
            "last_result": None,
            "best_checkpoint": None,
            "num_results": 0,
            "infrastructure": infrastructure,
            "released": released,
        }

    async def _task_still_deferred(self) -> bool:
        """Ask the API server whether our task instance is still DEFERRED (as Google's Dataproc trigger)."""
        ti = self.task_instance
        if ti is None:
            return True  # not running under a triggerer: never stop work we cannot account for
        from airflow.sdk.execution_time.task_runner import RuntimeTaskInstance

        states = await asyncio.to_thread(
            RuntimeTaskInstance.get_task_states,
            dag_id=ti.dag_id,
            task_ids=[ti.task_id],
            run_ids=[ti.run_id],
            map_index=ti.map_index,
        )
        key = ti.task_id if ti.map_index is None or ti.map_index < 0 else f"{ti.task_id}_{ti.map_index}"
        return states.get(ti.run_id, {}).get(key) == "deferred"



class _Ended(Exception):
    """Raised inside a watch with the event that ends it."""

    def __init__(self, event: dict[str, Any]) -> None:
        super().__init__(event["status"])
        self.event = event


class _Watch:
    """One trigger run's hold on its trial: the actor, what was recorded, and how to free it.

    Every Ray call is awaited or runs in a thread, bounded in time, and reads the GCS only in ways
    that survive a GCS restart, so neither a hung Ray nor a restarted one stalls or kills the
    triggerer: an actor that stops answering is re-attached (reconnecting to a restarted
    cluster); one that is gone ends the watch with an ERROR event.
    """

    def __init__(self, trigger: TrialTrigger, hook: TrialsHook, store: Any) -> None:
        self.trigger = trigger
        self.hook = hook
        self.store = store
        self.executor: Any = None
        self.actor: Any = None
        self.placement_group_id: str | None = None
        self.seen = 0
        self.recorded: set[str] = set()
        self.placed = False
        self.pending: Any = None  # the poll in flight (a Ray ObjectRef)
        self.unanswered_since: float | None = None

    async def until_end(self) -> dict[str, Any]:
        """Record the trial's results until it ends; the end event (TERMINATED, or ERROR)."""
        trigger = self.trigger
        try:
            await self._attach()
            while True:
                asked = time.monotonic()
                snapshot = await self._next_snapshot()
                await self._record(snapshot)
                if snapshot["status"] in TERMINAL:
                    return await self._ended(snapshot)
                # The actor waits for us; if it answered early (it is not running its loop), pace.
                await asyncio.sleep(max(0.0, trigger.poll_interval_seconds - (time.monotonic() - asked)))
        except _Ended as end:
            return end.event

    async def release(self) -> None:
        """Kill the trial's actor and remove its placement group (best effort)."""
        try:
            executor = self.executor or await asyncio.to_thread(self.hook.get_executor)
            await asyncio.to_thread(
                executor.release, self.trigger.experiment_name, self.trigger.trial_id, self.placement_group_id
            )
        except Exception as e:  # Ray down: its restart frees the trial's resources anyway
            self.trigger.log.warning("Could not stop trial %s on Ray: %s", self.trigger.trial_id, e)

    async def _attach(self) -> None:
        trigger = self.trigger
        self.actor = await self._find_actor()
        if self.actor is None:
            finished = await asyncio.to_thread(trigger._finished_in_store, self.store)
            # Gone after it finished (this trigger ran again after the triggerer restarted, and
            # its first run had freed the actor): report the stored end, not a failure.
            if finished:
                raise _Ended(finished)
            if await self._cluster_replaced():
                raise _Ended(trigger._lost(
                    "the Ray cluster it was launched on is gone (a new cluster answers at Ray's address); "
                    "its task resumes it from its latest checkpoint", infrastructure=True, released=True,
                ))
            raise _Ended(trigger._lost("its Ray actor is gone (node lost or killed)"))
        from airflow_trials.execution.ray_state import actor_info

        info = await asyncio.to_thread(actor_info, self.actor)
        self.placement_group_id = info.placement_group_id or self.placement_group_id

    async def _cluster_replaced(self) -> bool:
        """Is this process now connected to another Ray cluster than the trial was launched on?"""
        from airflow_trials.execution.ray_state import current_cluster_id

        launched_on = self.trigger.ray_cluster_id
        now = await asyncio.to_thread(current_cluster_id)
        return launched_on is not None and now is not None and now != launched_on

    async def _find_actor(self) -> Any:
        """The trial's actor, or None when it is gone, once Ray answers (reconnecting this process
        if the cluster at Ray's address restarted)."""
        trigger = self.trigger
        while True:
            try:
                self.executor = await asyncio.to_thread(self.hook.get_executor, verify=True)
                return await asyncio.to_thread(self.executor.attach, trigger.experiment_name, trigger.trial_id)
            except Exception as e:  # Ray down, or answering with errors while it restarts
                await self._ray_not_answering(e)

    async def _next_snapshot(self) -> dict[str, Any]:
        from ray.exceptions import ActorUnavailableError, RayActorError

        wait_s = self.trigger.poll_interval_seconds
        while True:
            # Resolves once Ray has placed the actor (a queued trial waits here, deferred), then
            # after poll_interval_seconds or as soon as the trial ends. A poll that times out is
            # awaited again rather than sent again, so a queued actor's calls do not pile up.
            if self.pending is None:
                self.pending = self.actor.poll.remote(self.seen, wait_s)
            try:
                snapshot: dict[str, Any] = await asyncio.wait_for(_resolve(self.pending), wait_s + POLL_GRACE_SECONDS)
            except TimeoutError as e:
                if self.placed:  # a queued trial is not expected to answer: only check Ray is there
                    await self._ray_not_answering(e)
                await self._reattach()
                continue
            except ActorUnavailableError as e:
                await self._ray_not_answering(e)
                await self._reattach()
                self.pending = None
                continue
            except RayActorError as e:  # the actor died under us
                raise _Ended(await self._died(e)) from e
            self.pending = None
            self.unanswered_since = None
            return snapshot

    async def _ray_not_answering(self, error: BaseException) -> None:
        """Wait a little, or end the watch once Ray has not answered for too long."""
        trigger = self.trigger
        now = time.monotonic()
        self.unanswered_since = self.unanswered_since or now
        silent_s = now - self.unanswered_since
        if silent_s > trigger.ray_outage_timeout_seconds:
            await self.release()
            raise _Ended(trigger._lost(
                f"Ray did not answer for {silent_s:.0f} s ({type(error).__name__}: {error}); its task "
                "resumes the trial from its latest checkpoint once Ray is back",
                infrastructure=True, released=True,
            ))
        trigger.log.warning(
            "Trial %s: Ray does not answer (%s: %s); trying again (%.0f of %.0f s).",
            trigger.trial_id, type(error).__name__, error, silent_s, trigger.ray_outage_timeout_seconds,
        )
        await asyncio.sleep(min(5.0, max(0.5, trigger.poll_interval_seconds)))

    async def _reattach(self) -> None:
        """Find the trial's actor again after Ray stopped answering; end the watch if it is gone."""
        actor = await self._find_actor()
        if actor is None:
            await self.release()
            raise _Ended(self.trigger._lost(
                "its Ray actor is gone: the Ray cluster restarted or the trial's node was lost; its "
                "task resumes it from its latest checkpoint", infrastructure=True, released=True,
            ))
        if actor._actor_id != self.actor._actor_id:
            self.pending = None
        self.actor = actor

    async def _died(self, error: BaseException) -> dict[str, Any]:
        from airflow_trials.execution.ray_state import ActorInfo, actor_info

        trigger = self.trigger
        try:
            info = await asyncio.to_thread(actor_info, self.actor)
        except Exception:  # the GCS is gone too: the cluster went down with the actor
            info = ActorInfo("DEAD", None, "NODE_DIED", "The Ray GCS does not answer either.")
        self.placement_group_id = info.placement_group_id or self.placement_group_id
        await self.release()
        cause = f"{info.death_reason}: {info.death_message}" if info.death_reason else str(error)
        return trigger._lost(
            f"its Ray actor died while it ran ({cause})",
            infrastructure=info.lost_to_infrastructure, released=True,
        )

    async def _record(self, snapshot: dict[str, Any]) -> None:
        """Write new results and checkpoints; a DB that fails past the store's retries stops the
        trial, so that its task's retry resumes it from its latest recorded checkpoint."""
        trigger = self.trigger
        try:
            if not self.placed:
                await asyncio.to_thread(self.store.update_trial, trigger.trial_id, status="RUNNING")
                self.placed = True
            self.seen = await asyncio.to_thread(trigger._record, self.store, snapshot, self.recorded, self.seen)
        except StoreError as e:
            await self.release()
            raise _Ended(trigger._lost(
                f"its results could not be written to the trials DB ({e}); the trial was stopped on "
                "Ray so that its task's retry resumes it from its latest recorded checkpoint",
                released=True,
            )) from e

    async def _ended(self, snapshot: dict[str, Any]) -> dict[str, Any]:
        # Free the trial's resources now rather than when a worker runs execute_complete, so a
        # trial queued behind it starts at once; the event carries all execute_complete needs.
        await self.release()
        if snapshot["status"] == "TERMINATED":
            await asyncio.to_thread(self.store.update_trial, self.trigger.trial_id, status="TERMINATED")
        return {**_event(self.trigger.experiment_name, snapshot), "released": True}


async def _resolve(ref: Any) -> Any:
    return await ref


def stored_end_event(store: Any, experiment_name: str, record: Any) -> dict[str, Any]:
    """The TERMINATED event of a trial whose end the store holds (its actor is already gone)."""
    latest = store.latest_checkpoint(record.trial_id)
    return {
        "trial_id": record.trial_id,
        "experiment_name": experiment_name,
        "status": "TERMINATED",
        "error": None,
        "last_result": record.last_result,
        "best_checkpoint": latest.path if latest else None,
        "num_results": None,
        "released": True,
    }


def _event(experiment_name: str, snapshot: dict[str, Any]) -> dict[str, Any]:
    return {
        "trial_id": snapshot["trial_id"],
        "experiment_name": experiment_name,
        "status": snapshot["status"],
        "error": snapshot["error"],
        "last_result": snapshot["last_result"] or None,
        "best_checkpoint": snapshot["best_checkpoint"],
        "num_results": snapshot["num_results"],
    }


def trials_status(store: Any, experiment_name: str, trial_id: str | None, run_key: str | None) -> dict[str, Any]:
    """What a TrialSensor waits on, read from the trials store: done or not, and the statuses."""
    if trial_id is not None:
        trials = [store.get_trial(trial_id)]
    else:
        runs = [r for r in store.list_experiment_runs(experiment_name) if r.run_key == run_key]
        if not runs:
            return {"done": False, "statuses": {}, "failed": []}
        trials = store.list_trials(experiment_run_id=runs[0].id)
    statuses = {t.trial_id: t.status.value for t in trials}
    done = bool(statuses) and all(s in TERMINAL for s in statuses.values())
    return {"done": done, "statuses": statuses, "failed": sorted(k for k, v in statuses.items() if v == "ERROR")}


class TrialStatusTrigger(BaseTrigger):
    """Polls the trials store until a trial, or every trial of an experiment run, has ended.

    :param experiment_name: the experiment.
    :param trial_id: the trial to wait for; or
    :param run_key: the experiment run (its Airflow run_id) whose trials to wait for.
    :param trials_conn_id: trials DB connection; default ``trials_default``.
    :param poll_interval_seconds: default 30.
    """

    def __init__(
        self,
        experiment_name: str,
        trial_id: str | None = None,
        run_key: str | None = None,
        trials_conn_id: str = DEFAULT_TRIALS_CONN_ID,
        poll_interval_seconds: float = 30.0,
    ) -> None:
        super().__init__()
        self.experiment_name = experiment_name
        self.trial_id = trial_id
        self.run_key = run_key
        self.trials_conn_id = trials_conn_id
        self.poll_interval_seconds = poll_interval_seconds

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            "airflow_trials.triggers.trial.TrialStatusTrigger",
            {
                "experiment_name": self.experiment_name,
                "trial_id": self.trial_id,
                "run_key": self.run_key,
                "trials_conn_id": self.trials_conn_id,
                "poll_interval_seconds": self.poll_interval_seconds,
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from airflow_trials.hooks.trials import TrialsDbHook

        store = await asyncio.to_thread(TrialsDbHook(self.trials_conn_id).get_conn)
        try:
            while True:
                state = await asyncio.to_thread(
                    trials_status, store, self.experiment_name, self.trial_id, self.run_key
                )
                if state["done"]:
                    yield TriggerEvent(state)
                    return
                await asyncio.sleep(self.poll_interval_seconds)
        finally:
            # Closing pooled connections can block on the network: not in the event loop.
            await asyncio.to_thread(store.dispose)
