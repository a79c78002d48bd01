"""Benchmark: ``airflow-trials importances`` in a fresh process each call, as a shell runs it.

The run is the nightly example's (``dags/nightly_regression_tuning.py``): 8 trials of
``val_loss`` (min) over ``lr`` (loguniform), ``l2`` (a choice of 3) and a constant
``batch_size``, 20 results each, all TERMINATED, written to a temporary SQLite trials DB through
the store's write path (``record_progress``, ``record_end``) of the checkout timed (one DB per
series: each checkout's schema). Each call is ``python -m airflow_trials.cli importances ...
--db-url`` in a new process with an empty cache directory (``XDG_CACHE_HOME``) at the start of
the series, so the first call of a series computes and the others may read the cache. Beside
the figures, the time of a 20-million-addition Python loop in a fresh process, to compare
machines and loads.

``--before SRC`` times another checkout's ``src`` (``PYTHONPATH=SRC``, same venv) first, checks
that both print the same JSON, and prints ``after / before``. ``--env-url`` gives the URL in
``AIRFLOW_TRIALS_DB_URL`` instead, as a shell without ``--db-url`` finds it (through Airflow,
which the command then imports to look for the ``trials_default`` connection first)::

    git worktree add /tmp/imp_before <commit>
    .venv/bin/python -m bench.importances_cli --before /tmp/imp_before/src
    .venv/bin/python -m bench.importances_cli --before /tmp/imp_before/src --env-url
    git worktree remove /tmp/imp_before
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
EXPERIMENT = "nightly_regression_tuning"
LOOP = "s = 0\nfor i in range(20_000_000):\n    s += i\n"


def seed(url: str, trials: int) -> None:
    """Write the example's run to the trials DB at ``url``."""
    from airflow_trials.core.end import TrialEnd
    from airflow_trials.core.status import TrialStatus
    from airflow_trials.core.update import TrialUpdate
    from airflow_trials.store import TrialStore

    store = TrialStore(url, create=True)
    store.ensure_experiment(EXPERIMENT, metric="val_loss", mode="min")
    space = {"lr": {"loguniform": [0.01, 1.0]}, "l2": {"choice": [0.0, 0.001, 0.01]}}
    run = store.create_experiment_run(EXPERIMENT, "manual__1", search_space=space)
    rng = random.Random(3)
    for i in range(trials):
        trial_id = f"t-{i}"
        config = {"lr": 10 ** rng.uniform(-2, 0), "l2": rng.choice([0.0, 0.001, 0.01])}
        config["batch_size"] = 128
        store.upsert_trial(
            trial_id,
            trainable="airflow_trials.examples.regression:train",
            config=config,
            resources={"cpu": 0.5, "gpu": 0.25},
            max_failures=2,
            experiment_run_id=run,
        )
        results = [
            {"training_iteration": k, "val_loss": abs(math.log10(config["lr"]) + 1) + 1 / k}
            for k in range(1, 21)
        ]
        store.record_progress([TrialUpdate(trial_id, results=results)])
        store.record_end(TrialEnd(trial_id, EXPERIMENT, TrialStatus.TERMINATED, error=None), None)
    store.dispose()


def timed(command: list[str], env: dict[str, str]) -> tuple[float, str]:
    """Seconds ``command`` took, and its stdout; a failure ends the benchmark with its stderr."""
    started = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        sys.exit(f"{' '.join(command)} exited {done.returncode}: {done.stderr.strip()}")
    return seconds, done.stdout


def series(tmp: Path, args: argparse.Namespace, src: str | None) -> tuple[list[float], str]:
    """``args.calls`` fresh-process calls over one new trials DB, seeded by the same code, and one
    new cache directory: their seconds, and the JSON."""
    name = "before" if src else "after"
    url = f"sqlite:///{tmp / f'{name}.db'}"
    command = [sys.executable, "-m", "airflow_trials.cli", "importances", EXPERIMENT, "--json"]
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp / f"{name}-cache")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [src, str(REPO)]))
    if args.env_url:  # found as the DAGs find it: Airflow is imported to look for the connection
        env.update(AIRFLOW_TRIALS_DB_URL=url, AIRFLOW_HOME=str(tmp / f"{name}-airflow"))
    else:
        command += ["--db-url", url]
    seed_only = ["-m", "bench.importances_cli", "--seed", url, "--trials", str(args.trials)]
    timed([sys.executable, *seed_only], env)
    found = [timed(command, env) for _ in range(args.calls)]
    return [seconds for seconds, _ in found], found[0][1]


def show(name: str, seconds: list[float]) -> tuple[float, float]:
    """Print a series; its first call and the median of the others (of all, when only one)."""
    median = statistics.median(seconds[1:] or seconds)
    calls = " ".join(f"{s:.2f}" for s in seconds)
    print(f"{name:>7}: first {seconds[0]:.2f} s, median of the others {median:.2f} s ({calls})")
    return seconds[0], median


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=5, help="fresh processes per series")
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--before", help="another checkout's src directory, timed first")
    parser.add_argument(
        "--env-url",
        action="store_true",
        help="give the URL in AIRFLOW_TRIALS_DB_URL, not --db-url (the command imports Airflow)",
    )
    parser.add_argument("--seed", metavar="URL", help="only write the run to the trials DB at URL")
    args = parser.parse_args()
    if args.seed:
        seed(args.seed, args.trials)
        return
    with tempfile.TemporaryDirectory() as tmp:
        loop, _ = timed([sys.executable, "-c", LOOP], dict(os.environ))
        print(f"{args.trials} trials; 20M-addition loop in a fresh process: {loop:.2f} s")
        if args.before:
            before, before_json = series(Path(tmp), args, args.before)
            before_first, before_median = show("before", before)
        after, after_json = series(Path(tmp), args, None)
        after_first, after_median = show("after", after)
    if args.before:
        same = json.loads(before_json) == json.loads(after_json)
        print(
            f"after / before: first calls {after_first / before_first:.2f}, medians of the others "
            f"{after_median / before_median:.2f}; same JSON: {same}"
        )


if __name__ == "__main__":
    main()
