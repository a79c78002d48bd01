"""NewDatasetVersionTrigger: an Asset watcher's trigger that fires when a new dataset version
lands in a directory."""

from __future__ import annotations

import asyncio
import fnmatch
import os
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseEventTrigger, TriggerEvent


class NewDatasetVersionTrigger(BaseEventTrigger):
    """Watches ``directory`` and yields one event per dataset version that appears in it, for an
    ``AssetWatcher`` (an Asset event per version, which schedules the DAGs on that Asset).

    A version is an entry of ``directory`` (a file or a directory) whose name matches
    ``pattern``; names starting with ``.`` are never versions, so a writer that fills
    ``.v0008.tmp`` and renames it to ``v0008`` when it is whole fires once, for the whole version.
    The versions already there when the trigger starts are the existing ones: they fire nothing,
    and neither does a triggerer restart. Each new one fires an event of plain values,
    ``{"version": <its name>, "path": <its path>}``; several found by one poll fire in name order.
    The Asset event's ``extra`` carries it as ``{"from_trigger": True, "payload": {...}}``
    (:func:`~airflow_trials.experiment.data_version.triggering_data_version` reads it).

    Like Airflow's ``FileDeleteTrigger`` it polls, but it leaves the versions where they are:
    they are the data the DAG tunes on. A directory that does not exist yet has no version.

    :param directory: the directory new versions land in.
    :param pattern: a glob the versions' names match; default ``"*"``.
    :param poll_interval_seconds: time between two listings; default 30.
    """

    def __init__(
        self, *, directory: str, pattern: str = "*", poll_interval_seconds: float = 30.0
    ) -> None:
        super().__init__()
        self.directory = directory
        self.pattern = pattern
        self.poll_interval_seconds = poll_interval_seconds

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "directory": self.directory,
                "pattern": self.pattern,
                "poll_interval_seconds": self.poll_interval_seconds,
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        existing = await asyncio.to_thread(self.versions)
        self.log.info(
            "Watching %s for new dataset versions (%d there already)",
            self.directory,
            len(existing),
        )
        async for event in self.new_versions(existing):
            yield event

    async def new_versions(self, seen: set[str]) -> AsyncIterator[TriggerEvent]:
        """One event per version not in ``seen`` that the next listings find, each one once."""
        seen = set(seen)
        while True:
            await asyncio.sleep(self.poll_interval_seconds)
            for version in sorted(await asyncio.to_thread(self.versions) - seen):
                seen.add(version)
                self.log.info("New dataset version %s in %s", version, self.directory)
                path = os.path.join(self.directory, version)
                yield TriggerEvent({"version": version, "path": path})

    def versions(self) -> set[str]:
        """The names of the versions in the directory now (none while it does not exist)."""
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return set()
        return {
            name
            for name in names
            if not name.startswith(".") and fnmatch.fnmatchcase(name, self.pattern)
        }
