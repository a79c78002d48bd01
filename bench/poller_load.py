"""Benchmark: the triggerer's trial watches alone, without Airflow: N real ``TrialWatch`` loops on
one event loop, polling through the shared poller a real local Ray, and
writing to a real SQLite trials store; CPU per thread and the event loop's lag.

The cheap profiling harness of ``bench/triggerer_load.py`` (issue 33). What it keeps of the
triggerer: the trigger-runner's event loop running one ``TrialWatch.until_end`` per trial (the
loop of ``TrialTrigger.run``: poll, record, echo progress to the task log, pace), the poller's
thread, the Ray driver in the same process, and the store. What it leaves out: Airflow's
supervisor process and its trigger bookkeeping, and the per-trial actor processes. One Ray actor
answers the polls of many simulated trials (an async actor: each poll held ``wait_s`` as a trial
actor holds it, then the results reported every ``--sleep`` seconds since the last poll, shaped as
the engine reports them), so 1,000 trials need a few actors rather than 63 GB of actor
processes. The Ray side costs this process what N trial actors would: one ``poll.remote`` per
trial and poll, and one answer to fetch.

Ray's processes are pinned to the last core and this process to the others, as in
``bench/triggerer_load.py``. With ``--sides`` it runs each given source tree in turn, alternating
(``name=path`` to put first on ``PYTHONPATH``), and prints the ratios to the first side::

    .venv/bin/python -m bench.poller_load --trials 200
    .venv/bin/python -m bench.poller_load --trials 200 --sides base=/tmp/base/src,new=src \
        --rounds 2
    .venv/bin/python -m bench.poller_load --trials 200 --profile   # cProfile, both threads
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import io
import json
import logging
import os
import pstats
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parent.parent
TRIAL_PREFIX = "bench-poller"
BLOCK_THRESHOLDS_MS = (50.0, 100.0)
LAG_PROBE_S = 0.01


class ManyTrials:
    """A Ray actor's class answering the polls of many simulated trials, each as a trial actor's
    ``poll`` answers: held ``wait_s``, then the results since ``since``."""

    def __init__(self, sleep_s: float) -> None:
        self.sleep_s = sleep_s
        self.started: dict[str, float] = {}

    async def poll(
        self,
        trial_id: str,
        since: int = 0,
        wait_s: float = 0.0,
        output_from: dict[str, int] | None = None,
        recorded_version: int | None = None,
    ) -> Any:
        started = self.started.setdefault(trial_id, time.time())
        await asyncio.sleep(wait_s)
        count = int((time.time() - started) / self.sleep_s)
        results = [
            _result(trial_id, it, started, self.sleep_s) for it in range(since + 1, count + 1)
        ]
        from airflow_trials.core.update import TrialUpdate

        return TrialUpdate(
            trial_id,
            status="RUNNING",
            results=results,
            num_results=count,
            last_result=results[-1] if results else None,
            checkpoints_version=0,
            pid=os.getpid(),
            output={
                stream: {"path": f"/tmp/{trial_id}.{stream}", "lines": [], "offset": 0}
                for stream in ("stdout", "stderr")
            },
        )


def _result(trial_id: str, iteration: int, started: float, sleep_s: float) -> dict[str, Any]:
    """A result as the engine reports one of the sleep trainable's (its metric and the
    automatic fields)."""
    return {
        "loss": 1.0 / iteration,
        "training_iteration": iteration,
        "trial_id": trial_id,
        "timestamp": started + iteration * sleep_s,
        "time_this_iter_s": sleep_s,
        "time_total_s": iteration * sleep_s,
        "iterations_since_restore": iteration,
        "time_since_restore": iteration * sleep_s,
        "done": False,
        "hostname": "bench-host",
        "pid": 4242,
        "node_ip": "127.0.0.1",
        "node_id": "0" * 56,
    }


class _Method:
    def __init__(self, method: Any, trial_id: str) -> None:
        self._method, self._trial_id = method, trial_id

    def remote(self, *args: Any) -> Any:
        return self._method.remote(self._trial_id, *args)


class OneTrial:
    """What the watch takes for a trial's actor handle: its ``poll`` goes to the shared actor."""

    def __init__(self, actor: Any, trial_id: str) -> None:
        self._actor_id = (actor._actor_id, trial_id)
        self.poll = _Method(actor.poll, trial_id)


def register(url: str, trial_ids: list[str]) -> None:
    from airflow_trials.store import TrialStore

    store = TrialStore(url, create=True)
    try:
        store.ensure_experiment(TRIAL_PREFIX, metric="loss", mode="min")
        run_id = store.create_experiment_run(TRIAL_PREFIX, "run-1")
        for trial_id in trial_ids:
            store.upsert_trial(
                trial_id,
                trainable="bench._sleep_trainables:ours",
                config={},
                resources={"cpu": 0.01},
                max_failures=0,
                experiment_run_id=run_id,
            )
    finally:
        store.dispose()


def _thread_cpu() -> dict[int, float]:
    return {t.id: t.user_time + t.system_time for t in psutil.Process().threads()}


def _pin_ray(ray_core: int, own_cores: list[int]) -> None:
    me = psutil.Process()
    me.cpu_affinity(own_cores)
    for child in me.children(recursive=True):
        try:
            child.cpu_affinity([ray_core])
        except psutil.NoSuchProcess:
            pass


async def _probe(lags: list[float], stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    while not stop.is_set():
        expected = loop.time() + LAG_PROBE_S
        await asyncio.sleep(LAG_PROBE_S)
        lags.append(loop.time() - expected)


async def _run_watches(args: argparse.Namespace, url: str, log: logging.Logger) -> dict[str, Any]:
    import ray

    from airflow_trials.execution.polls import ensure_lag_probe
    from airflow_trials.execution.triggerer import poller as poller_module
    from airflow_trials.execution.triggerer.trial_watch import TrialWatch, TrialWatchSpec
    from airflow_trials.store import TrialStore

    trial_ids = [f"{TRIAL_PREFIX}-{i}" for i in range(args.trials)]
    actor_class = ray.remote(num_cpus=0.01, max_concurrency=args.trials + 16)(ManyTrials)
    actors = [actor_class.remote(args.sleep) for _ in range(args.actors)]
    ray.get([a.poll.remote("warm-up", 0, 0.0) for a in actors])
    store = TrialStore(url)
    profiles: dict[str, cProfile.Profile] = {}
    if args.profile:
        _profile_poller(poller_module, profiles)

    def new_watch(index: int, trial_id: str) -> TrialWatch:
        spec = TrialWatchSpec(
            TRIAL_PREFIX,
            trial_id,
            "ray_default",
            "trials_default",
            poll_interval_seconds=args.poll_s,
        )
        watch = TrialWatch(spec, connect=None, store=store, log=log)  # type: ignore[arg-type]
        handle = OneTrial(actors[index % len(actors)], trial_id)

        async def attach() -> None:  # TrialWatch._attach, less finding the actor on Ray
            ensure_lag_probe()
            watch.actor = handle
            watch.polls = poller_module.watch_trial(trial_id, handle, store.url, args.poll_s)

        watch._attach = attach  # type: ignore[method-assign]
        return watch

    watches = [new_watch(i, t) for i, t in enumerate(trial_ids)]
    tasks = []
    for watch in watches:  # attached over a poll interval, as triggers start over time
        tasks.append(asyncio.ensure_future(watch.until_end()))
        await asyncio.sleep(args.poll_s / len(watches))
    await asyncio.sleep(args.warmup)

    lags: list[float] = []
    collections = _GcTimer()
    gc.callbacks.append(collections)
    stop = asyncio.Event()
    probe = asyncio.ensure_future(_probe(lags, stop))
    rows_before = _result_count(store)
    cpu_before, wall_before = _thread_cpu(), time.monotonic()
    process_before = time.process_time()
    main_profile = cProfile.Profile() if args.profile else None
    if main_profile is not None:
        main_profile.enable()
    await asyncio.sleep(args.window)
    if main_profile is not None:
        main_profile.disable()
        profiles["event loop"] = main_profile
    elapsed = time.monotonic() - wall_before
    gc.callbacks.remove(collections)
    process_cpu = time.process_time() - process_before
    cpu_after = _thread_cpu()
    rows = _result_count(store) - rows_before
    tracked = len(gc.get_objects())
    stop.set()
    await probe
    done = [t for t in tasks if t.done()]
    for task in tasks:
        task.cancel()
    for watch in watches:
        watch.close()
    await asyncio.gather(*tasks, return_exceptions=True)
    store.dispose()
    loop_tid = threading.get_native_id()
    poller_tids = {t.native_id for t in threading.enumerate() if t.name == "airflow-trials-poller"}
    per_thread = {tid: cpu_after[tid] - cpu_before.get(tid, 0.0) for tid in cpu_after}
    figures = {
        "trials": args.trials,
        "window_s": elapsed,
        "cpu_share": process_cpu / elapsed,
        "loop_thread_share": per_thread.get(loop_tid, 0.0) / elapsed,
        "poller_thread_share": sum(per_thread.get(t, 0.0) for t in poller_tids) / elapsed,
        "longest_lag_ms": 1000 * max(lags, default=0.0),
        **{
            f"lags_over_{int(ms)}ms": sum(1 for lag in lags if lag * 1000 > ms)
            for ms in BLOCK_THRESHOLDS_MS
        },
        "rows_per_s": rows / elapsed,
        "gc_full_collections": len(collections.full_s),
        "longest_gc_full_ms": 1000 * max(collections.full_s, default=0.0),
        "longest_gc_full_cpu_ms": 1000 * max(collections.full_cpu_s, default=0.0),
        "gc_tracked_objects": tracked,  # what a full collection walks
        "gc_frozen_objects": gc.get_freeze_count(),
        "ended_early": [str(t.result()) for t in done][:3],
    }
    for name, profile in profiles.items():
        text = io.StringIO()
        pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(args.profile_lines)
        figures[f"profile {name}"] = text.getvalue()
    return figures


class _GcTimer:
    """How long each full (generation 2) collection of the cyclic garbage collector held every
    thread of the process, and the CPU it took (less than the hold when the machine's load
    takes the core from it mid-collection)."""

    def __init__(self) -> None:
        self.full_s: list[float] = []
        self.full_cpu_s: list[float] = []
        self._started = self._started_cpu = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if info["generation"] != 2:
            return
        if phase == "start":
            self._started, self._started_cpu = time.perf_counter(), time.thread_time()
        else:
            self.full_s.append(time.perf_counter() - self._started)
            self.full_cpu_s.append(time.thread_time() - self._started_cpu)


def _profile_poller(poller_module: Any, profiles: dict[str, cProfile.Profile]) -> None:
    """Profile the poller's thread, from its start to its end."""
    original = poller_module.TrialPoller._run

    def run(self: Any) -> None:
        profile = profiles["poller thread, warm-up and window"] = cProfile.Profile()
        profile.enable()  # cProfile follows the thread that enables it
        try:
            original(self)
        finally:
            profile.disable()

    poller_module.TrialPoller._run = run


def _result_count(store: Any) -> int:
    from sqlalchemy import func, select

    from airflow_trials.store.models import ResultRow

    with store._engine.connect() as connection:
        return int(connection.execute(select(func.count()).select_from(ResultRow)).scalar_one())


def child(args: argparse.Namespace) -> dict[str, Any]:
    import ray

    cores = list(range(psutil.cpu_count()))
    with tempfile.TemporaryDirectory(prefix="bench_poller_") as tmp:
        url = f"sqlite:///{Path(tmp) / 'trials.db'}"
        register(url, [f"{TRIAL_PREFIX}-{i}" for i in range(args.trials)])
        log = logging.getLogger("bench.trigger")
        log.propagate = False
        handler = logging.FileHandler(Path(tmp) / "task.log")
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        # "local": a Ray of its own even while another session's cluster runs on this machine.
        ray.init(
            address="local", num_cpus=4, include_dashboard=False, logging_level=logging.WARNING
        )
        try:
            if len(cores) > 1:
                _pin_ray(cores[-1], cores[:-1])
            return asyncio.run(_run_watches(args, url, log))
        finally:
            ray.shutdown()


def parent(args: argparse.Namespace, argv: list[str]) -> None:
    sides = [side.split("=", 1) for side in args.sides.split(",")]
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in sides}
    for round_ in range(args.rounds):
        for name, src in sides:
            env = {**os.environ, "PYTHONPATH": f"{Path(src).resolve()}{os.pathsep}{REPO}"}
            print(f"round {round_ + 1}, {name} ({src}) ...", flush=True)
            out = subprocess.run(
                [sys.executable, "-m", "bench.poller_load", "--child", *argv],
                cwd=REPO,
                env=env,
                capture_output=True,
                text=True,
                check=False,
            )
            lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
            if out.returncode != 0 or not lines:
                raise SystemExit(
                    f"side {name} failed (exit {out.returncode}):\n{out.stdout[-3000:]}\n"
                    f"{out.stderr[-3000:]}"
                )
            figures = json.loads(lines[-1])
            runs[name].append(figures)
            print("  " + _line(figures), flush=True)
    first = sides[0][0]
    print(f"\nmeans over {args.rounds} rounds, {args.trials} trials (batched):")
    for name, _ in sides:
        print(f"  {name:<8} " + _line(_mean(runs[name])))
    for name, _ in sides[1:]:
        a, b = _mean(runs[first]), _mean(runs[name])
        print(
            f"  {name}/{first}: CPU {b['cpu_share'] / a['cpu_share']:.2f}, loop thread "
            f"{b['loop_thread_share'] / max(a['loop_thread_share'], 1e-9):.2f}, poller thread "
            f"{b['poller_thread_share'] / max(a['poller_thread_share'], 1e-9):.2f}, longest lag "
            f"{b['longest_lag_ms']:.0f} vs {a['longest_lag_ms']:.0f} ms"
        )


def _mean(runs: list[dict[str, Any]]) -> dict[str, Any]:
    keys = [k for k, v in runs[0].items() if isinstance(v, (int, float))]
    mean = {k: sum(r[k] for r in runs) / len(runs) for k in keys}
    mean["longest_lag_ms"] = max(r["longest_lag_ms"] for r in runs)
    return mean


def _line(f: dict[str, Any]) -> str:
    return (
        f"CPU {100 * f['cpu_share']:.1f}% (loop {100 * f['loop_thread_share']:.1f}%, poller "
        f"{100 * f['poller_thread_share']:.1f}%), longest lag {f['longest_lag_ms']:.0f} ms, "
        f"lags >50 ms {f['lags_over_50ms']:.0f}, >100 ms {f['lags_over_100ms']:.0f}, "
        f"{f['rows_per_s']:.0f} results/s"
        + (
            f", full GCs {f['gc_full_collections']:.0f} (longest {f['longest_gc_full_ms']:.0f} ms"
            f", CPU {f.get('longest_gc_full_cpu_ms', 0):.0f} ms; "
            f"{f.get('gc_tracked_objects', 0):.0f} objects tracked)"
            if "gc_full_collections" in f
            else ""
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--actors", type=int, default=4, help="Ray actors answering the polls")
    parser.add_argument("--sleep", type=float, default=0.5, help="seconds between results")
    parser.add_argument("--poll-s", type=float, default=2.0, help="the triggers' poll interval")
    parser.add_argument("--warmup", type=float, default=15.0)
    parser.add_argument("--window", type=float, default=30.0)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--profile-lines", type=int, default=30)
    parser.add_argument("--sides", default=None, help="name=src,name=src: alternate source trees")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    argv = sys.argv[1:]
    args = parser.parse_args()
    if args.sides and not args.child:
        skip = {"--sides", "--rounds"}
        own = []
        it = iter(argv)
        for arg in it:
            if arg.split("=", 1)[0] in skip:
                if "=" not in arg:
                    next(it, None)
                continue
            own.append(arg)
        parent(args, own)
        return
    figures = child(args)
    for key in [k for k in figures if k.startswith("profile ")]:
        print(f"--- {key} ---\n{figures.pop(key)}")
    print(_line(figures))
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
