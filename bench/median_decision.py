"""Benchmark: the cost of one median-stopping-rule decision from the trials store
(``SchedulerState.record_median_point`` within ``record_progress``), against Optuna's own RDB
``MedianPruner``.

A run of N trials x R results under the median rule (grace_period 1, time_attr
training_iteration) keeps one row per trial and result: N * R rows, the running sum of each
trial's metric. The fixture bulk-loads them; then ``record_median_point`` is timed for new trials
at time 1 and at time R, where every one of the N trials has a running mean (the median of N means
is the most a decision ever reads: one index probe per other trial, never their results).

The anchor, on the same work in the same run and backend: Optuna 5's
``MedianPruner(n_startup_trials=0,
n_warmup_steps=0)`` on an ``RDBStorage`` study holding the same N trials with R intermediate values
each; one decision is ``trial.report(value, step); trial.should_prune()`` for a new trial. Optuna
reads every trial's intermediate values per decision. Loading its fixture through
``study.add_trials`` is slow, so the anchor runs at ``--optuna-trials`` (default 1,000) and ours
runs at that N too, for the ratio.

    .venv/bin/python -m bench.median_decision --postgres-url postgresql+psycopg://postgres@127.0.0.1:5432/test
    .venv/bin/python -m bench.median_decision --trials 1000 --no-optuna   # a quick look
"""

from __future__ import annotations

import argparse
import functools
import os
import random
import statistics
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager

import optuna
from sqlalchemy import insert

from airflow_trials.core.scheduler import Decision
from airflow_trials.schedulers.median.median_rule import MedianRule
from airflow_trials.schedulers.median.median_stopping import MeanSample
from airflow_trials.store import TrialStore
from airflow_trials.store.models import TrialMedianPointRow, utcnow
from airflow_trials.store.scheduler_state import judge_alone
from bench.store_ingest import _register_trials, fresh_postgres_schema

TARGET_MS = 5.0
RULE = MedianRule(
    metric="loss",
    mode="min",
    time_attr="training_iteration",
    grace_period=1,
    min_samples_required=3,
)


def curve(trial: int, results: int) -> list[float]:
    rng = random.Random(trial)
    level = rng.uniform(0.5, 2.0)
    return [level / step + rng.gauss(0, 0.01) for step in range(1, results + 1)]


def load_fixture(store: TrialStore, num_trials: int, results: int, decisions: int) -> int:
    """N trials with R points each, then ``decisions`` trials with R - 1 (each decided at time R)
    and ``decisions`` with none (each decided at time 1)."""
    run = store.create_experiment_run("bench-median", f"n{num_trials}")
    _register_trials(store, run, [f"t{i}" for i in range(num_trials + 2 * decisions)])
    now, rows = utcnow(), []
    for i in range(num_trials + decisions):
        total = 0.0
        for step, value in enumerate(curve(i, results if i < num_trials else results - 1), start=1):
            total += value
            rows.append(
                {
                    "experiment_run_id": run,
                    "trial_id": f"t{i}",
                    "seq": step,
                    "time": float(step),
                    "prev_time": float(step - 1) if step > 1 else None,
                    "gap": False,
                    "iteration": step,
                    "at_end": False,
                    "total": total,
                    "mean": total / step,
                    "superseded": False,
                    "decision": "CONTINUE",
                    "reason": None,
                    "created_at": now,
                }
            )
    with store._engine.begin() as connection:
        for start in range(0, len(rows), 10_000):
            connection.execute(insert(TrialMedianPointRow), rows[start : start + 10_000])
    if store._engine.dialect.name == "postgresql":
        with store._engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
            connection.exec_driver_sql(
                "VACUUM ANALYZE at_trial_median_points"
            )  # as autovacuum would
    return run


def _counted(samples: list[int], time: float, means: MeanSample) -> tuple[Decision, str | None]:
    """RULE's verdict for a best of 1.0, noting how many means it saw."""
    samples.append(means.count)
    return RULE.verdict(1.0, time, means)


def time_ours(url: str, num_trials: int, results: int, decisions: int) -> dict[int, float]:
    """Median milliseconds per ``record_median_point`` at time 1 and at time ``results``."""
    store = TrialStore(url, create=True)
    try:
        begin = time.perf_counter()
        run = load_fixture(store, num_trials, results, decisions)
        print(
            f"  fixture: {num_trials:,} trials x {results} results = {num_trials * results:,} "
            "rows, "
            f"loaded in {time.perf_counter() - begin:.1f} s",
            flush=True,
        )
        medians, samples = {}, []
        for step, first in ((results, num_trials), (1, num_trials + decisions)):
            timings = []
            for trial_id in (f"t{i}" for i in range(first, first + decisions)):
                begin = time.perf_counter()
                # A decision as production writes it: within a record_progress of its trial.
                judge_alone(
                    store,
                    trial_id,
                    lambda state, trial_id=trial_id, step=step: state.record_median_point(
                        run,
                        trial_id,
                        iteration=step,
                        time=step,
                        value=1.0,
                        decide=functools.partial(_counted, samples, float(step)),
                    ),
                )
                timings.append((time.perf_counter() - begin) * 1000)
            # Every decision compared with the means of all N trials (and of the new ones before it
            # at time 1).
            assert min(samples) >= num_trials, (step, min(samples))
            samples.clear()
            medians[step] = statistics.median(timings)
        return medians
    finally:
        store.dispose()


def time_optuna(url: str, num_trials: int, results: int, decisions: int) -> dict[int, float]:
    storage = optuna.storages.RDBStorage(url)
    try:
        study = optuna.create_study(
            storage=storage,
            direction="minimize",
            pruner=optuna.pruners.MedianPruner(n_startup_trials=0, n_warmup_steps=0),
        )
        dist = {"x": optuna.distributions.FloatDistribution(0, 1)}
        begin = time.perf_counter()
        study.add_trials(
            [
                optuna.trial.create_trial(
                    params={"x": 0.5},
                    distributions=dist,
                    value=values[-1],
                    intermediate_values=dict(enumerate(values, start=1)),
                )
                for values in (curve(i, results) for i in range(num_trials))
            ]
        )
        print(
            f"  optuna fixture: {num_trials:,} trials x {results} values, loaded in "
            f"{time.perf_counter() - begin:.1f} s",
            flush=True,
        )
        medians = {}
        for step in (results, 1):
            timings = []
            for _ in range(decisions):
                trial = study.ask()
                begin = time.perf_counter()
                trial.report(1.0, step)
                trial.should_prune()
                timings.append((time.perf_counter() - begin) * 1000)
                study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            medians[step] = statistics.median(timings)
        return medians
    finally:
        storage.remove_session()
        storage.engine.dispose()


@contextmanager
def backend_url(name: str, postgres_url: str | None, file_name: str) -> Iterator[str]:
    if name == "postgresql":
        assert postgres_url is not None
        with fresh_postgres_schema(postgres_url) as url:
            yield url
    else:
        with tempfile.TemporaryDirectory(prefix="bench_median_") as tmp:
            yield f"sqlite:///{os.path.join(tmp, file_name)}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--postgres-url", default=os.environ.get("AIRFLOW_TRIALS_TEST_POSTGRES_URL")
    )
    parser.add_argument("--trials", type=int, default=10_000, help="N, the trials of the run")
    parser.add_argument("--results", type=int, default=100, help="R, results per trial")
    parser.add_argument(
        "--decisions", type=int, default=50, help="timed decisions at each of the two times"
    )
    parser.add_argument(
        "--optuna-trials", type=int, default=1_000, help="N for the side-by-side run with Optuna"
    )
    parser.add_argument("--no-optuna", action="store_true")
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    backends = ["sqlite"] + (["postgresql"] if args.postgres_url else [])
    for name in backends:
        print(f"[{name}] ours at N = {args.trials:,}:", flush=True)
        with backend_url(name, args.postgres_url, "ours.db") as url:
            ours = time_ours(url, args.trials, args.results, args.decisions)
        for step, median in ours.items():
            print(
                f"[{name}] record_median_point at time {step}: median {median:.2f} ms per decision "
                f"(target <= {TARGET_MS:.0f} ms, ratio {median / TARGET_MS:.2f})",
                flush=True,
            )
        if args.no_optuna:
            continue
        n = args.optuna_trials
        print(f"[{name}] side by side at N = {n:,}:", flush=True)
        with backend_url(name, args.postgres_url, "ours_small.db") as url:
            small = time_ours(url, n, args.results, args.decisions)
        with backend_url(name, args.postgres_url, "optuna.db") as url:
            theirs = time_optuna(url, n, args.results, args.decisions)
        for step in small:
            print(
                f"[{name}] time {step}: ours {small[step]:.2f} ms, optuna MedianPruner "
                f"{theirs[step]:.2f} ms, "
                f"ours / optuna = {small[step] / theirs[step]:.3f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
