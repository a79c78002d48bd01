"""TrialTrigger: watches a trial on Ray from the triggerer, yielding its end; and TrialsTrigger."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_trials.core.status import TrialStatus
from airflow_trials.execution.triggerer.trial_watch import (
    POLL_GRACE_SECONDS,
    RAY_OUTAGE_TIMEOUT_SECONDS,
    TrialWatch,
    TrialWatchSpec,
    stored_end_event,
)
from airflow_trials.hooks.trials import (
    DEFAULT_RAY_CONN_ID,
    DEFAULT_TRIALS_CONN_ID,
    TrialsDbHook,
    TrialsHook,
)

if TYPE_CHECKING:
    from airflow_trials.store import TrialStore

__all__ = [
    "MIN_DEFERRAL_SECONDS",
    "POLL_GRACE_SECONDS",
    "RAY_OUTAGE_TIMEOUT_SECONDS",
    "TrialStatusTrigger",
    "TrialTrigger",
    "TrialWatchSpec",
    "TrialsTrigger",
    "stored_end_event",
    "trials_status",
]

T = TypeVar("T")

# The least time a trigger under a triggerer runs before it fires (see TrialsTrigger.watch_fenced).
MIN_DEFERRAL_SECONDS = 15.0


class TrialsTrigger(BaseTrigger):
    """Base of :class:`TrialTrigger`, :class:`TrialStatusTrigger` and
    :class:`~airflow_trials.triggers.sweep_trigger.SweepTrigger`.

    It connects to the trials store, polls it, and releases it, always off the event loop: opening
    and closing pooled connections can block on the network. Following ``BaseTrigger``'s contract,
    :meth:`cleanup` (run on every exit: fired, cancelled, or the triggerer stopping) frees only
    what this process holds; it never touches a trial.

    A subclass lists its constructor's arguments in ``serialized_fields``: :meth:`serialize`
    returns them under the subclass's own import path, which deferred tasks keep in Airflow's DB.

    :param trials_conn_id: trials DB connection; default ``trials_default``.
    :param poll_interval_seconds: time between polls.
    """

    serialized_fields: ClassVar[tuple[str, ...]] = ()

    def __init__(
        self, trials_conn_id: str = DEFAULT_TRIALS_CONN_ID, poll_interval_seconds: float = 2.0
    ) -> None:
        super().__init__()
        self.trials_conn_id = trials_conn_id
        self.poll_interval_seconds = poll_interval_seconds
        self._store: TrialStore | None = None

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return self.classpath(), {name: getattr(self, name) for name in self.serialized_fields}

    @classmethod
    def classpath(cls) -> str:
        """The import path Airflow keeps for a deferred task's trigger."""
        return f"{cls.__module__}.{cls.__qualname__}"

    async def connect(self) -> TrialStore:
        """The trials store, opened once per trigger (in a thread)."""
        if self._store is None:
            self._store = await asyncio.to_thread(TrialsDbHook(self.trials_conn_id).get_conn)
        return self._store

    async def disconnect(self) -> None:
        """Close the store's pooled connections (in a thread); safe to call more than once."""
        store, self._store = self._store, None
        if store is not None:
            await asyncio.to_thread(store.dispose)

    async def poll_store(self, read: Callable[[TrialStore], T | None]) -> T:
        """Call ``read(store)`` in a thread every ``poll_interval_seconds`` until it returns a
        value."""
        store = await self.connect()
        while True:
            value = await asyncio.to_thread(read, store)
            if value is not None:
                return value
            await asyncio.sleep(self.poll_interval_seconds)

    async def watch_fenced(self, watch: Callable[[], Awaitable[T]]) -> T:
        """The end ``watch()`` returns, no sooner than MIN_DEFERRAL_SECONDS after this started
        when under a triggerer; :meth:`cleanup` runs however it ends.

        The scheduler can fail a task whose trigger fires before it has processed the executor's
        "success" for the worker that deferred (both share one executor key), as the fault tests
        saw with trials that ended a few seconds after deferring. Cancelled or not, what the
        trigger watches is not stopped here: a triggerer restart cancels the trigger too, and the
        next one re-attaches; ``on_kill`` stops it when a user acts.
        """
        started = time.monotonic()
        try:
            end = await watch()
            if self.task_instance is not None:
                await asyncio.sleep(max(0.0, started + MIN_DEFERRAL_SECONDS - time.monotonic()))
        finally:
            await self.cleanup()
        return end

    async def cleanup(self) -> None:
        """Free what this trigger holds locally (never the trial it watches)."""
        await self.disconnect()

    async def moved_to_another_triggerer(self) -> bool:
        """Whether an ``on_kill`` call is no user's action: the task is still deferred.

        Airflow 3.3 cancels a trigger "by user action", and so calls ``on_kill``, also when it
        moves to another triggerer: with two triggerers, one whose heartbeat lags past
        ``[triggerer] triggerer_health_check_threshold`` loses its triggers to the other, which
        runs them on (seen on the production shape under load). A user who clears or marks the
        task has changed its state by then; a moved trigger's task is still deferred. Unknown
        (no task instance, or the state cannot be read): False, as a user's action.
        """
        ti = self.task_instance
        if ti is None:
            return False
        try:
            from airflow.sdk.execution_time.task_runner import RuntimeTaskInstance
            from asgiref.sync import sync_to_async

            map_index = ti.map_index if ti.map_index is not None and ti.map_index >= 0 else None
            states = await sync_to_async(RuntimeTaskInstance.get_task_states)(
                dag_id=ti.dag_id, map_index=map_index, task_ids=[ti.task_id], run_ids=[ti.run_id]
            )
        except Exception as e:  # noqa: BLE001 - not knowing is treated as the user's action
            self.log.warning("Could not read the state of task %s: %s", ti.task_id, e)
            return False
        key = ti.task_id if map_index is None else f"{ti.task_id}_{map_index}"
        state = (states.get(ti.run_id) or {}).get(key)
        if state == "deferred":
            self.log.info(
                "Task %s is deferred: its trigger moved to another triggerer, or a newer try "
                "deferred; that one watches on, and nothing is stopped.",
                ti.task_id,
            )
            return True
        return False


class TrialTrigger(TrialsTrigger):
    """Watches a trial's Ray actor, writes its new results and checkpoints to the trials store,
    and yields one event of plain values when the trial ends (or its actor is gone): a
    :class:`~airflow_trials.core.end.TrialEnd`, which the operator's ``execute_complete`` reads.

    Its arguments are a :class:`~airflow_trials.execution.triggerer.trial_watch.TrialWatchSpec`,
    which ``serialize()`` returns; the watch itself is a
    :class:`~airflow_trials.execution.triggerer.trial_watch.TrialWatch` made from that spec and the
    actor client of its hook (``TrialsHook.get_actor_client``), which never reads the trigger: the
    trigger builds it, awaits it, yields its event, and on a kill releases its actor. Its polls go
    through the triggerer's shared :mod:`~airflow_trials.execution.triggerer.poller`: one thread
    makes every trigger's Ray calls and writes their progress in one transaction per tick, so the
    event loop never waits on Ray or the database. The watch's other Ray and database calls
    (attach, release, reads) run in threads. Results are written idempotently, so a trigger that
    runs again after a triggerer restart re-sends them harmlessly.

    When a user clears or marks the deferred task, :meth:`on_kill` stops the trial on Ray; a
    triggerer restart (which also cancels the trigger) leaves it running for the next trigger.

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
    :param scheduler: the scheduler's settings (``AshaRungs.to_dict()``,
        ``MOASHARungs.to_dict()`` or ``MedianRule.to_dict()``): the trigger judges each result
        against the run's state in the trials store (ASHA's and MOASHA's rungs, the median rule's
        running means) and gives the actor its verdict
        (:mod:`~airflow_trials.schedulers.trial_judge`). Default None: the trial runs to its
        criterion.
    :param bracket: the trial's ASHA or MOASHA bracket; default 0.
    :param experiment_run_id: the run whose trials the scheduler compares; required with
        ``scheduler``.
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
        scheduler: dict[str, Any] | None = None,
        bracket: int = 0,
        experiment_run_id: int | None = None,
    ) -> None:
        super().__init__(trials_conn_id, poll_interval_seconds)
        self.spec = TrialWatchSpec(
            experiment_name,
            trial_id,
            ray_conn_id,
            trials_conn_id,
            poll_interval_seconds,
            ray_outage_timeout_seconds,
            ray_cluster_id,
            scheduler,
            bracket,
            experiment_run_id,
        )
        self._watch: TrialWatch | None = None

    @property
    def trial_id(self) -> str:
        return self.spec.trial_id

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return self.classpath(), self.spec.to_kwargs()

    async def run(self) -> AsyncIterator[TriggerEvent]:
        yield TriggerEvent(await self.watch_fenced(self._until_end))

    def _new_watch(self, store: TrialStore) -> TrialWatch:
        hook = TrialsHook(self.spec.ray_conn_id, self.spec.trials_conn_id)
        try_number = getattr(self.task_instance, "try_number", None)
        return TrialWatch(self.spec, hook.get_actor_client, store, self.log, try_number)

    async def _until_end(self) -> dict[str, Any]:
        watch = self._watch = self._new_watch(await self.connect())
        return await watch.until_end()

    async def on_kill(self) -> None:
        """The user cleared or marked the deferred task: stop the trial on Ray and record it.

        Airflow runs this for a user's action, never when the triggerer restarts (see
        ``BaseTrigger.on_kill``), after ``run()`` was cancelled and before :meth:`cleanup`; and
        when the trigger moves to another triggerer, where it does nothing
        (:meth:`moved_to_another_triggerer`).
        """
        store = await self.connect()
        # Fenced by the try number: Airflow may start the task's next try before this runs, and
        # a stop sent by try N must never end the trial that try N+1 took over. That try may be
        # deferred already, so the takeover is read before the task's state.
        try_number = getattr(self.task_instance, "try_number", None)
        try:
            taken_over = await asyncio.to_thread(
                _taken_over_by_a_later_try, store, self.trial_id, try_number
            )
        except Exception as e:  # noqa: BLE001 - unknown: the task's state decides, then the fence
            self.log.warning("Could not read which try holds trial %s: %s", self.trial_id, e)
            taken_over = False
        if taken_over:
            self._log_taken_over()
            return
        if await self.moved_to_another_triggerer():
            return
        stopped = await asyncio.to_thread(
            TrialsHook.record_stop_from_airflow, store, self.trial_id, try_number
        )
        if not stopped:
            self._log_taken_over()
            return
        self.log.info(
            "Task of trial %s was cleared or marked while deferred; stopping the trial on Ray.",
            self.trial_id,
        )
        watch = self._watch or self._new_watch(store)
        await watch.release()  # the actor it watched, never one a later try started

    def _log_taken_over(self) -> None:
        self.log.info(
            "Task of trial %s was cleared; a later try took the trial over, leaving it running.",
            self.trial_id,
        )

    async def cleanup(self) -> None:
        """Stop polling and free the store's connections (never the trial: see :meth:`on_kill`)."""
        if self._watch is not None:
            self._watch.close()
        await super().cleanup()


def _taken_over_by_a_later_try(store: Any, trial_id: str, try_number: int | None) -> bool:
    """Whether a try after ``try_number`` registered the trial (its task was cleared and the new
    try re-attached): the old try's ``on_kill`` then leaves it alone, whatever the task's state."""
    if try_number is None:
        return False
    registered = store.reader.get_trial(trial_id).try_number
    return registered is not None and registered > try_number


def trials_status(
    store: Any, experiment_name: str, trial_id: str | None, run_key: str | None
) -> dict[str, Any]:
    """What a TrialSensor waits on, read from the trials store: done or not, and the statuses."""
    if trial_id is not None:
        trials = [store.reader.get_trial(trial_id)]
    else:
        runs = [
            r for r in store.reader.list_experiment_runs(experiment_name) if r.run_key == run_key
        ]
        if not runs:
            return {"done": False, "statuses": {}, "failed": []}
        trials = store.reader.list_trials(experiment_run_id=runs[0].id)
    statuses = {t.trial_id: t.status.value for t in trials}
    done = bool(trials) and all(t.status.is_terminal() for t in trials)
    failed = sorted(t.trial_id for t in trials if t.status is TrialStatus.ERROR)
    return {"done": done, "statuses": statuses, "failed": failed}


class TrialStatusTrigger(TrialsTrigger):
    """Polls the trials store until a trial, or every trial of an experiment run, has ended.

    :param experiment_name: the experiment.
    :param trial_id: the trial to wait for; or
    :param run_key: the experiment run (its Airflow run_id) whose trials to wait for.
    :param trials_conn_id: trials DB connection; default ``trials_default``.
    :param poll_interval_seconds: default 30.
    """

    serialized_fields = (
        "experiment_name",
        "trial_id",
        "run_key",
        "trials_conn_id",
        "poll_interval_seconds",
    )

    def __init__(
        self,
        experiment_name: str,
        trial_id: str | None = None,
        run_key: str | None = None,
        trials_conn_id: str = DEFAULT_TRIALS_CONN_ID,
        poll_interval_seconds: float = 30.0,
    ) -> None:
        super().__init__(trials_conn_id, poll_interval_seconds)
        self.experiment_name = experiment_name
        self.trial_id = trial_id
        self.run_key = run_key

    async def run(self) -> AsyncIterator[TriggerEvent]:
        try:
            state = await self.poll_store(self._done)
        finally:
            await self.cleanup()
        yield TriggerEvent(state)

    def _done(self, store: Any) -> dict[str, Any] | None:
        state = trials_status(store, self.experiment_name, self.trial_id, self.run_key)
        return state if state["done"] else None
