"""TrialsTrigger: what the provider's triggers share (serialization, the trials store, polling, cleanup)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from airflow.triggers.base import BaseTrigger

from airflow_trials.hooks.trials import DEFAULT_TRIALS_CONN_ID, TrialsDbHook

if TYPE_CHECKING:
    from airflow_trials.store import TrialStore

T = TypeVar("T")


class TrialsTrigger(BaseTrigger):
    """Base of :class:`~airflow_trials.triggers.trial.TrialTrigger` and
    :class:`~airflow_trials.triggers.trial.TrialStatusTrigger`.

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

    async def cleanup(self) -> None:
        """Free what this trigger holds locally (never the trial it watches)."""
        await self.disconnect()
