"""TrialsTrigger: what the provider's triggers share (serialization, the trials store, polling, cleanup)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from airflow.triggers.base import BaseTrigger

from airflow_trials.hooks.trials import DEFAULT_TRIALS_CONN_ID, TrialsDbHook

if TYPE_CHECKING:
    from airflow_trials.store import TrialStore

T = TypeVar("T")

# The least time a trigger under a triggerer runs before it fires (see TrialsTrigger.watch_fenced).
MIN_DEFERRAL_SECONDS = 15.0


class TrialsTrigger(BaseTrigger):
    """Base of :class:`~airflow_trials.triggers.trial.TrialTrigger`,
    :class:`~airflow_trials.triggers.trial.TrialStatusTrigger` and
    :class:`~airflow_trials.triggers.sweep.SweepTrigger`.

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

    def __init__(self, trials_conn_id: str = DEFAULT_TRIALS_CONN_ID, poll_interval_seconds: float = 2.0) -> None:
        super().__init__()
        self.trials_conn_id = trials_conn_id
        self.poll_interval_seconds = poll_interval_seconds
        self._store: TrialStore | None = None

    def serialize(self) -> tuple[str, dict[str, Any]]:
        cls = type(self)
        return f"{cls.__module__}.{cls.__qualname__}", {name: getattr(self, name) for name in cls.serialized_fields}

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
        """Call ``read(store)`` in a thread every ``poll_interval_seconds`` until it returns a value."""
        store = await self.connect()
        while True:
            value = await asyncio.to_thread(read, store)
            if value is not None:
                return value
            await asyncio.sleep(self.poll_interval_seconds)

    async def watch_fenced(self, watch: Callable[[], Awaitable[dict[str, Any]]]) -> dict[str, Any]:
        """The event ``watch()`` ends with, returned no sooner than MIN_DEFERRAL_SECONDS after this
        started when under a triggerer; :meth:`cleanup` runs however it ends.

        The scheduler can fail a task whose trigger fires before it has processed the executor's
        "success" for the worker that deferred (both share one executor key), as the fault tests
        saw with trials that ended a few seconds after deferring. Cancelled or not, what the
        trigger watches is not stopped here: a triggerer restart cancels the trigger too, and the
        next one re-attaches; ``on_kill`` stops it when a user acts.
        """
        started = time.monotonic()
        try:
            event = await watch()
            if self.task_instance is not None:
                await asyncio.sleep(max(0.0, started + MIN_DEFERRAL_SECONDS - time.monotonic()))
        finally:
            await self.cleanup()
        return event

    async def cleanup(self) -> None:
        """Free what this trigger holds locally (never the trial it watches)."""
        await self.disconnect()
