"""WriteBehind: one thread that applies a callback's store writes in the order they were made.

A sweep's driver steps its runner for 10,000 trials on one thread. Writing each trial's start,
results and end there puts a few milliseconds of SQL between one trial's last result and the
next trial's start on the same actor, thousands of times. With write-behind the runner's thread
only queues the writes; this thread applies them, in order, and the runner goes on at once.

A failed write is not swallowed: it is kept, no later write is applied (they would build on a
missing row), and the next :meth:`submit` or :meth:`drain` raises it, so that the runner stops
as it would on a direct write. :meth:`drain` waits until every queued write is applied.

The queue is bounded (``max_queued``): when the trials DB falls behind, :meth:`submit` waits for
room rather than letting the queue, and the trials and results its writes hold, grow with the
sweep (a 100,000-trial sweep under load queued hundreds of MiB of them).

Example::

    writer = WriteBehind("sweep mnist/run_1")
    writer.submit(store.upsert_trial, "t1", trainable="pkg:train", config={})
    writer.drain()          # everything before it is in the store now (or its error raised)
    writer.close()
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

_CLOSE = object()

#: The most writes queued at once (a trial's start, its results' batch, its end: a few each).
MAX_QUEUED_WRITES = 1000


class WriteBehind:
    """Applies submitted calls on a thread of its own, in submission order.

    :param name: names the thread (and the writes, in the error).
    :param max_queued: the most writes queued at once; :meth:`submit` waits for room beyond it.
        Default :data:`MAX_QUEUED_WRITES`.
    """

    def __init__(self, name: str, max_queued: int = MAX_QUEUED_WRITES) -> None:
        if max_queued < 1:
            raise ValueError(f"WriteBehind {name}: max_queued must be 1 or more, got {max_queued}.")
        self.name = name
        self._queue: queue.Queue[Any] = queue.Queue(max_queued)
        self._error: BaseException | None = None
        self._thread = threading.Thread(
            target=self._apply_all, name=f"write-behind {name}", daemon=True
        )
        self._thread.start()

    def submit(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        """Queue ``fn(*args, **kwargs)``, waiting for room while ``max_queued`` writes are queued;
        raises the error of an earlier write that failed."""
        self._raise_failed()
        self._queue.put((fn, args, kwargs, None))

    def drain(self) -> None:
        """Wait until every write queued so far is applied; raises the first that failed."""
        done = threading.Event()
        self._queue.put((None, (), {}, done))
        done.wait()
        self._raise_failed()

    def close(self) -> None:
        """Apply what is queued, then end the thread (without raising)."""
        self._queue.put(_CLOSE)
        self._thread.join()

    def _raise_failed(self) -> None:
        if self._error is not None:
            raise RuntimeError(
                f"{self.name}: a write to the trials DB failed, so none after it was applied: "
                f"{type(self._error).__name__}: {self._error}"
            ) from self._error

    def _apply_all(self) -> None:
        while True:
            item = self._queue.get()
            if item is _CLOSE:
                return
            fn, args, kwargs, waiter = item
            if waiter is not None:
                waiter.set()
                continue
            if self._error is not None:  # after a failure nothing more is applied
                continue
            try:
                fn(*args, **kwargs)
            except BaseException as e:  # noqa: BLE001 - kept and raised on the runner's thread
                log.error("%s: a trials DB write failed: %s", self.name, e)
                self._error = e
