"""TrialTrigger: watches a trial on Ray from the triggerer, recording its results, without blocking."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_trials.hooks.trials import DEFAULT_RAY_CONN_ID, DEFAULT_TRIALS_CONN_ID, TrialsHook

TERMINAL = ("TERMINATED", "ERROR")


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
    """

    def __init__(
        self,
        experiment_name: str,
        trial_id: str,
        ray_conn_id: str = DEFAULT_RAY_CONN_ID,
        trials_conn_id: str = DEFAULT_TRIALS_CONN_ID,
        poll_interval_seconds: float = 2.0,
    ) -> None:
        super().__init__()
        self.experiment_name = experiment_name
        self.trial_id = trial_id
        self.ray_conn_id = ray_conn_id
        self.trials_conn_id = trials_conn_id
        self.poll_interval_seconds = poll_interval_seconds

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            "airflow_trials.triggers.trial.TrialTrigger",
            {
                "experiment_name": self.experiment_name,
                "trial_id": self.trial_id,
                "ray_conn_id": self.ray_conn_id,
                "trials_conn_id": self.trials_conn_id,
                "poll_interval_seconds": self.poll_interval_seconds,
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        hook = TrialsHook(self.ray_conn_id, self.trials_conn_id)
        executor = await asyncio.to_thread(hook.get_executor)
        store = await asyncio.to_thread(hook.get_store)
        try:
            actor = await asyncio.to_thread(executor.attach, self.experiment_name, self.trial_id)
            if actor is None:
                finished = await asyncio.to_thread(self._finished_in_store, store)
                # Gone after it finished (this trigger ran again after the triggerer restarted, and
                # its first run had freed the actor): report the stored end, not a failure.
                yield TriggerEvent(finished or self._lost("its Ray actor is gone (node lost or killed)"))
                return
            seen = 0
            recorded: set[str] = set()
            placed = False
            while True:
                try:
                    # Resolves once Ray has placed the actor (a queued trial waits here, deferred),
                    # then after poll_interval_seconds or as soon as the trial ends.
                    asked = time.monotonic()
                    snapshot = await actor.poll.remote(seen, self.poll_interval_seconds)
                except Exception as e:  # RayActorError and friends: the actor died under us
                    yield TriggerEvent(self._lost(f"its Ray actor died while it ran: {e}"))
                    return
                if not placed:
                    placed = True
                    await asyncio.to_thread(store.update_trial, self.trial_id, status="RUNNING")
                seen = await asyncio.to_thread(self._record, store, snapshot, recorded, seen)
                if snapshot["status"] in TERMINAL:
                    # Free the trial's resources now rather than when a worker runs
                    # execute_complete, so a trial queued behind it starts at once; the event
                    # carries all execute_complete needs.
                    await asyncio.to_thread(executor.terminate, self.experiment_name, self.trial_id)
                    if snapshot["status"] == "TERMINATED":
                        await asyncio.to_thread(store.update_trial, self.trial_id, status="TERMINATED")
                    yield TriggerEvent({**_event(self.experiment_name, snapshot), "released": True})
                    return
                # The actor waits for us; if it answered early (it is not running its loop), pace.
                await asyncio.sleep(max(0.0, self.poll_interval_seconds - (time.monotonic() - asked)))
        except asyncio.CancelledError:
            # Cancelled: a triggerer restart (the task is still deferred, leave the trial running)
            # or the task was cleared, marked or killed (then stop the trial on Ray).
            if not await self._task_still_deferred():
                self.log.info("Task of trial %s is gone; stopping the trial on Ray.", self.trial_id)
                await asyncio.to_thread(executor.terminate, self.experiment_name, self.trial_id)
                await asyncio.to_thread(
                    store.update_trial, self.trial_id, status="TERMINATED",
                    error_msg="Stopped because its Airflow task was cleared or marked while deferred.",
                )
            raise
        finally:
            # Closing pooled connections can block on the network: not in the event loop.
            await asyncio.to_thread(store.dispose)

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

    def _lost(self, why: str) -> dict[str, Any]:
        return {
            "trial_id": self.trial_id,
            "experiment_name": self.experiment_name,
            "status": "ERROR",
            "error": f"Trial {self.trial_id} of experiment {self.experiment_name} failed: {why}.",
            "last_result": None,
            "best_checkpoint": None,
            "num_results": 0,
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
