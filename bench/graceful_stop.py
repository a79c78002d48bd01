"""Benchmark: the main job's Ctrl-C while trials train between two checkpoints. How long from
SIGINT to a stopped stack, and how many iterations each trial's resume will train again.

The job (``airflow-trials run --keep-running``) runs ``--trials`` trials of a class trainable
(``tests.faults.trainables:JournaledClass``) that trains ``--sleep`` seconds per iteration and
checkpoints every ``--checkpoint-freq`` iterations. Once every trial has recorded
``--checkpoint-freq + 2`` results (past its first checkpoint, before its second), the script sends
SIGINT and times the job until it exits. It then reads, per trial, the last iteration the trial
trained (its journal) and the newest complete checkpoint in its storage, which the resume adopts
(``execution/resume.py``): the difference is the work re-run.

``--before`` also runs the job from an older checkout (its ``src`` first on ``PYTHONPATH``),
alternately with this one, and prints the ratio of the stop times. The 20-million-addition loop's
time is printed beside each figure: machines differ up to 2.5x.

    .venv/bin/python -m bench.graceful_stop                           # about 3 minutes
    git worktree add /tmp/before 8c950d7                              # before the drain
    .venv/bin/python -m bench.graceful_stop --before /tmp/before --rounds 2
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DAG_ID = "bench_graceful_stop"


def addition_loop_seconds() -> float:
    started = time.perf_counter()
    total = 0
    for i in range(20_000_000):
        total += i
    return time.perf_counter() - started


def _dag(journal: Path, args: argparse.Namespace) -> str:
    sys.path.insert(0, str(REPO))
    from tests.faults.conftest import experiment_dag_source

    return experiment_dag_source(
        DAG_ID,
        journal,
        trials=args.trials,
        iterations=10_000,
        sleep_s=args.sleep,
        hold_at=0,
        max_failures=0,
        trainable="tests.faults.trainables:JournaledClass",
        extra=f"checkpoint_freq={args.checkpoint_freq},",
    )


def _recorded_counts(db: Path) -> list[int]:
    from airflow_trials.exceptions import StoreError
    from airflow_trials.store import TrialStore

    if not db.exists():
        return []
    store = TrialStore(f"sqlite:///{db}")
    try:
        trials = store.reader.list_trials(experiment_name=DAG_ID)
        return [len(store.reader.get_results(t.trial_id)) for t in trials]
    except StoreError:
        return []
    finally:
        store.dispose()


def run_once(tree: Path, args: argparse.Namespace) -> tuple[float, dict[str, int]]:
    """SIGINT to exit (seconds), and the iterations each trial's resume re-runs."""
    from tests.faults.trainables import read_journal

    from airflow_trials.storage.trial_storage import TrialStorage

    home = Path(tempfile.mkdtemp(prefix="bench_graceful_stop_"))
    state, dags, journal = home / "state", home / "dags", home / "journal"
    for folder in (dags, journal):
        folder.mkdir(parents=True)
    (dags / f"{DAG_ID}.py").write_text(_dag(journal, args))
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tree / "src"), str(REPO)]),
        "COLUMNS": "200",
    }
    env.pop("RAY_ADDRESS", None)
    env.pop("AIRFLOW_TRIALS_DB_URL", None)
    log = home / "job.log"
    job = subprocess.Popen(
        [sys.executable, "-m", "airflow_trials.cli", "run", "--dag-id", DAG_ID]
        + ["--dags-folder", str(dags), "--state-dir", str(state), "--keep-running"]
        + ["--num-cpus", str(args.trials + 2), "--plot", str(home / "curves.png")],
        cwd=tree,
        env=env,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 600
        while True:
            counts = _recorded_counts(state / "trials.db")
            if len(counts) == args.trials and min(counts) >= args.checkpoint_freq + 2:
                break
            if job.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the job did not get going:\n{log.read_text()[-3000:]}")
            time.sleep(0.5)
        sent = time.monotonic()
        job.send_signal(signal.SIGINT)
        job.wait(timeout=600)
        stop_s = time.monotonic() - sent
    finally:
        if job.poll() is None:
            job.kill()
    storage = TrialStorage(str(state / "storage"))
    re_run = {}
    for path in sorted(journal.glob("*.jsonl")):
        trial_id = path.stem
        trained = max(i for inc in read_journal(journal, trial_id) for i in inc.iterations)
        saved = storage.saved_checkpoints(DAG_ID, trial_id)
        newest = max((int(meta["iteration"]) for _, meta in saved), default=0)
        re_run[trial_id] = trained - newest
    print(log.read_text().strip().splitlines()[-1] if log.exists() else "", flush=True)
    return stop_s, re_run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--before", type=Path, help="An older checkout, run alternately with this one."
    )
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--trials", type=int, default=2)
    parser.add_argument("--sleep", type=float, default=0.5, help="Seconds per iteration.")
    parser.add_argument("--checkpoint-freq", type=int, default=10)
    args = parser.parse_args()
    trees = {"before": args.before.resolve()} if args.before else {}
    trees["this"] = REPO
    stops: dict[str, list[float]] = {name: [] for name in trees}
    for round_ in range(1, args.rounds + 1):
        for name, tree in trees.items():
            loop = addition_loop_seconds()
            stop_s, re_run = run_once(tree, args)
            stops[name].append(stop_s)
            print(
                f"round {round_} {name} ({tree}): SIGINT to stopped {stop_s:.1f} s; iterations "
                f"re-run per trial {sorted(re_run.values())} (a checkpoint every "
                f"{args.checkpoint_freq} iterations of {args.sleep:g} s); 20M-addition loop "
                f"{loop:.2f} s",
                flush=True,
            )
    if args.before:
        ratio = statistics.median(stops["this"]) / statistics.median(stops["before"])
        print(f"SIGINT to stopped, this / before (medians): {ratio:.2f}")


if __name__ == "__main__":
    main()
