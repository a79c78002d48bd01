"""What a trial watch polls through: the :class:`TrialPolls` interface, the poll futures, the
progress tracker, the write counter and the event-loop lag probe, for the triggerer's shared
poller (:class:`~airflow_trials.execution.triggerer.poller.BatchedTrialPolls`)."""

from __future__ import annotations

import asyncio
import contextvars
import logging
import threading
from dataclasses import dataclass, field
from typing import Any, Protocol

from airflow_trials.core.status import TrialStatus
from airflow_trials.core.update import TrialUpdate

log = logging.getLogger(__name__)

STATS_INTERVAL_SECONDS = 60.0
LAG_PROBE_SECONDS = 0.02


class RayNotAnswering(Exception):  # noqa: N818 - reads as what happened, like Ray's own errors
    """Ray failed the poller's calls as a whole, not one actor's: it is down or reconnecting."""


class Poll:
    """One poll of one trial, as its trigger sees it (futures of the trigger's event loop).

    :param loop: the trigger's event loop.
    :param wait_seconds: how long the actor may hold it open waiting for news (an end, a hold):
        the trial's poll interval as its poller paces it.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, wait_seconds: float) -> None:
        self.wait_seconds = wait_seconds
        self.answered: asyncio.Future[TrialUpdate] = loop.create_future()
        # None, or what the trial's scheduler found in the write (its judge call's settle()).
        self.recorded: asyncio.Future[Any] = loop.create_future()


class TrialPolls(Protocol):
    """How a trial's watch polls its actor, on either path: one poll at a time, the actor
    replaced after a re-attach, and the progress the store holds (:attr:`tracker`)."""

    tracker: TrialProgressTracker

    def poll(self) -> Poll:
        """The poll in flight, or a new one."""
        ...

    def set_actor(self, actor: Any) -> None:
        """Send later polls to ``actor`` (the trial's actor found again)."""
        ...

    def close(self) -> None:
        """Stop polling (a poll in flight is dropped)."""
        ...


@dataclass
class TrialProgressTracker:
    """What of one trial's progress the store has: results seen, checkpoints recorded, placed;
    and how far its output was read (not stored: the trigger logs it).

    The store's checkpoints are the ones a retry resumes from, so the actor deletes a checkpoint
    it dropped only once the store no longer names it: each poll hands the actor
    ``recorded_version``, the version of the last kept set the store holds (its checkpoints added,
    the dropped ones marked deleted, in one transaction).

    :param trial_id: the trial.
    :param seen: results recorded so far (the actor's ``poll(since=...)``); default 0.
    :param recorded: paths of the trial's checkpoints the store holds as not deleted; default
        none. A watch that takes over a trial another watch recorded starts from the store's, so
        that what the actor dropped meanwhile is marked deleted too.
    """

    trial_id: str
    seen: int = 0
    recorded: set[str] = field(default_factory=set)
    placed: bool = False
    output_offsets: dict[str, int] = field(default_factory=dict)
    recorded_version: int | None = None
    _polled_version: int | None = field(default=None, repr=False)

    def poll_args(self, wait_seconds: float) -> tuple[int, float, dict[str, int], int | None]:
        """The arguments of the actor's next ``poll``."""
        return self.seen, wait_seconds, dict(self.output_offsets), self.recorded_version

    def read_output(self, update: TrialUpdate) -> None:
        """The next poll asks for the output after what ``update`` brought."""
        for stream, chunk in (update.output or {}).items():
            self.output_offsets[stream] = chunk["offset"]

    def progress(self, update: TrialUpdate) -> TrialUpdate | None:
        """What of the actor's ``update`` the store lacks, or None when it lacks nothing: its new
        results, the kept checkpoints it has not recorded, the recorded ones no longer kept, and
        RUNNING the first time. Never its end: the trial's watch records that
        (``TrialWatch._ended``) once its scheduler has seen it, and the worker decides a
        failure's."""
        self._polled_version = update.checkpoints_version
        kept = {c.path: c for c in update.kept_checkpoints}
        item = TrialUpdate(
            self.trial_id,
            status=None if self.placed else TrialStatus.RUNNING,
            results=update.results,
            kept_checkpoints=[c for p, c in kept.items() if p not in self.recorded],
            dropped_checkpoints=sorted(self.recorded - kept.keys()),
        )
        return item if item.writes else None

    def written(self, item: TrialUpdate | None) -> None:
        """The store committed ``item``, the progress of the last update: it holds that
        update's kept checkpoints now."""
        self.placed = True
        self.recorded_version = self._polled_version
        if item is None:
            return
        self.seen += len(item.results)
        self.recorded.update(c.path for c in item.kept_checkpoints)
        self.recorded.difference_update(item.dropped_checkpoints)


def _drop(poll: Poll | None) -> None:
    """Nobody awaits this poll any more: its late outcome is not an unretrieved error."""
    if poll is not None:
        poll.answered.cancel()
        poll.recorded.cancel()


def _settle(
    future: asyncio.Future[Any], value: Any = None, error: BaseException | None = None
) -> None:
    """Resolve ``future`` unless its watch was closed meanwhile; on the future's loop."""
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(value)


# A future to resolve, with its value or error: what the poller's thread hands the event loop.
Outcome = tuple[asyncio.Future[Any], Any, BaseException | None]


def _settle_all(outcomes: list[Outcome]) -> None:
    """Resolve each future in order, on their loop (one call for all that a poller tick settled)."""
    for future, value, error in outcomes:
        _settle(future, value, error)


class WriteCounter:
    """Store transactions and new results of this process's trial watches (both paths), for the
    loop probe's log line."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._transactions = self._rows = 0

    def add(self, rows: int) -> None:
        with self._lock:
            self._transactions += 1
            self._rows += rows

    def take(self) -> tuple[int, int]:
        """Transactions and new results since the last call."""
        with self._lock:
            counts = (self._transactions, self._rows)
            self._transactions = self._rows = 0
            return counts


WRITES = WriteCounter()
_PROBES: dict[asyncio.AbstractEventLoop, asyncio.Task[None]] = {}


def ensure_lag_probe() -> None:
    """Measure the running event loop's lag for as long as it runs (once per loop): a
    ``LAG_PROBE_SECONDS`` sleep that wakes late shows how long something held the loop. Logs the
    longest lag every ``STATS_INTERVAL_SECONDS``; costs about 50 wake-ups a second."""
    loop = asyncio.get_running_loop()
    if loop in _PROBES:
        return
    # A context of its own: the triggerer sends what a trigger's context logs to that task's log.
    probe = _PROBES[loop] = loop.create_task(_probe_lag(loop), context=contextvars.Context())
    probe.add_done_callback(lambda _: _PROBES.pop(loop, None))


async def _probe_lag(loop: asyncio.AbstractEventLoop) -> None:
    longest = 0.0
    since = loop.time()
    while True:
        expected = loop.time() + LAG_PROBE_SECONDS
        await asyncio.sleep(LAG_PROBE_SECONDS)
        now = loop.time()
        longest = max(longest, now - expected)
        if now - since >= STATS_INTERVAL_SECONDS:
            transactions, rows = WRITES.take()
            log.info(
                "Trigger event loop: longest lag %.1f ms over %.0f s; trial store writes: "
                "%d transactions, %d new results",
                1000 * longest,
                now - since,
                transactions,
                rows,
            )
            longest, since = 0.0, now
