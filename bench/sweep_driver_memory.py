"""Benchmark: what a sweep's driver actor holds as its trials grow, run as a DAG run runs it.

The trials are registered in a SQLite trials DB as ``suggest_configs`` registers them
(``TrialStore.register_trials``), and the driver reads them there (``SweepSpec(trials=None)``),
as a Ray actor started as ``start_or_attach_driver`` starts it, polled for its progress every
second as the sweep's trigger polls it. For each size it prints the actor's peak resident memory
(sampled every 0.5 s) and, with ``--tracemalloc``, the allocation sites that hold the most Python
memory at the end of the run (the runner and its callbacks are still alive then), so that two
sizes side by side show what grows with the trials.

    .venv/bin/python -m bench.sweep_driver_memory --sizes 5000 30000
    .venv/bin/python -m bench.sweep_driver_memory --sizes 2000 8000 --tracemalloc
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

from airflow_trials.execution.driver.sweep_driver import SweepDriver

REPO = Path(__file__).resolve().parent.parent
EXPERIMENT = "bench_sweep_driver_memory"


class MeasuredDriver(SweepDriver):
    """The sweep driver, which also says its pid and, when tracing, its top allocation sites."""

    def __init__(self, spec: Any, trace: bool) -> None:
        if trace:
            tracemalloc.start(8)
        super().__init__(spec)

    def pid(self) -> int:
        return os.getpid()

    def backlog(self) -> int:
        """Writes queued on the trials DB callback's write-behind thread, not yet applied."""
        runner = self._runner
        writers = [getattr(c, "_writer", None) for c in (runner.callbacks if runner else ())]
        return sum(w._queue.qsize() for w in writers if w is not None)

    def top_allocations(self, top: int) -> list[tuple[int, int, str]]:
        """``(bytes, blocks, where)`` of the ``top`` sites holding the most, by traceback."""
        if not tracemalloc.is_tracing():
            return []
        snapshot = tracemalloc.take_snapshot().filter_traces(
            [tracemalloc.Filter(False, tracemalloc.__file__)]
        )
        stats = snapshot.statistics("traceback")[:top]
        return [(s.size, s.count, _where(s.traceback)) for s in stats]


def _where(traceback: tracemalloc.Traceback) -> str:
    """The innermost frames of the project (or the innermost frame), one line."""
    ours = [f for f in traceback if "airflow_trials" in f.filename or "bench" in f.filename]
    frames = (ours or list(traceback))[:3]
    return " <- ".join(f"{Path(f.filename).name}:{f.lineno}" for f in frames)


def registered_spec(trials: int, storage: str) -> Any:
    """A run of ``trials`` trials x 1 result x 0 s (``bench/sweep_scale.py``'s) registered in a
    fresh SQLite trials DB as ``suggest_configs`` registers them, and the spec that reads them
    there, with a sweep operator's trial settings."""
    from airflow_trials.store import TrialStore
    from bench.sweep_scale import sweep_spec

    name = f"{EXPERIMENT}-{trials}"
    db_url = f"sqlite:///{storage}/{name}.db"
    listed: Any = sweep_spec(name, trials, 1, 0.0, db_url, storage)
    store = TrialStore(db_url)
    try:
        store.register_trials(
            listed.experiment_run_id,
            [(trial_id, config, None) for trial_id, config in listed.trials],
            trainable="bench._sleep_trainables:ours",
            resources={"cpu": 0.5},
            max_failures=0,
        )
    finally:
        store.dispose()
    trial_kwargs = {  # SweepOperator._trial_kwargs with the benchmark DAG's settings
        "resources": {"cpu": 0.5},
        "stopping_criterion": None,
        "checkpoint_freq": 0,
        "checkpoint_at_end": False,
        "keep_checkpoints_num": None,
        "checkpoint_score_attr": None,
        "max_failures": 0,
    }
    return dataclasses.replace(listed, trials=None, trial_kwargs=trial_kwargs)


def run_size(trials: int, storage: str, trace: bool, top: int) -> tuple[float, int, int]:
    """One run: wall seconds, the actor's resident memory once started and its peak."""
    import psutil
    import ray

    spec = registered_spec(trials, storage)
    actor = (
        ray.remote(MeasuredDriver)
        .options(num_cpus=0, max_concurrency=8, max_restarts=0, name=spec.name, namespace="bench")
        .remote(spec, trace)
    )
    process = psutil.Process(ray.get(actor.pid.remote()))
    start = time.perf_counter()
    first = peak = process.memory_info().rss
    shown = start
    while not (progress := ray.get(actor.progress.remote())).get("finished"):
        rss = process.memory_info().rss
        peak = max(peak, rss)
        if time.perf_counter() - shown >= 10:
            shown = time.perf_counter()
            backlog = ray.get(actor.backlog.remote())
            print(
                f"  {shown - start:6.0f} s: {progress.get('terminated', 0):6d} ended, "
                f"{rss / 2**20:5.0f} MiB, {backlog} writes queued",
                flush=True,
            )
        time.sleep(1.0)  # the sweep trigger's poll
    elapsed = time.perf_counter() - start
    peak = max(peak, process.memory_info().rss)
    if progress.get("error") or progress["terminated"] != trials:
        raise SystemExit(f"the sweep of {trials} trials ended with {progress}")
    for size, count, where in ray.get(actor.top_allocations.remote(top)):
        print(f"    {size / 2**20:8.2f} MiB {count:8d} blocks  {where}")
    ray.kill(actor)
    return elapsed, first, peak


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", type=int, nargs="+", default=[5000, 30000])
    parser.add_argument("--cpus", type=int, default=2)
    parser.add_argument("--tracemalloc", action="store_true", help="top allocation sites")
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args(argv)
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(REPO), os.environ.get("PYTHONPATH")])
    )
    sys.path.insert(0, str(REPO))
    import ray

    from bench.sweep_scale import start_local_ray

    start_local_ray(args.cpus)
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench_driver_memory_") as storage:
        try:
            for trials in args.sizes:
                print(f"{trials} trials x 1 result x 0 s:", flush=True)
                rows.append((trials, *run_size(trials, storage, args.tracemalloc, args.top)))
        finally:
            ray.shutdown()
    print(f"{'trials':>8} {'wall':>8} {'started':>9} {'peak':>9}")
    for trials, wall, first, peak in rows:
        print(f"{trials:8d} {wall:7.1f}s {first / 2**20:5.0f} MiB {peak / 2**20:5.0f} MiB")
    for (small, *_, small_peak), (large, *_, large_peak) in zip(rows, rows[1:], strict=False):
        per_trial = (large_peak - small_peak) / (large - small)
        print(
            f"{small} -> {large}: peak {(large_peak - small_peak) / 2**20:+.0f} MiB, "
            f"{per_trial:.0f} bytes per trial; 10,000 -> 100,000 at that rate: "
            f"{per_trial * 90_000 / 2**20:+.0f} MiB (target < 300)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
