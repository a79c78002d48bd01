"""Benchmark: sweeps at scale. The sweep driver's runner path against Ray Tune, and through Airflow.

``--part engine`` (default): on one local Ray (``--cpus`` CPUs, 0.5 CPU per trial), side by side:

- 10,000 trials x 1 result x 0 s, and 2,000 trials x 5 results x 0.05 s;
- ours: exactly what a sweep's driver runs (``execution/driver/sweep_driver.py`` ``SweepDriver``:
  the
  TrialRunner with actor reuse, every trial recorded in a SQLite trials DB by TrialsDbCallback, the
  progress counters), here in this process so that its memory can be read;
- Ray Tune: ``Tuner.fit()`` with ``reuse_actors=True`` on the same trainable.

``--search``: the configs are asked of OptunaSearch (TPE, seed 0; ours in the driver, Ray Tune's
in ``Tuner.fit()``) as slots free, rather than a grid fixed before the run.

It prints wall times, the ratios (targets: ours / Ray Tune <= 0.8 for both; the second's wall over
its theoretical minimum <= 1.10) and the driver's peak memory (target < 1 GiB at 10,000 trials).

``--part airflow``: the 2,000 trials through a real Airflow DAG run with ``sweep=True`` (``airflow
standalone``: scheduler, triggerer, LocalExecutor) against the same sweep driver run directly on
the same Ray head; target <= 1.10 (issue 53). The measured run follows a small warm-up run (8
trials), as on a deployment whose workers and triggerer have run before; ``--cold`` measures a
fresh stack's first run instead. The driver alone runs before Airflow starts, or with
``--direct-beside-airflow`` after the warm-up, Airflow's idle processes beside it; in this
process, or with ``--direct-as-actor`` in the driver's Ray actor as the sweep task runs it. The
DAG run, and the driver alone beside Airflow, print the CPU seconds each process used meanwhile.

    .venv/bin/python -m bench.sweep_scale                       # about 15 minutes
    .venv/bin/python -m bench.sweep_scale --sizes 2000x5x0.05   # one size
    .venv/bin/python -m bench.sweep_scale --part airflow        # about 6 minutes
    .venv/bin/python -m bench.sweep_scale --search --sizes 1000x1x0 1000x5x0.05   # with
    OptunaSearch
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
EXPERIMENT = "bench_sweep_scale"


class PeakMemory:
    """This process's peak resident memory while the block runs, sampled every 50 ms."""

    interval_s = 0.05

    def __init__(self) -> None:
        import psutil

        self._process = psutil.Process()
        self.peak = self._process.memory_info().rss
        self.before = self.peak
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample_once()

    def _sample_once(self) -> None:
        self.peak = max(self.peak, self._process.memory_info().rss)

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


class TreeMemory(PeakMemory):
    """The peak resident memory of every process under ``roots`` (their pids), sampled every
    0.5 s while the block runs: by command line (its first 70 characters), the largest process of
    each (a Ray worker is named for the actor it hosts: ``ray::SweepDriver``). Also the CPU time
    each command line's processes used between their first and last sample: where the cores went
    while the block ran (a process that lived less than 0.5 s is missed)."""

    interval_s = 0.5

    def __init__(self, *roots: int) -> None:
        super().__init__()
        self.roots = roots
        self.peaks: dict[str, int] = {}
        # pid -> (label, CPU seconds at its first sample, at its last)
        self.cpu: dict[int, tuple[str, float, float]] = {}

    def _sample_once(self) -> None:
        import psutil

        for root in self.roots:
            try:
                tree = [psutil.Process(root), *psutil.Process(root).children(recursive=True)]
            except psutil.NoSuchProcess:
                continue
            for process in tree:
                try:
                    label = " ".join(process.cmdline())[:70] or process.name()
                    rss = process.memory_info().rss
                    times = process.cpu_times()
                except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                    continue
                self.peaks[label] = max(self.peaks.get(label, 0), rss)
                used = times.user + times.system
                first = self.cpu.get(process.pid, (label, used, used))[1]
                self.cpu[process.pid] = (label, first, used)

    def report(self, top: int = 12) -> None:
        print(f"peak memory by process (the {top} largest):")
        for label, peak in sorted(self.peaks.items(), key=lambda item: -item[1])[:top]:
            print(f"  {peak / 2**20:7.0f} MiB  {label}")
        used: dict[str, float] = {}
        for label, first, last in self.cpu.values():
            used[label] = used.get(label, 0.0) + last - first
        print(f"CPU seconds by process while it ran, {sum(used.values()):.1f} s in all:")
        for label, seconds in sorted(used.items(), key=lambda item: -item[1])[:top]:
            print(f"  {seconds:7.1f} s    {label}")


def sweep_spec(
    name: str,
    trials: int,
    iterations: int,
    sleep_s: float,
    db_url: str,
    storage: str,
    search: bool = False,
) -> object:
    """The driver's spec: ``x`` = 0, 1, ... (a grid), or with ``search`` asked of OptunaSearch (seed
    0)
    over uniform(0, 1), the trials given as ``{}``, as ``suggest_configs`` gives them."""
    from airflow_trials import OptunaSearch
    from airflow_trials.core.search import uniform
    from airflow_trials.execution.driver.sweep_driver import SweepSpec
    from airflow_trials.store import TrialStore

    store = TrialStore(db_url, create=True)
    try:
        store.ensure_experiment(name, metric="loss", mode="min")
        run_pk = store.create_experiment_run(name, "bench")
    finally:
        store.dispose()
    fixed = {"iterations": iterations, "sleep_s": sleep_s}
    configs = [(f"{name}-{i:05d}", {} if search else {"x": i, **fixed}) for i in range(trials)]
    searcher = (
        OptunaSearch({"x": uniform(0.0, 1.0), **fixed}, metric="loss", mode="min", seed=0)
        if search
        else None
    )
    return SweepSpec(
        experiment_name=name,
        run_key="bench",
        experiment_run_id=run_pk,
        trainable="bench._sleep_trainables:ours",
        trials=configs,
        metric="loss",
        mode="min",
        db_url=db_url,
        storage_path=storage,
        namespace="bench",
        trial_kwargs={"resources": {"cpu": 0.5}, "checkpoint_at_end": False},
        search_alg=searcher,
    )


def run_ours(
    trials: int, iterations: int, sleep_s: float, storage: str, search: bool = False
) -> tuple[float, int]:
    """The sweep driver's work in this process: wall seconds and this process's peak memory in
    bytes (a driver actor's process holds the same: Ray, SQLAlchemy, the runner and its trials)."""
    from airflow_trials.execution.driver.sweep_driver import SweepDriver

    name = f"{EXPERIMENT}-{trials}x{iterations}{'-search' if search else ''}"
    db_url = f"sqlite:///{storage}/{name}.db"
    spec = sweep_spec(name, trials, iterations, sleep_s, db_url, storage, search)
    with PeakMemory() as memory:
        start, cpu = time.perf_counter(), time.process_time()
        driver = SweepDriver(spec)
        driver.wait(24 * 3600)
        elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    progress = driver.progress()
    if progress.get("error") or progress["terminated"] != trials:
        raise SystemExit(f"our sweep ended with {progress}")
    print(
        f"  (peak {memory.peak / 2**20:.0f} MiB, {(memory.peak - memory.before) / 2**20:.0f} MiB "
        f"more than before; the driver's process used {cpu:.1f} s of CPU, "
        f"{cpu / trials * 1000:.2f} ms per trial: wall time on a loaded machine, CPU time not)"
    )
    db = Path(storage) / f"{name}.db"
    size = sum(p.stat().st_size for p in db.parent.glob(f"{db.name}*"))
    print(f"  (trials DB {db}: {size / 2**20:.1f} MiB, {size / trials:.0f} bytes per trial)")
    return elapsed, memory.peak


def run_tune(
    trials: int, iterations: int, sleep_s: float, storage: str, search: bool = False
) -> float:
    """``Tuner.fit()`` on the same work; with ``search``, Ray Tune's OptunaSearch (seed 0) over the
    same space, ``num_samples`` trials."""
    from ray import tune
    from ray.tune.search.optuna import OptunaSearch

    from bench._sleep_trainables import ray_tune

    fixed = {"iterations": iterations, "sleep_s": sleep_s}
    space = {
        "x": tune.uniform(0.0, 1.0) if search else tune.grid_search(list(range(trials))),
        **fixed,
    }
    config = (
        tune.TuneConfig(
            reuse_actors=True,
            num_samples=trials,
            metric="loss",
            mode="min",
            search_alg=OptunaSearch(seed=0),
        )
        if search
        else tune.TuneConfig(reuse_actors=True)
    )
    tuner = tune.Tuner(
        tune.with_resources(ray_tune, {"cpu": 0.5}),
        param_space=space,
        tune_config=config,
        run_config=tune.RunConfig(
            name=f"bench-tune-{trials}x{iterations}{'-search' if search else ''}",
            storage_path=storage,
            verbose=0,
        ),
    )
    start = time.perf_counter()
    results = tuner.fit()
    elapsed = time.perf_counter() - start
    if results.num_errors or len(results) != trials:
        raise SystemExit(f"Ray Tune run had {results.num_errors} errors of {len(results)} trials")
    return elapsed


def start_local_ray(cpus: int) -> None:
    """A Ray of this process's own (``cpus`` CPUs, no dashboard), in the benchmark's namespace."""
    import ray

    ray.init(
        address="local",
        num_cpus=cpus,
        include_dashboard=False,
        log_to_driver=False,
        namespace="bench",
    )


def engine(args: argparse.Namespace) -> None:
    import ray

    start_local_ray(args.cpus)
    storage = tempfile.mkdtemp(prefix="airflow_trials_bench_sweep_")
    rows = []
    for size in args.sizes:
        trials, iterations, sleep_s = int(size[0]), int(size[1]), float(size[2])
        ours_s, grown = run_ours(trials, iterations, sleep_s, storage, args.search)
        print(
            f"ours  {trials} x {iterations} x {sleep_s:g} s: {ours_s:.1f} s, driver peak memory "
            f"{grown / 2**20:.0f} MiB",
            flush=True,
        )
        tune_s = (
            None if args.skip_tune else run_tune(trials, iterations, sleep_s, storage, args.search)
        )
        if tune_s is not None:
            print(f"tune  {trials} x {iterations} x {sleep_s:g} s: {tune_s:.1f} s", flush=True)
        rows.append((trials, iterations, sleep_s, ours_s, tune_s, grown))
    ray.shutdown()
    slots = args.cpus / 0.5
    print()
    print(
        f"{'trials x results x sleep':<26} {'ours':>8} {'Ray Tune':>9} {'ours/Tune':>10} "
        f"{'ours/min':>9} "
        f"{'driver peak':>14}"
    )
    for trials, iterations, sleep_s, ours_s, tune_s, grown in rows:
        minimum = trials * iterations * sleep_s / slots
        ratio = f"{ours_s / tune_s:10.2f}" if tune_s else f"{'-':>10}"
        over = f"{ours_s / minimum:9.2f}" if minimum else f"{'-':>9}"
        print(
            f"{f'{trials} x {iterations} x {sleep_s:g} s':<26} {ours_s:7.1f}s "
            f"{(f'{tune_s:8.1f}s' if tune_s else '-'):>9} {ratio} {over} {grown / 2**20:11.0f} MiB"
        )
    print(
        "targets: ours/Tune <= 0.80 for both; ours/min <= 1.10 for 2000 x 5 x 0.05 s; driver "
        "memory < 1024 MiB"
    )
    scale_pairs = [
        (small, large)
        for small, large in zip(rows, rows[1:], strict=False)
        if small[1:3] == large[1:3] and large[0] > small[0]
    ]
    for small, large in scale_pairs:  # e.g. --sizes 10000x1x0 100000x1x0
        times, linear = large[3] / small[3], large[0] / small[0]
        grown = (large[5] - small[5]) / 2**20
        print(
            f"{small[0]} -> {large[0]} trials: driver peak memory {grown:+.0f} MiB (target < 300 "
            f"MiB); wall time x{times:.2f} against x{linear:.0f} linear: {times / linear:.2f} "
            "(target <= 1.10)"
        )


SWEEP_DAG = """
import datetime
from airflow.sdk import DAG
from airflow_trials.core.search import grid_search
from airflow_trials.experiment import tuning_experiment

with DAG({name!r}, schedule=None, start_date=datetime.datetime(2026, 1, 1), catchup=False) as dag:
    tuning_experiment(
        experiment_name={name!r},
        trainable="bench._sleep_trainables:ours",
        search_space={{"x": grid_search(list(range({trials}))), "iterations": {iterations},
                      "sleep_s": {sleep}}},
        metric="loss",
        mode="min",
        resources_per_trial={{"cpu": 0.5}},
        checkpoint_at_end=False,
        poll_interval_seconds=1.0,
        sweep=True,
    )
"""


def print_breakdown(stack: object, dag_id: str, run_id: str, queued: object) -> None:
    """Where the DAG run's time went: each task's queued, start and end, in seconds from the run's
    queued_at."""
    from airflow_trials import mainjob
    from bench.airflow_vs_runner import _parse

    rows = mainjob._airflow_db(
        stack,
        "SELECT task_id, queued_dttm, start_date, end_date, try_number FROM task_instance "
        "WHERE dag_id = ? AND run_id = ? ORDER BY start_date",
        dag_id,
        run_id,
    )
    print("task (try): queued / started / ended, seconds after the run was queued")
    for task_id, queued_at, started, ended, try_number in rows:
        times = [
            f"{(_parse(t) - queued).total_seconds():7.1f}" if t else "      -"
            for t in (queued_at, started, ended)
        ]
        print(f"  {task_id:<40} ({try_number}) {' / '.join(times)}")


def run_dag(stack: Any, dag_id: str, timeout_s: float) -> tuple[str, float]:
    """Trigger ``dag_id`` on the running stack and wait for its run: its run id and its time from
    queued to end (the scheduler's own latency counts)."""
    from airflow_trials import mainjob
    from bench.airflow_vs_runner import _parse

    run_id = mainjob.trigger(stack, dag_id)
    state = mainjob.wait_for(
        lambda: (
            (s := mainjob.dag_run_state(stack, dag_id, run_id)) in mainjob.TERMINAL_RUN_STATES and s
        ),
        timeout_s,
        f"the DAG run {run_id}",
        stack,
    )
    if state != "success":
        raise SystemExit(f"The sweep DAG run {run_id} ended {state}; see {stack.log_path}.")
    ((queued, ended),) = mainjob._airflow_db(
        stack,
        "SELECT queued_at, end_date FROM dag_run WHERE dag_id = ? AND run_id = ?",
        dag_id,
        run_id,
    )
    return run_id, (_parse(ended) - _parse(queued)).total_seconds()


def run_direct(
    address: str, stack: Any, name: str, size: tuple[int, int, float], as_actor: bool = False
) -> float:
    """The same sweep's driver alone on the stack's Ray head and trials DB: its wall seconds. In
    this process, or with ``as_actor`` as the sweep task runs it: the driver's Ray actor
    (``start_or_attach_driver``), this process only waiting for it."""
    import ray

    from airflow_trials.execution.driver.sweep_client import start_or_attach_driver
    from airflow_trials.execution.driver.sweep_driver import SweepDriver

    ray.init(address=address, log_to_driver=False, namespace="bench")
    spec = sweep_spec(f"{name}_direct", *size, stack.trials_db_url, str(stack.storage))
    with PeakMemory() as memory:
        start, cpu = time.perf_counter(), time.process_time()
        if as_actor:
            actor, _ = start_or_attach_driver(spec)
            ray.get(actor.wait.remote(24 * 3600))
            ray.kill(actor)
        else:
            SweepDriver(spec).wait(24 * 3600)
        direct_s, cpu = time.perf_counter() - start, time.process_time() - cpu
    ray.shutdown()
    where = "as its Ray actor" if as_actor else "in this process"
    print(
        f"sweep driver directly, {where}: {direct_s:.1f} s, this process's CPU {cpu:.1f} s and "
        f"peak memory {memory.peak / 2**20:.0f} MiB",
        flush=True,
    )
    return direct_s


def airflow(args: argparse.Namespace) -> None:

    from airflow_trials import mainjob
    from airflow_trials.ports import free_port
    from bench.airflow_vs_runner import _parse

    trials, iterations, sleep_s = (
        int(args.sizes[0][0]),
        int(args.sizes[0][1]),
        float(args.sizes[0][2]),
    )
    os.environ["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(REPO), os.environ.get("PYTHONPATH")])
    )
    name, warmup = f"{EXPERIMENT}_airflow", f"{EXPERIMENT}_airflow_warmup"
    with tempfile.TemporaryDirectory(prefix="bench_sweep_airflow_") as tmp:
        dags = Path(tmp) / "dags"
        dags.mkdir()
        for dag_id, size in ((name, (trials, iterations, sleep_s)), (warmup, (8, 1, 0.0))):
            (dags / f"{dag_id}.py").write_text(
                SWEEP_DAG.format(name=dag_id, trials=size[0], iterations=size[1], sleep=size[2])
            )
        stack = mainjob.Stack(home=Path(tmp) / "state", dags_folder=dags)
        try:
            mainjob.prepare(stack, api_port=free_port())
            address = mainjob.start_ray(stack, args.cpus)
            size = (trials, iterations, sleep_s)
            direct_s = None
            if not args.skip_direct and not args.direct_beside_airflow:
                direct_s = run_direct(address, stack, name, size, args.direct_as_actor)
            mainjob.start_airflow(stack)
            if (
                not args.cold
            ):  # a deployment's workers and triggerer have run a task and a trigger before
                print(f"warm-up run of {warmup}: {run_dag(stack, warmup, args.timeout_s)[1]:.1f} s")
            if not args.skip_direct and args.direct_beside_airflow:
                with TreeMemory(stack.ray.pid, stack.airflow.pid) as beside:
                    direct_s = run_direct(
                        address, stack, f"{name}_beside", size, args.direct_as_actor
                    )
                beside.report()
            assert stack.ray is not None and stack.airflow is not None
            with TreeMemory(stack.ray.pid, stack.airflow.pid) as memory:
                run_id, airflow_s = run_dag(stack, name, args.timeout_s)
            memory.report()
            ((queued,),) = mainjob._airflow_db(
                stack, "SELECT queued_at FROM dag_run WHERE dag_id = ? AND run_id = ?", name, run_id
            )
            print_breakdown(stack, name, run_id, _parse(queued))
            for task_id, key, size in mainjob._airflow_db(
                stack,
                "SELECT task_id, key, length(value) FROM xcom WHERE dag_id = ? AND run_id = ?",
                name,
                run_id,
            ):
                print(f"  XCom {task_id} {key}: {size} bytes")
        finally:
            mainjob.stop(stack)
    print(
        f"{trials} trials x {iterations} x {sleep_s:g} s, 0.5 CPU each on {args.cpus} CPUs, "
        f"{'a fresh Airflow stack' if args.cold else 'after a warm-up run'}"
    )
    print(f"Airflow DAG run (sweep=True), queued -> end {airflow_s:7.1f} s")
    if direct_s is None:
        return
    print(f"sweep driver directly               {direct_s:7.1f} s")
    ratio = airflow_s / direct_s
    print(
        f"ratio Airflow / direct: {ratio:.3f} (target <= 1.10: "
        f"{'met' if ratio <= 1.10 else 'missed'})"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--part", choices=("engine", "airflow"), default="engine")
    parser.add_argument(
        "--sizes",
        nargs="+",
        default=None,
        help="trials x results x sleep seconds, e.g. 10000x1x0 2000x5x0.05",
    )
    parser.add_argument("--cpus", type=int, default=2)
    parser.add_argument("--skip-tune", action="store_true", help="only run ours")
    parser.add_argument(
        "--search",
        action="store_true",
        help="engine part: configs asked of OptunaSearch (ours and Ray Tune's), not a grid",
    )
    parser.add_argument(
        "--cold",
        action="store_true",
        help="airflow part: measure the first DAG run of a fresh stack (no warm-up run)",
    )
    parser.add_argument(
        "--direct-as-actor",
        action="store_true",
        help="airflow part: run the driver alone as the sweep task does, in its Ray actor "
        "(default: in this process)",
    )
    parser.add_argument(
        "--direct-beside-airflow",
        action="store_true",
        help="airflow part: run the driver alone after Airflow started (its idle processes "
        "beside it), with the CPU each process used meanwhile",
    )
    parser.add_argument(
        "--skip-direct",
        action="store_true",
        help="airflow part: run only the DAG (compare with --part engine on the same size)",
    )
    parser.add_argument("--timeout-s", type=float, default=3600)
    args = parser.parse_args(argv)
    default = ["10000x1x0", "2000x5x0.05"] if args.part == "engine" else ["2000x5x0.05"]
    args.sizes = [size.split("x") for size in (args.sizes or default)]
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(REPO), os.environ.get("PYTHONPATH")])
    )
    sys.path.insert(0, str(REPO))
    (engine if args.part == "engine" else airflow)(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
