"""SweepWatch: a sweep trigger's hold on its run's driver actor, until the run ends or the driver
is gone.

The triggerer's work for one sweep (find the driver, poll its progress, log it, kill the finished
driver), in plain Ray and trials-DB calls: the trigger
(:mod:`~airflow_trials.triggers.sweep_trigger`) builds it, awaits it and yields its event. It
finds the driver through the callable the trigger gives it, never through the driver's code."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from airflow_trials.core.end import SweepEnd, SweepStatus
from airflow_trials.core.sweep_progress import progress_line
from airflow_trials.execution.triggerer.outage import (
    POLL_GRACE_SECONDS,
    RayOutage,
    RayOutageTimeout,
)

if TYPE_CHECKING:
    from airflow_trials.store import TrialStore

#: How much longer than its poll interval the trigger waits for the driver's answer to a long poll.
WAIT_GRACE_SECONDS = 5.0


@dataclass
class SweepWatch:
    """One SweepTrigger run's hold on the driver, until the run ends or the driver is gone. It
    knows the run through its fields, never through the trigger.

    :param experiment_name: the experiment. :param run_key: the experiment run's key.
    :param experiment_run_id: the run's id in the trials DB.
    :param num_trials: how many trials the run has (how the trials DB tells that the run ended).
    :param find: the run's live driver actor, or None when there is none, on the trigger's Ray
        connection (connecting first, again after a Ray restart); called in a thread.
    :param open_store: opens the trials store (the trigger's, once); called only when the driver
        is gone.
    :param log: the trigger's logger (the task's log).
    :param poll_interval_seconds: time between polls.
    :param progress_interval_seconds: the most time between two progress lines.
    :param ray_outage_timeout_seconds: how long Ray may not answer before the driver counts as lost.
    """

    experiment_name: str
    run_key: str
    experiment_run_id: int
    num_trials: int
    find: Callable[[], Any]
    open_store: Callable[[], Awaitable[TrialStore]]
    log: Any
    poll_interval_seconds: float
    progress_interval_seconds: float
    ray_outage_timeout_seconds: float
    actor: Any = field(default=None, init=False)
    last_line: tuple[float, tuple[Any, ...]] | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.outage = RayOutage(
            f"Sweep {self.run_key}",
            self.ray_outage_timeout_seconds,
            self.poll_interval_seconds,
            self.log,
        )

    async def until_end(self) -> SweepEnd:
        try:
            return await self._watch()
        except RayOutageTimeout as e:
            return SweepEnd.lost(
                self.experiment_name,
                self.run_key,
                (
                    f"could not be reached: {e}. The task's next try resumes the run's unfinished "
                    "trials from their latest checkpoints."
                ),
            )

    async def _watch(self) -> SweepEnd:
        self.actor = await self._find()
        if self.actor is None:
            return await self._absent()
        while True:
            snapshot = await self._progress()
            if snapshot is None:
                return await self._absent()
            self._log(snapshot)
            if snapshot.get("finished"):
                await asyncio.to_thread(self._kill)
                return SweepEnd.from_snapshot(self.run_key, snapshot)
            await self._wait_for_end()

    async def _wait_for_end(self) -> None:
        """Wait up to one poll interval for the run to end, on the driver (bounded). The answer is
        awaited as a future that Ray completes: no thread of the triggerer's shared pool is held
        for the poll's length. A driver that does not answer is left to the next progress poll."""
        poll = self.poll_interval_seconds
        started = time.monotonic()
        try:
            answer = asyncio.wrap_future(self.actor.wait.remote(poll).future())
            await asyncio.wait_for(answer, timeout=poll + WAIT_GRACE_SECONDS)
        except Exception:  # noqa: BLE001 - gone or not answering: the progress poll tells which
            await asyncio.sleep(max(0.0, started + poll - time.monotonic()))

    async def _find(self) -> Any:
        """The live driver, or None once Ray answers that there is none."""
        while True:
            try:
                actor = await asyncio.to_thread(self.find)
                self.outage.answered()
                return actor
            except Exception as e:  # noqa: BLE001 - Ray down, or answering errors as it restarts
                await self.outage.wait(e)

    async def _progress(self) -> dict[str, Any] | None:
        """The driver's progress; None when it is gone."""
        import ray
        from ray.exceptions import RayActorError

        while True:
            try:
                snapshot: dict[str, Any] = await asyncio.to_thread(
                    ray.get, self.actor.progress.remote(), timeout=POLL_GRACE_SECONDS
                )
                self.outage.answered()
                return snapshot
            except RayActorError:
                return None
            except Exception as e:  # noqa: BLE001 - a timeout, or Ray restarting under us
                await self.outage.wait(e)
                self.actor = await self._find()
                if self.actor is None:
                    return None

    async def _absent(self) -> SweepEnd:
        """No driver: the run ended (a trigger that ran again after killing it) or the driver was
        lost."""
        store = await self.open_store()
        states = await asyncio.to_thread(store.reader.run_trial_states, self.experiment_run_id)
        left = self.num_trials - sum(1 for s in states if s.status.is_terminal())
        if left <= 0:
            return SweepEnd(self.run_key, SweepStatus.FINISHED)
        return SweepEnd.lost(
            self.experiment_name,
            self.run_key,
            (
                "is gone (its Ray head restarted, its node died, or it was killed) with "
                f"{left} "
                f"of {self.num_trials} trials unfinished; the task's next try resumes them "
                "from "
                "their latest checkpoints."
            ),
        )

    def _log(self, snapshot: dict[str, Any]) -> None:
        if snapshot.get("starting"):
            return
        key = (snapshot["terminated"], snapshot["errored"], snapshot.get("finished"))
        now = time.monotonic()
        if (
            self.last_line is not None
            and key == self.last_line[1]
            and (now - self.last_line[0] < self.progress_interval_seconds)
        ):
            return
        if (
            self.last_line is not None
            and key != self.last_line[1]
            and not snapshot.get("finished")
            and now - self.last_line[0] < min(5.0, self.progress_interval_seconds)
        ):
            return  # trials end often in a big sweep: a line every few seconds at most
        self.last_line = (now, key)
        self.log.info("Sweep %s: %s", self.run_key, progress_line(snapshot))

    def _kill(self) -> None:
        import ray

        try:
            ray.kill(self.actor, no_restart=True)
        except Exception as e:  # noqa: BLE001 - already gone
            self.log.debug("Sweep driver of %s already gone: %s", self.run_key, e)
