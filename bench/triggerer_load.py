"""Benchmark: one real Airflow triggerer watching N running trials (issue "compass P5").

A local Ray head and the real Airflow components (api-server, scheduler, dag-processor,
triggerer: ``tests.faults.stack.FaultStack``) run one ``tuning_experiment`` DAG of ``--trials``
trials of a sleep trainable that reports every ``--sleep`` seconds (0.5) for far longer than the
benchmark lasts. Each trial takes 0.01 CPU, so all of them run at once; their trial tasks are
deferred, and one triggerer watches them all with the default 2 s poll interval. The Ray head and
its actors are pinned to the last core and Airflow to the others (``--no-pin`` turns it off), as
a triggerer on its own machine: 200 actor processes otherwise keep 2 cores so busy that the
operating system alone leaves any process's thread waiting for hundreds of milliseconds.

Once every trial is RUNNING in the trials store, the triggerer is measured over a steady window
(``--window`` seconds) on the shared batched poller; with ``--modes batched,base,batched`` and
``--base-src`` (a checkout's ``src`` from before a change), again on that code's triggerer,
restarting only the triggerer between windows (the trials keep running; the new triggers
re-attach), and once more on this code. Per mode:

- CPU: user + system time of the triggerer and its trigger-runner subprocess (psutil), as a
  share of one core;
- event-loop blocks: Airflow's own watchdog (``[triggerer] blocked_main_thread_warning_threshold``
  set to 0.15 s, so a block of more than 50 ms is logged) and "appears deadlocked" lines in the
  triggerer's log, and the longest lag of airflow_trials' 20 ms loop probe;
- store writes: result rows per second (counted in the trials DB), store transactions per second
  (the triggerer's own count, from the probe's log line) and, on PostgreSQL, commits per second
  on the trials database from ``pg_stat_database``.

It prints each figure, the targets (< 10% of one core, no block > 50 ms) and the ratio
batched / base. It also prints the trial actors' memory, to size N for the machine. (The
per-trial path, ``AIRFLOW_TRIALS_BATCHED_POLLS=0``, that earlier runs compared against was
removed; a ``--base-src`` from before 2026-11-27 still has it, with that variable in the
environment.)

    .venv/bin/python -m bench.triggerer_load --trials 200                 # about 20 minutes
    .venv/bin/python -m bench.triggerer_load --trials 200 \
        --postgres-url postgresql+psycopg://postgres@127.0.0.1:5432/test
    .venv/bin/python -m bench.triggerer_load --trials 10 --settle 5 --window 70   # a quick look

Stops only what it started (by process group); never ``ray stop``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import re
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psutil
from sqlalchemy import create_engine, func, select, text

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tests.faults.stack import FaultStack, RayHead, base_env  # noqa: E402

EXPERIMENT = "bench_triggerer_load"
# "base": the batched poller of the code in --base-src (a checkout from before a change).
MODES = ("batched", "base")
# Below this, the benchmark stops rather than let the OOM killer pick processes of the machine.
MIN_AVAILABLE_GIB = 2.0
# Airflow's watchdog sleeps 0.1 s and logs when that took longer than the threshold.
WATCHDOG_SLEEP_S = 0.1
WATCHDOG_THRESHOLD_S = 0.15
BLOCKED = re.compile(r"async thread was blocked for ([0-9.]+) seconds")
LAG = re.compile(
    r"Trigger event loop: longest lag ([0-9.]+) ms over ([0-9.]+) s; trial store writes: (\d+) "
    r"transactions"
)

DAG_TEMPLATE = """
import datetime
from airflow.sdk import DAG
from airflow_trials.core.search import grid_search
from airflow_trials.experiment import tuning_experiment

with DAG({name!r}, schedule=None, start_date=datetime.datetime(2026, 1, 1), catchup=False,
         max_active_tasks={max_active}):
    tuning_experiment(
        experiment_name={name!r},
        trainable="bench._sleep_trainables:ours",
        search_space={{"x": grid_search(list(range({trials}))), "iterations": 1000000,
                      "sleep_s": {sleep}}},
        metric="loss",
        mode="min",
        resources_per_trial={{"cpu": 0.01}},
        checkpoint_at_end=False,
        max_failures=0,
    )
"""


@dataclass
class Figures:
    """One mode's measurements over its window."""

    mode: str
    window_s: float
    cpu_share: float
    runner_cpu_share: float  # of cpu_share: the trigger-runner subprocess (the event loop's)
    blocks: list[float]  # seconds each logged block held the loop
    deadlocked: int
    probe_lag_ms: float | None
    rows_per_s: float
    commits_per_s: float | None
    transactions_per_s: float | None

    @property
    def longest_block_ms(self) -> float:
        return 1000 * max(self.blocks, default=0.0)


@contextmanager
def trials_database(postgres_url: str | None, home: Path) -> Iterator[tuple[str, str | None]]:
    """A fresh trials DB (its URL, and its PostgreSQL name), migrated; dropped afterwards."""
    from airflow_trials.store import TrialStore

    if postgres_url is None:
        url = f"sqlite:///{home / 'trials.db'}"
        TrialStore(url, create=True).dispose()
        yield url, None
        return
    # The contract tests' own database of one test (created, and dropped with its connections).
    from tests.contract import conftest as contract

    os.environ[contract.POSTGRES_URL_ENV] = postgres_url
    with contextmanager(contract.postgres_database.__wrapped__)() as database:
        TrialStore(database.url, create=True).dispose()
        yield database.url, database.name


class Probe:
    """Reads the trials DB (results, statuses, commits) for the benchmark."""

    def __init__(self, url: str, postgres_url: str | None, db_name: str | None) -> None:
        self.engine = create_engine(url)
        self.admin = create_engine(postgres_url) if postgres_url else None
        self.db_name = db_name

    def running(self) -> int:
        from airflow_trials.store.models import TrialRow

        with self.engine.connect() as c:
            return int(
                c.execute(
                    select(func.count()).select_from(TrialRow).where(TrialRow.status == "RUNNING")
                ).scalar_one()
            )

    def errors(self) -> list[str]:
        """The first words of each ERROR trial's message."""
        from airflow_trials.store.models import TrialRow

        with self.engine.connect() as c:
            rows = c.execute(
                select(TrialRow.trial_id, TrialRow.error_msg).where(TrialRow.status == "ERROR")
            )
            return [f"{trial_id}: {(message or '')[:300]}" for trial_id, message in rows]

    def newest_iterations(self) -> dict[str, int]:
        from airflow_trials.store.models import ResultRow

        with self.engine.connect() as c:
            rows = c.execute(
                select(ResultRow.trial_id, func.max(ResultRow.iteration)).group_by(
                    ResultRow.trial_id
                )
            )
            return {trial_id: int(newest) for trial_id, newest in rows}

    def result_rows(self) -> int:
        from airflow_trials.store.models import ResultRow

        with self.engine.connect() as c:
            return int(c.execute(select(func.count()).select_from(ResultRow)).scalar_one())

    def commits(self) -> int | None:
        if self.admin is None:
            return None
        with self.admin.connect() as c:
            return int(
                c.execute(
                    text("SELECT xact_commit FROM pg_stat_database WHERE datname = :n"),
                    {"n": self.db_name},
                ).scalar_one()
            )

    def close(self) -> None:
        self.engine.dispose()
        if self.admin is not None:
            self.admin.dispose()


def triggerer_processes(stack: FaultStack) -> list[psutil.Process]:
    root = psutil.Process(stack.pid("triggerer"))
    return [root, *root.children(recursive=True)]


def cpu_seconds(processes: list[psutil.Process]) -> dict[int, float]:
    seconds = {}
    for proc in processes:
        try:
            times = proc.cpu_times()
            seconds[proc.pid] = times.user + times.system
        except psutil.NoSuchProcess:
            pass
    return seconds


def actor_memory_mb() -> tuple[int, float, float]:
    """How many trial actor processes run, and their mean unique (USS) and resident (RSS) memory in
    MB."""
    uss, rss = [], []
    for proc in psutil.process_iter(["cmdline"]):
        if any("TrialActor" in part for part in proc.info["cmdline"] or ()):
            try:
                info = proc.memory_full_info()
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            uss.append(info.uss / 2**20)
            rss.append(info.rss / 2**20)
    count = len(uss)
    return count, (sum(uss) / count if count else 0.0), (sum(rss) / count if count else 0.0)


def _logged_at(line: str) -> float | None:
    try:
        return dt.datetime.fromisoformat(line.split(" ", 1)[0].replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def log_lines(stack: FaultStack, start: float, end: float) -> list[str]:
    path = stack.log_path("triggerer")
    return [
        line
        for line in path.read_text(errors="replace").splitlines()
        if (at := _logged_at(line)) is not None and start <= at <= end
    ]


def wait_until_watched(
    stack: FaultStack, probe: Probe, since: dict[str, int], timeout_s: float
) -> None:
    """Until every running trial has a result newer than ``since`` in the store: every trigger
    watches."""

    def all_fresh() -> bool:
        newest = probe.newest_iterations()
        fresh = sum(1 for trial_id, it in newest.items() if it > since.get(trial_id, 0))
        running = probe.running()
        print(
            f"  {fresh}/{running} running trials recorded by this triggerer", end="\r", flush=True
        )
        return fresh >= running

    stack.wait_for(all_fresh, timeout_s, "every trial to be watched by the triggerer", interval_s=5)
    print()


def measure(stack: FaultStack, probe: Probe, mode: str, window_s: float) -> Figures:
    processes = triggerer_processes(stack)
    before_cpu, before_rows, before_commits = (
        cpu_seconds(processes),
        probe.result_rows(),
        probe.commits(),
    )
    start_wall, start = time.time(), time.monotonic()
    time.sleep(window_s)
    after_cpu, after_rows, after_commits = (
        cpu_seconds(processes),
        probe.result_rows(),
        probe.commits(),
    )
    elapsed, end_wall = time.monotonic() - start, time.time()
    stack.check_alive()
    spent = {pid: after_cpu[pid] - before_cpu[pid] for pid in after_cpu if pid in before_cpu}
    cpu = sum(spent.values())
    supervisor = stack.pid("triggerer")
    lines = log_lines(stack, start_wall, end_wall + 5)
    blocks = [float(m.group(1)) - WATCHDOG_SLEEP_S for line in lines if (m := BLOCKED.search(line))]
    # The probe's lines each cover the 60 s before them: --settle keeps them inside steady time.
    probe_lines = [
        (float(m.group(1)), float(m.group(2)), int(m.group(3)))
        for line in lines
        if (m := LAG.search(line))
    ]
    commits = (
        None
        if before_commits is None or after_commits is None
        else (after_commits - before_commits) / elapsed
    )
    return Figures(
        mode=mode,
        window_s=elapsed,
        cpu_share=cpu / elapsed,
        runner_cpu_share=sum(v for pid, v in spent.items() if pid != supervisor) / elapsed,
        blocks=blocks,
        deadlocked=sum("appears deadlocked" in line for line in lines),
        probe_lag_ms=max(lag for lag, _, _ in probe_lines) if probe_lines else None,
        rows_per_s=(after_rows - before_rows) / elapsed,
        commits_per_s=commits,
        transactions_per_s=(
            sum(tx for _, _, tx in probe_lines) / sum(s for _, s, _ in probe_lines)
            if probe_lines
            else None
        ),
    )


def _fmt(value: float | None, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def report(figures: list[Figures], trials: int, memory: tuple[int, float, float]) -> None:
    print(f"\n{trials} trials reporting every 0.5 s, one triggerer, 2 s polls; steady windows:")
    print(f"{'':<34}" + "".join(f"{f.mode:>14}" for f in figures))
    rows = [
        ("window (s)", [f"{f.window_s:.0f}" for f in figures]),
        ("triggerer CPU (% of one core)", [f"{100 * f.cpu_share:.1f}" for f in figures]),
        ("  of it the trigger runner", [f"{100 * f.runner_cpu_share:.1f}" for f in figures]),
        ("longest loop block (ms, watchdog)", [f"{f.longest_block_ms:.0f}" for f in figures]),
        ("blocks > 50 ms logged", [str(len(f.blocks)) for f in figures]),
        ("'appears deadlocked'", [str(f.deadlocked) for f in figures]),
        ("longest loop lag (ms, 20 ms probe)", [_fmt(f.probe_lag_ms, ".1f") for f in figures]),
        ("result rows written / s", [f"{f.rows_per_s:.0f}" for f in figures]),
        (
            "store transactions / s (triggerer)",
            [_fmt(f.transactions_per_s, ".1f") for f in figures],
        ),
        ("DB commits / s (pg_stat_database)", [_fmt(f.commits_per_s, ".1f") for f in figures]),
    ]
    for label, values in rows:
        print(f"{label:<34}" + "".join(f"{v:>14}" for v in values))
    base = [f for f in figures if f.mode == "base"]
    news = [f for f in figures if f.mode == "batched"]
    if base and news:
        mean_cpu = {
            m: sum(f.cpu_share for f in fs) / len(fs) for m, fs in (("base", base), ("new", news))
        }
        print(
            f"ratio batched / base (means of {len(news)} and {len(base)} windows): triggerer CPU "
            f"{mean_cpu['new'] / mean_cpu['base']:.2f}; longest block "
            f"{max(f.longest_block_ms for f in news):.0f} ms vs "
            f"{max(f.longest_block_ms for f in base):.0f} ms"
        )
    for f in figures:
        cpu_ok = f.cpu_share < 0.10
        block_ok = f.longest_block_ms <= 50 and f.deadlocked == 0
        print(
            f"targets, {f.mode}: CPU < 10% of one core {'met' if cpu_ok else 'missed'} "
            f"({f.cpu_share / 0.10:.2f} of target); no block > 50 ms "
            f"{'met' if block_ok else 'missed'}"
        )
    count, uss_mb, rss_mb = memory
    print(
        f"trial actors: {count} processes, {uss_mb:.0f} MB unique memory each (USS; {rss_mb:.0f} "
        "MB "
        f"resident), {count * uss_mb / 1024:.1f} GiB unique in all; machine: {psutil.cpu_count()} "
        "cores, "
        f"{psutil.virtual_memory().total / 2**30:.0f} GiB, "
        f"{psutil.virtual_memory().available / 2**30:.1f} GiB "
        f"available now"
    )


def pin(processes: list[psutil.Process], cores: list[int]) -> None:
    """Keep these processes (and the children they start later) on ``cores``."""
    for proc in processes:
        try:
            proc.cpu_affinity(cores)
        except psutil.NoSuchProcess:
            pass


def stack_processes(stack: FaultStack) -> list[psutil.Process]:
    found = []
    for name in stack.procs:
        if stack.is_running(name):
            root = psutil.Process(stack.pid(name))
            found += [root, *root.children(recursive=True)]
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument(
        "--sleep", type=float, default=0.5, help="seconds between a trial's results"
    )
    parser.add_argument("--window", type=float, default=90, help="seconds measured per mode")
    parser.add_argument(
        "--settle",
        type=float,
        default=65,
        help="seconds after every trigger attached before measuring (>= the 60 s log period)",
    )
    parser.add_argument(
        "--modes",
        default="batched",
        help="windows in turn, each 'batched' (this code) or 'base' (--base-src's); the first "
        "also sets the trials up, so it is 'batched'",
    )
    parser.add_argument("--parallelism", type=int, default=8, help="Airflow's [core] parallelism")
    parser.add_argument(
        "--postgres-url", default=None, help="trials DB server; default a SQLite file"
    )
    parser.add_argument(
        "--base-src",
        default=None,
        help="the 'base' mode's triggerer imports airflow_trials from this src directory first "
        "(the code before a change: batched,base,batched measures before and after side by side)",
    )
    parser.add_argument("--setup-timeout-s", type=float, default=2400)
    parser.add_argument(
        "--no-pin",
        dest="pin",
        action="store_false",
        help="let Ray's actors share every core with Airflow (default: Ray on the "
        "last core, Airflow on the others, as a triggerer on its own machine)",
    )
    args = parser.parse_args()
    modes = args.modes.split(",")
    if any(m not in MODES for m in modes):
        parser.error(f"--modes takes {', '.join(MODES)}, comma-separated; got {args.modes!r}")
    if "base" in modes and (args.base_src is None or modes[0] == "base"):
        parser.error("mode 'base' needs --base-src, and another mode first (it sets the trials up)")

    with (
        tempfile.TemporaryDirectory(prefix="bench_p5_") as tmp,
        trials_database(args.postgres_url, Path(tmp)) as (url, db_name),
    ):
        home = Path(tmp)
        ray = RayHead(base_env(), num_cpus=4)
        stack: FaultStack | None = None
        probe = Probe(url, args.postgres_url, db_name)
        try:
            ray.start()
            ray.disconnect()  # the benchmark reads the store and psutil only
            cores = list(range(psutil.cpu_count()))
            airflow_cores, ray_cores = (
                (cores[:-1], cores[-1:]) if args.pin and len(cores) > 1 else (cores, cores)
            )
            pin(ray.processes(), ray_cores)  # the workers the raylet starts inherit it
            stack = FaultStack(
                home / "stack",
                ray,
                url,
                parallelism=args.parallelism,
                settings={
                    "AIRFLOW__TRIGGERER__BLOCKED_MAIN_THREAD_WARNING_THRESHOLD": str(
                        WATCHDOG_THRESHOLD_S
                    ),
                },
            )
            stack.write_dag(
                f"{EXPERIMENT}.py",
                DAG_TEMPLATE.format(
                    name=EXPERIMENT,
                    trials=args.trials,
                    sleep=args.sleep,
                    max_active=args.trials + 16,
                ),
            )
            pythonpath = stack.env.get("PYTHONPATH", "")
            stack.start()
            pin(stack_processes(stack), airflow_cores)
            started = time.monotonic()
            run_id = stack.trigger(EXPERIMENT)
            print(f"triggered {run_id}; waiting for {args.trials} trials to run, deferred")

            def all_running() -> bool:
                running = probe.running()
                available = psutil.virtual_memory().available / 2**30
                print(
                    f"  {running}/{args.trials} trials running, {available:.1f} GiB available",
                    end="\r",
                    flush=True,
                )
                if available < MIN_AVAILABLE_GIB:
                    raise SystemExit(
                        f"Memory ran low ({available:.1f} GiB available) with {running} of "
                        f"{args.trials} trials running: run with fewer --trials."
                    )
                return running >= args.trials

            stack.wait_for(
                all_running, args.setup_timeout_s, f"{args.trials} RUNNING trials", interval_s=5
            )
            print()
            print(f"all {args.trials} trials running after {time.monotonic() - started:.0f} s")
            figures = []
            for index, mode in enumerate(modes):
                since = probe.newest_iterations()
                if index > 0:
                    stack.stop("triggerer")
                    stack.env["PYTHONPATH"] = os.pathsep.join(
                        filter(None, [args.base_src if mode == "base" else None, pythonpath])
                    )
                    since = probe.newest_iterations()
                    stack.start("triggerer")
                    pin(stack_processes(stack), airflow_cores)
                print(f"{mode}: waiting for every trigger to attach")
                wait_until_watched(stack, probe, since, args.setup_timeout_s)
                time.sleep(args.settle)
                print(f"{mode}: measuring {args.window:.0f} s (load {psutil.getloadavg()[0]:.1f})")
                figures.append(measure(stack, probe, mode, args.window))
                print(f"  {figures[-1]}")
                ended = args.trials - probe.running()
                if ended:
                    print(f"  {ended} trials are no longer RUNNING: {probe.errors()}")
            report(figures, args.trials, actor_memory_mb())
            print(f"cores: Airflow {airflow_cores}, Ray {ray_cores}")
        finally:
            probe.close()
            if stack is not None:
                stack.close()
            ray.close()
    sys.stdout.flush()


if __name__ == "__main__":
    main()
