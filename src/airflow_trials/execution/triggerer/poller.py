"""TrialPoller: one background thread per event loop polls every watched trial actor on Ray and
records their progress in the trials store in batches.

Why not Airflow's shared streams: Airflow 3.3's ``BaseEventTrigger.shared_stream_key`` /
``open_shared_stream`` lets sibling triggers share one poll, but its stream is opened with one
trigger's kwargs, broadcasts every event to every subscriber and has no way back to one of them
(a poll's write outcome), and a deferral trigger would have to pose as an asset watcher to use it
(docs/airflow.md, "Why not Airflow 3.3's shared streams"). So the sharing happens here, in a
process-level poller keyed by the triggerer's event loop, which the trigger-runner process has
exactly one of.

Lifecycle, from a trigger's ``run()`` on the event loop::

    watch = watch_trial(trial_id, actor, store_url, wait_seconds=2.0)  # registers; starts a poller
    poll = watch.poll()                  # the poll in flight, or a new one (poll.wait_seconds)
    update = await poll.answered         # the actor's TrialUpdate, or the Ray error it raised
    judged = await poll.recorded         # its progress is in the store (with its scheduler's
                                         # verdicts: judge.call().settle()), or StoreError
    watch.set_actor(new_actor)           # after a re-attach: later polls go to the new actor
    watch.close()                        # in ``finally``: the poller forgets the trial

Every Ray call (a poll's ``send_poll``, ``ray.wait``, ``ray.get``) and every store write of a poll
runs on the poller's thread, never on the event loop: when the Ray GCS is down these calls can
block for seconds, and then only the poller waits. The thread keeps at most one poll
in flight per watched actor, collects the finished ones with ``ray.wait(timeout=TICK_SECONDS)``,
writes all their new results, checkpoints and RUNNING statuses in one transaction per tick and
store (:meth:`~airflow_trials.store.store.TrialStore.record_progress`), with the verdicts each
judged trial's scheduler gives on its new results (its ``judge``), and hands the answers,
then the writes' outcomes, back to their triggers' futures with one ``loop.call_soon_threadsafe``
each per tick (one wake-up of the event loop, not one per future). Bounding
the wait for an answer is the trigger's business (``asyncio.wait`` with a timeout), so a poller
stuck in Ray cannot stall a trigger either.

A batch that fails as a whole because the database failed at every retry fails every trial in it
with that StoreError; a batch refused for one trial's sake (an invalid transition, an unknown
trial) is written again trial by trial, so only that trial's trigger gets the error.

**The poll budget.** A poll costs about 0.3 ms of this process's CPU in Ray, so a poller sends at
most ``MAX_POLLS_PER_SECOND`` polls a second, stretching its trials' intervals past that (20 s at
1,000 trials): an end or a hold still answers at once, a plain result is stored that much later.

The first poller of a process calls ``gc.freeze()`` (:func:`_freeze_startup_objects`): full
garbage collections then skip the start-up objects that made each one hold the event loop for
about 250 ms.

The poller logs its poll and write counts every ``STATS_INTERVAL_SECONDS``, and
:func:`~airflow_trials.execution.polls.ensure_lag_probe` the event loop's longest lag (a 20 ms
sleep that woke late) as often.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from airflow_trials.core.update import TrialUpdate
from airflow_trials.exceptions import StoreError
from airflow_trials.execution.polls import (
    STATS_INTERVAL_SECONDS,
    WRITES,
    Outcome,
    Poll,
    RayNotAnswering,
    TrialProgressTracker,
    _drop,
    _settle_all,
)
from airflow_trials.store.retry import is_transient
from airflow_trials.store.store import TrialStore

__all__ = [
    "BatchedTrialPolls",
    "Poll",
    "RayNotAnswering",
    "TrialPoller",
    "poller_of",
    "watch_trial",
]

log = logging.getLogger(__name__)

# How long the poller waits for answers before writing what arrived: the batching window.
TICK_SECONDS = 0.25
# A poller with nothing to watch for this long stops its thread; the next watch starts another.
IDLE_EXIT_SECONDS = 30.0
# ray.get of answers ray.wait reported ready: they are local, so this only bounds a sick Ray.
GET_TIMEOUT_SECONDS = 10.0
# The most polls a poller sends a second, all its trials together: the poll budget (module doc).
MAX_POLLS_PER_SECOND = 50.0


class BatchedTrialPolls:
    """One trial watch's registration with a :class:`TrialPoller`: the batched
    :class:`~airflow_trials.execution.polls.TrialPolls`. Call its methods from the event loop's
    thread; the poller's thread reads and writes the ``_``-prefixed state.

    :param poller: the poller.
    :param trial_id: the trial.
    :param actor: the trial's Ray actor handle.
    :param store_url: the trials store its progress goes to.
    :param wait_seconds: how long the actor may hold a poll open waiting for news (an end, a
        hold): the trial's poll interval, which its poller stretches past its poll budget.
    :param recorded: the trial's checkpoints the store holds as not deleted; default none.
    :param judge: the trial's scheduler on the Airflow path (``schedulers/trial_judge.py``: its
        ``call()`` judges a write's results within it); default None (no scheduler).
    """

    def __init__(
        self,
        poller: TrialPoller,
        trial_id: str,
        actor: Any,
        store_url: str,
        wait_seconds: float,
        recorded: Iterable[str] = (),
        judge: Any = None,
    ) -> None:
        self.trial_id = trial_id
        self.judge = judge
        self.store_url = store_url
        self.wait_seconds = wait_seconds
        self.tracker = TrialProgressTracker(trial_id, recorded=set(recorded))
        self._poller = poller
        self._current: Poll | None = None
        self._closed = False
        poller.watched += 1
        # Poller thread only:
        self._actor = actor
        self._ref: Any = None  # the ObjectRef of the poll in flight
        self._asked: Poll | None = None  # the poll that ref answers, or that waits for a ref

    def poll(self) -> Poll:
        """The poll in flight (one that timed out on the trigger's side is awaited again rather
        than sent again, so a queued actor's calls do not pile up), or a new one."""
        if self._current is None or self._current.answered.done():
            self._current = Poll(self._poller.loop, self._poller.wait_seconds(self.wait_seconds))
            self._poller.command(self._poller._ask, self, self._current)
        return self._current

    def set_actor(self, actor: Any) -> None:
        """Send later polls to ``actor`` (the trial's actor found again after Ray stopped
        answering)."""
        self._poller.command(self._poller._replace_actor, self, actor)

    def close(self) -> None:
        """Stop polling; the poller forgets the trial (a poll in flight is dropped)."""
        if not self._closed:
            self._closed = True
            self._poller.watched -= 1
        _drop(self._current)
        self._poller.command(self._poller._forget, self)


class TrialPoller:
    """Polls many trial actors from one thread and records their progress in batches.

    Get the event loop's poller through :func:`watch_trial`, which starts it; it stops after
    ``IDLE_EXIT_SECONDS`` with nothing to watch, or when its loop closes.

    :param loop: the event loop whose triggers it serves.
    :param store_factory: makes the store for a URL; default :class:`TrialStore`.
    :param tick_seconds: batching window; default ``TICK_SECONDS``.
    :param max_polls_per_second: its poll budget; default ``MAX_POLLS_PER_SECOND``.
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        store_factory: Callable[[str], TrialStore] = TrialStore,
        tick_seconds: float = TICK_SECONDS,
        max_polls_per_second: float = MAX_POLLS_PER_SECOND,
    ) -> None:
        self.loop = loop
        self.tick_seconds = tick_seconds
        self.max_polls_per_second = max_polls_per_second
        self.watched = 0  # trials registered and not closed (counted on the loop's thread)
        self._store_factory = store_factory
        self._stores: dict[str, TrialStore] = {}
        self._commands: deque[tuple[Callable[..., None], tuple[Any, ...]]] = deque()
        self._wakeup = threading.Event()
        self._watches: set[BatchedTrialPolls] = set()
        self._in_flight: dict[Any, BatchedTrialPolls] = {}
        self._outbox: list[Outcome] = []
        self._stopped = False
        self.stats = PollerStats()
        self._thread = threading.Thread(target=self._run, name="airflow-trials-poller", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def wait_seconds(self, poll_interval_seconds: float) -> float:
        """A trial's next poll's wait: its poll interval, stretched to fit the poll budget."""
        return max(poll_interval_seconds, self.watched / self.max_polls_per_second)

    def command(self, fn: Callable[..., None], *args: Any) -> None:
        """Run ``fn(*args)`` on the poller's thread at its next tick."""
        self._commands.append((fn, args))
        self._wakeup.set()

    # -- the poller's thread ------------------------------------------------------------------

    def _run(self) -> None:
        idle_since = time.monotonic()
        try:
            while not self.loop.is_closed():
                self._run_commands()
                self._hand_over()
                if self._watches or self._commands:
                    idle_since = time.monotonic()
                elif time.monotonic() - idle_since > IDLE_EXIT_SECONDS and self._retire():
                    return
                if self._in_flight:
                    self._collect()
                    self._hand_over()
                else:
                    self._wakeup.wait(self.tick_seconds)
                    self._wakeup.clear()
                self.stats.maybe_log(len(self._watches))
        except RuntimeError as e:  # the loop closed while we handed it a result
            log.debug("Trial poller stops: %s", e)
        finally:
            with _REGISTRY_LOCK:
                if _POLLERS.get(self.loop) is self:
                    del _POLLERS[self.loop]
                self._stopped = True
            for store in self._stores.values():
                store.dispose()

    def _retire(self) -> bool:
        """Leave the registry if still idle, so the next watch starts a new poller."""
        with _REGISTRY_LOCK:
            if self._commands:
                return False
            if _POLLERS.get(self.loop) is self:
                del _POLLERS[self.loop]
            self._stopped = True
            return True

    def _deliver(
        self, future: asyncio.Future[Any], value: Any = None, *, error: BaseException | None = None
    ) -> None:
        """Resolve ``future`` on the event loop at the next :meth:`_hand_over`."""
        self._outbox.append((future, value, error))

    def _hand_over(self) -> None:
        """Hand the loop every future settled since the last call, in one ``call_soon_threadsafe``:
        one wake-up of the event loop per tick rather than one per future (two per poll)."""
        if self._outbox:
            outcomes, self._outbox = self._outbox, []
            self.loop.call_soon_threadsafe(_settle_all, outcomes)

    def _run_commands(self) -> None:
        while self._commands:
            fn, args = self._commands.popleft()
            fn(*args)

    def _add(self, watch: BatchedTrialPolls) -> None:
        self._watches.add(watch)

    def _ask(self, watch: BatchedTrialPolls, poll: Poll) -> None:
        if watch not in self._watches:
            return  # closed already
        watch._asked = poll
        if watch._ref is None:
            self._send(watch)

    def _send(self, watch: BatchedTrialPolls) -> None:
        from airflow_trials.execution.ray_state import send_poll

        assert watch._asked is not None
        try:
            args = watch.tracker.poll_args(watch._asked.wait_seconds)
            watch._ref = send_poll(watch._actor, *args)
        except Exception as e:  # Ray down or reconnecting: the trigger re-attaches
            self._answer_error(watch, RayNotAnswering(f"{type(e).__name__}: {e}"))
            return
        self._in_flight[watch._ref] = watch
        self.stats.polls_sent += 1

    def _replace_actor(self, watch: BatchedTrialPolls, actor: Any) -> None:
        same = watch._actor._actor_id == actor._actor_id
        watch._actor = actor
        if not same:  # another actor's checkpoint versions: it acknowledges nothing to this one
            watch.tracker.recorded_version = None
        if same or watch._ref is None:
            return
        self._in_flight.pop(watch._ref, None)
        watch._ref = None
        if watch._asked is not None:
            self._send(watch)

    def _forget(self, watch: BatchedTrialPolls) -> None:
        self._watches.discard(watch)
        if watch._ref is not None:
            self._in_flight.pop(watch._ref, None)
            watch._ref = None
        watch._asked = None

    def _collect(self) -> None:
        import ray

        refs = list(self._in_flight)
        try:
            ready, _ = ray.wait(
                refs, num_returns=len(refs), timeout=self.tick_seconds, fetch_local=True
            )
        except Exception as e:  # Ray itself failed (shut down to reconnect, say): every poll did
            for ref in refs:
                self._answer_error(
                    self._in_flight[ref], RayNotAnswering(f"{type(e).__name__}: {e}")
                )
            self._hand_over()
            time.sleep(self.tick_seconds)
            return
        answered: list[tuple[BatchedTrialPolls, Poll, TrialUpdate]] = []
        for ref, value in zip(ready, _get_each(ready), strict=True):
            watch = self._in_flight[ref]
            if isinstance(value, BaseException):
                self._answer_error(watch, value)
                continue
            self._in_flight.pop(ref)
            watch._ref = None
            watch.tracker.read_output(value)
            poll, watch._asked = watch._asked, None
            if poll is not None:
                self._deliver(poll.answered, value)
                answered.append((watch, poll, value))
        # The answers before the write: a write that retries for long is no poll left unanswered.
        self._hand_over()
        self._record(answered)

    def _answer_error(self, watch: BatchedTrialPolls, error: BaseException) -> None:
        if watch._ref is not None:
            self._in_flight.pop(watch._ref, None)
            watch._ref = None
        poll, watch._asked = watch._asked, None
        if poll is not None:
            self._deliver(poll.answered, error=error)

    def _record(self, answered: list[tuple[BatchedTrialPolls, Poll, TrialUpdate]]) -> None:
        """Write the answers' progress, one transaction per store; then tell each trigger."""
        batches: dict[str, list[tuple[BatchedTrialPolls, Poll, TrialUpdate | None]]] = {}
        for watch, poll, update in answered:
            item = watch.tracker.progress(update)
            batches.setdefault(watch.store_url, []).append((watch, poll, item))
        for url, batch in batches.items():
            items = [item for _, _, item in batch if item is not None]
            calls = {
                watch.trial_id: watch.judge.call()
                for watch, _, item in batch
                if item is not None and watch.judge is not None
            }
            errors = self._write(url, items, calls) if items else {}
            for watch, poll, item in batch:
                error = errors.get(watch.trial_id) if item is not None else None
                call = calls.get(watch.trial_id)
                judged = call.settle() if call is not None and error is None else None
                if error is None:
                    watch.tracker.written(item)
                self._deliver(poll.recorded, judged, error=error)

    def _write(
        self, url: str, items: list[TrialUpdate], calls: dict[str, Any]
    ) -> dict[str, BaseException]:
        """Write ``items``, each judged trial judged by its call; the error of each trial that
        could not be written."""
        store = self._stores.get(url)
        if store is None:
            store = self._stores[url] = self._store_factory(url)
        judges = {i.trial_id: calls[i.trial_id] for i in items if i.trial_id in calls}
        try:
            new = store.record_progress(items, judges=judges or None)
        except Exception as e:
            transient = (
                isinstance(e, StoreError) and e.__cause__ is not None and is_transient(e.__cause__)
            )
            if len(items) == 1 or transient:
                log.warning(
                    "Could not record the progress of trials %s: %s", [i.trial_id for i in items], e
                )
                return {item.trial_id: e for item in items}
        else:
            self.stats.rows += new
            self.stats.transactions += 1
            WRITES.add(new)
            return {}
        # Refused for one trial's sake: find it, and write the others.
        errors: dict[str, BaseException] = {}
        for item in items:
            errors.update(self._write(url, [item], calls))
        return errors


@dataclass
class PollerStats:
    """What the poller did since its last log line."""

    polls_sent: int = 0
    transactions: int = 0
    rows: int = 0
    since: float = field(default_factory=time.monotonic)

    def maybe_log(self, watched: int) -> None:
        elapsed = time.monotonic() - self.since
        if elapsed < STATS_INTERVAL_SECONDS:
            return
        log.info(
            "Trial poller: %d trials watched; over %.0f s: %d polls, %d store transactions, "
            "%d new results",
            watched,
            elapsed,
            self.polls_sent,
            self.transactions,
            self.rows,
        )
        self.polls_sent = self.transactions = self.rows = 0
        self.since = time.monotonic()


def _get_each(refs: list[Any]) -> list[Any]:
    """The value of each ready ref, or the exception getting it raised (one bad ref, one error)."""
    import ray

    if not refs:
        return []
    try:
        return list(ray.get(refs, timeout=GET_TIMEOUT_SECONDS))
    except Exception:
        pass
    values: list[Any] = []
    for ref in refs:
        try:
            values.append(ray.get(ref, timeout=GET_TIMEOUT_SECONDS))
        except Exception as e:
            values.append(e)
    return values


_POLLERS: dict[asyncio.AbstractEventLoop, TrialPoller] = {}
_REGISTRY_LOCK = threading.Lock()


def watch_trial(
    trial_id: str,
    actor: Any,
    store_url: str,
    wait_seconds: float,
    recorded: Iterable[str] = (),
    judge: Any = None,
) -> BatchedTrialPolls:
    """Register a trial with the running event loop's poller (starting one if needed).

    :param trial_id: the trial.
    :param actor: its Ray actor handle.
    :param store_url: the trials store its progress goes to.
    :param wait_seconds: how long the actor may hold a poll open waiting for the trial to end.
    :param recorded: the trial's checkpoints the store holds as not deleted; default none.
    :param judge: the trial's scheduler (:class:`BatchedTrialPolls`); default None.
    """
    loop = asyncio.get_running_loop()
    with _REGISTRY_LOCK:
        poller = _POLLERS.get(loop)
        if poller is None or poller._stopped:
            _freeze_startup_objects()
            poller = _POLLERS[loop] = TrialPoller(loop)
            poller.start()
        watch = BatchedTrialPolls(poller, trial_id, actor, store_url, wait_seconds, recorded, judge)
        # Under the lock: a poller that has a command queued never retires.
        poller.command(poller._add, watch)
        return watch


_FROZEN = False


def _freeze_startup_objects() -> None:
    """Leave the objects this process made until now (Airflow, Ray and SQLAlchemy, imported) out
    of every later full garbage collection, once per process (``gc.freeze``).

    Profiled at 200 trials (``bench/poller_load.py``): each full collection walked them all and
    held every thread, the event loop's included, for about 250 ms, the loop's only block over
    50 ms in a 30 s window, as long as the triggerer's blocks in issue 33.
    """
    global _FROZEN
    if not _FROZEN:
        gc.freeze()
        _FROZEN = True


def poller_of(loop: asyncio.AbstractEventLoop) -> TrialPoller | None:
    """The poller serving ``loop``, if one runs (for tests and diagnostics)."""
    with _REGISTRY_LOCK:
        return _POLLERS.get(loop)
