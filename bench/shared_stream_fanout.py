"""Benchmark: the event loop's cost of handing a tick's poll answers to N trial triggers, through
Airflow 3.3's shared stream and through our poller's hand-over (issue 53, item 3).

Both sides deliver the same answers: every ``--tick`` seconds the answers of the trials polled in
that tick (one answer per trial per ``--poll-s``, as the triggers poll). ``shared``: Airflow's own
``_SharedStreamGroup`` (what ``SharedStreamManager`` runs per ``shared_stream_key``), whose
``open_shared_stream`` yields the tick's answers as one raw event, broadcast to every subscriber's
queue; each subscriber keeps its own trial's answer, as ``filter_shared_stream`` would. ``poller``:
a thread that, per tick, hands the loop one ``call_soon_threadsafe`` settling the answered trials'
futures (``execution/polls.py`` ``_settle_all``, what ``TrialPoller._hand_over`` sends). No Ray and
no store: only the hand-over is measured, as the CPU of the event loop's thread::

    .venv/bin/python -m bench.shared_stream_fanout --trials 1000
"""

from __future__ import annotations

import argparse
import asyncio
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

TICK_SECONDS = 0.25


def _answers(trials: int, tick_s: float, poll_s: float) -> Callable[[], list[str]]:
    """The trial ids answered in each successive tick (each trial once per ``poll_s``)."""
    per_tick = max(1, round(trials * tick_s / poll_s))
    start = [0]

    def next_tick() -> list[str]:
        ids = [f"t{(start[0] + k) % trials}" for k in range(per_tick)]
        start[0] += per_tick
        return ids

    return next_tick


async def _measure(args: argparse.Namespace, delivered: list[int]) -> tuple[float, float]:
    """The loop thread's CPU share and the answers delivered per second, over the window."""
    await asyncio.sleep(args.warmup)
    cpu, wall, before = time.thread_time(), time.monotonic(), delivered[0]
    await asyncio.sleep(args.window)
    elapsed = time.monotonic() - wall
    return (time.thread_time() - cpu) / elapsed, (delivered[0] - before) / elapsed


async def shared(args: argparse.Namespace) -> tuple[float, float]:
    """Airflow's shared stream: one raw event per tick, broadcast to every subscriber."""
    import structlog
    from airflow.triggers.base import BaseEventTrigger, TriggerEvent
    from airflow.triggers.shared_stream import _SharedStreamGroup

    next_tick = _answers(args.trials, args.tick, args.poll_s)

    class Watch(BaseEventTrigger):
        def __init__(self, trial_id: str) -> None:
            super().__init__()
            self.trial_id = trial_id

        def serialize(self) -> tuple[str, dict[str, Any]]:
            return (f"{__name__}.Watch", {"trial_id": self.trial_id})

        async def run(self) -> AsyncIterator[TriggerEvent]:
            yield TriggerEvent(None)

        def shared_stream_key(self) -> str:
            return "ray"

        @classmethod
        async def open_shared_stream(cls, kwargs: dict[str, Any]) -> AsyncIterator[Any]:
            while True:
                await asyncio.sleep(args.tick)
                yield {trial_id: {"results": []} for trial_id in next_tick()}

    group = _SharedStreamGroup(
        key="ray",
        trigger_class=Watch,
        kwargs={"trial_id": "t0"},
        on_poll_terminate=lambda _: None,
        max_subscriber_queue=64,
        ack_timeout=30.0,
        log=structlog.get_logger(),
    )
    delivered = [0]

    async def subscriber(trial_id: str, stream: AsyncIterator[Any]) -> None:
        async for raw in stream:
            if raw.get(trial_id) is not None:
                delivered[0] += 1

    tasks = [
        asyncio.ensure_future(subscriber(f"t{i}", group.subscribe(i))) for i in range(args.trials)
    ]
    group.start()
    try:
        return await _measure(args, delivered)
    finally:
        for task in tasks:
            task.cancel()
        await group.stop()


async def poller(args: argparse.Namespace) -> tuple[float, float]:
    """Our poller's hand-over: one ``call_soon_threadsafe`` per tick settling the answered
    trials' futures."""
    from airflow_trials.execution.polls import _settle_all

    loop = asyncio.get_running_loop()
    next_tick = _answers(args.trials, args.tick, args.poll_s)
    futures: dict[str, asyncio.Future[Any]] = {
        f"t{i}": loop.create_future() for i in range(args.trials)
    }
    delivered = [0]

    async def watch(trial_id: str) -> None:
        while True:
            await futures[trial_id]
            delivered[0] += 1
            futures[trial_id] = loop.create_future()

    def settle(ids: list[str]) -> None:  # on the loop: the futures of the trials answered
        _settle_all([(futures[t], {"results": []}, None) for t in ids if not futures[t].done()])

    stop = threading.Event()

    def thread() -> None:
        while not stop.wait(args.tick):
            loop.call_soon_threadsafe(settle, next_tick())

    tasks = [asyncio.ensure_future(watch(trial_id)) for trial_id in futures]
    threading.Thread(target=thread, daemon=True).start()
    try:
        return await _measure(args, delivered)
    finally:
        stop.set()
        for task in tasks:
            task.cancel()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=1000)
    parser.add_argument("--tick", type=float, default=TICK_SECONDS)
    parser.add_argument("--poll-s", type=float, default=2.0, help="each trial answered this often")
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--window", type=float, default=20.0)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    for round_ in range(args.rounds):
        for name, side in (("shared stream", shared), ("our poller", poller)):
            share, rate = asyncio.run(side(args))
            print(
                f"round {round_ + 1}, {name}: {args.trials} trials, event loop thread "
                f"{100 * share:.2f}% of a core for {rate:.0f} answers/s delivered",
                flush=True,
            )


if __name__ == "__main__":
    main()
