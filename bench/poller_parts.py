"""Benchmark: what one poll and one result cost the triggerer's poller thread, part by part, in
CPU time rather than under a profiler (cProfile inflates the many small Python calls of
``json_safe`` and SQLAlchemy by up to 15x and hides the Ray core worker's own threads).

Parts (issue 53, item 3), each the median of ``--rounds``:

- ``submit``: one ``send_poll`` (``actor.poll.remote`` with the poll's four arguments), the
  calling thread's CPU and the whole process's (Ray's core worker threads send the task and take
  its reply);
- ``wait``: one ``ray.wait`` over ``--refs`` polls in flight, as the poller waits each tick;
- ``json_safe``: one result of ``bench/poller_load.py``'s shape made JSON-safe;
- ``store``: one result written by ``TrialStore.record_progress`` to SQLite, in batches of
  ``--batch`` trials with 6 new results each (the poller's batches at 1,000 trials)::

    .venv/bin/python -m bench.poller_parts
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.poller_load import TRIAL_PREFIX, _result, register

RESULTS_PER_POLL = 6


class Answering:
    """A Ray actor whose ``poll`` takes a trial actor's arguments and answers after ``wait_s``."""

    async def poll(self, since: int = 0, wait_s: float = 0.0, *rest: Any) -> None:
        """``rest``: the poll's log offsets and checkpoint version, sent as a trial actor gets
        them."""
        await asyncio.sleep(wait_s)


def _cpu(run: Callable[[], int]) -> tuple[float, float]:
    """Thread and process CPU seconds per unit of ``run`` (which returns its units)."""
    thread, process = time.thread_time(), time.process_time()
    units = run()
    return (time.thread_time() - thread) / units, (time.process_time() - process) / units


def ray_parts(args: argparse.Namespace) -> dict[str, list[float]]:
    import ray

    from airflow_trials.execution.ray_state import send_poll

    ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="WARNING")
    try:
        actor = ray.remote(max_concurrency=args.refs + 16)(Answering).remote()
        ray.get(actor.poll.remote())
        offsets = {"stdout": 120, "stderr": 0}
        parts: dict[str, list[float]] = {"submit thread": [], "submit process": [], "wait": []}
        for _ in range(args.rounds):

            def submit(actor: Any = actor) -> int:
                refs = [send_poll(actor, 7, 0.0, offsets, 3) for _ in range(args.polls)]
                ray.get(refs)
                time.sleep(0.5)  # the core worker's threads finish their share of the batch
                return args.polls

            thread, process = _cpu(submit)
            parts["submit thread"].append(thread)
            parts["submit process"].append(process)
            held = [send_poll(actor, 0, 30.0) for _ in range(args.refs)]
            time.sleep(0.5)
            parts["wait"].append(_cpu(lambda held=held: _wait_ticks(held))[0])
            ray.kill(actor)  # and with it the polls held
            actor = ray.remote(max_concurrency=args.refs + 16)(Answering).remote()
            ray.get(actor.poll.remote())
        return parts
    finally:
        ray.shutdown()


def _wait_ticks(refs: list[Any], ticks: int = 20) -> int:
    import ray

    for _ in range(ticks):
        ray.wait(refs, num_returns=len(refs), timeout=0.01, fetch_local=True)
    return ticks


def json_parts(args: argparse.Namespace) -> dict[str, list[float]]:
    from airflow_trials.core.jsonsafe import json_safe

    results = [_result(f"{TRIAL_PREFIX}-1", i, 1.7e9, 0.5) for i in range(1, 20_001)]

    def run() -> int:
        for result in results:
            json_safe(result)
        return len(results)

    return {"json_safe": [_cpu(run)[0] for _ in range(args.rounds)]}


def store_parts(args: argparse.Namespace) -> dict[str, list[float]]:
    from airflow_trials.core.update import TrialUpdate
    from airflow_trials.store import TrialStore

    trial_ids = [f"{TRIAL_PREFIX}-{i}" for i in range(args.trials)]
    seen = dict.fromkeys(trial_ids, 0)
    started = time.time()

    def update(trial_id: str) -> TrialUpdate:
        first = seen[trial_id] + 1
        seen[trial_id] += RESULTS_PER_POLL
        results = [_result(trial_id, i, started, 0.5) for i in range(first, seen[trial_id] + 1)]
        return TrialUpdate(trial_id, status="RUNNING", results=results, num_results=seen[trial_id])

    with tempfile.TemporaryDirectory(prefix="bench_poller_parts_") as tmp:
        url = f"sqlite:///{Path(tmp) / 'trials.db'}"
        register(url, trial_ids)
        store = TrialStore(url)
        try:
            store.record_progress([update(t) for t in trial_ids[: args.batch]])
            per_result = []
            for _ in range(args.rounds):
                batches = [
                    [update(t) for t in trial_ids[i : i + args.batch]]
                    for i in range(0, len(trial_ids), args.batch)
                ]

                def run(batches: list[list[TrialUpdate]] = batches) -> int:
                    for batch in batches:
                        store.record_progress(batch)
                    return sum(len(u.results) for batch in batches for u in batch)

                per_result.append(_cpu(run)[0])
            return {"store": per_result}
        finally:
            store.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--polls", type=int, default=2000, help="polls submitted per round")
    parser.add_argument("--refs", type=int, default=1000, help="polls in flight for ray.wait")
    parser.add_argument("--trials", type=int, default=1000)
    parser.add_argument("--batch", type=int, default=180, help="trials per store write")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    parts = {**json_parts(args), **store_parts(args), **ray_parts(args)}
    for name, values in parts.items():
        print(f"{name:<15} {1e6 * statistics.median(values):8.1f} us (median of {len(values)})")


if __name__ == "__main__":
    main()
