"""Benchmark: result ingest rate and leaderboard latency of the metadata store, SQLite and
PostgreSQL.

1. Ingest: 100,000 results through ``TrialStore.record_progress`` (one trial's ``TrialUpdate``
   a call, as a trial's poller writes it) in batches of 500 (20 trials x
   5,000 iterations, the experiment's metric index in place). Target: >= 5,000 results/s.
2. Leaderboard: 10,000 trials x 100 results (1M rows, bulk-loaded) in one experiment run,
   ``TrialReader.leaderboard(run, "loss", mode)``, median of several runs. Target: every ranking
   (the experiment's mode, another mode, ``limit=10``) < 100 ms; a line over it says OVER BUDGET.

    .venv/bin/python -m bench.store_ingest                      # SQLite only
    .venv/bin/python -m bench.store_ingest --postgres-url postgresql+psycopg://postgres@127.0.0.1:5432/test
    .venv/bin/python -m bench.store_ingest --check      # exit 1 when a figure misses its target

``--check`` is what a change to the store runs before it is merged (docs/benchmarks.md): it exits
with status 1, naming each figure over its budget, so a slower ranking cannot pass unseen. The
timed budget lives here, not in a test: a test may not race the clock on a loaded CI machine. The
test suite guards the same rankings by their query plans instead (tests/contract/test_store.py,
``test_leaderboard_reads_results_through_indexes_and_checkpoints_once``).

PostgreSQL runs in a fresh schema (dropped at the end), so any database the user may write to works.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import insert

from airflow_trials.core.update import KeptCheckpoint, TrialUpdate
from airflow_trials.store import TrialStore
from airflow_trials.store.models import TrialRow, utcnow

INGEST_TARGET_PER_S = 5_000.0
LEADERBOARD_TARGET_MS = 100.0


def _result(trial_index: int, iteration: int, rng: random.Random) -> dict[str, Any]:
    """A result shaped like what the engine reports: a few metrics plus the automatic fields."""
    loss = 1.0 / iteration + rng.random() * 0.1 + trial_index * 1e-6
    return {
        "training_iteration": iteration,
        "loss": loss,
        "accuracy": 1.0 - loss / 2,
        "timestamp": 1_700_000_000.0 + iteration,
        "time_this_iter_s": 0.05,
        "time_total_s": 0.05 * iteration,
        "done": False,
        "trial_id": f"t{trial_index}",
        "hostname": "bench-host",
        "pid": 4242,
    }


def _register_trials(store: TrialStore, run_id: int, trial_ids: list[str]) -> None:
    """One bulk INSERT for all trials (upsert_trial one by one would dominate the fixture time)."""
    now = utcnow()
    rows = [
        {
            "trial_id": trial_id,
            "experiment_run_id": run_id,
            "trainable": "bench:trainable",
            "config": {"lr": 10 ** -(i % 5), "layers": i % 7},
            "resources": {"cpu": 1},
            "status": "TERMINATED",
            "num_failures": 0,
            "max_failures": 0,
            "created_at": now,
            "updated_at": now,
        }
        for i, trial_id in enumerate(trial_ids)
    ]
    with store._engine.begin() as connection:
        for start in range(0, len(rows), 2_000):
            connection.execute(insert(TrialRow), rows[start : start + 2_000])


def bench_ingest(url: str, num_results: int, batch_size: int, num_trials: int) -> float:
    store = TrialStore(url, create=True)
    try:
        store.ensure_experiment("bench-ingest", metric="loss", mode="min")
        run_id = store.create_experiment_run("bench-ingest", f"ingest-{uuid.uuid4().hex[:8]}")
        trial_ids = [f"ingest-{uuid.uuid4().hex[:8]}-{i}" for i in range(num_trials)]
        for trial_id in trial_ids:
            store.upsert_trial(
                trial_id,
                trainable="bench:trainable",
                config={},
                resources={"cpu": 1},
                max_failures=0,
                experiment_run_id=run_id,
            )
        rng = random.Random(0)
        per_trial = num_results // num_trials
        batches = [
            (
                trial_id,
                [
                    _result(t, it, rng)
                    for it in range(start + 1, min(start + batch_size, per_trial) + 1)
                ],
            )
            for start in range(0, per_trial, batch_size)
            for t, trial_id in enumerate(trial_ids)
        ]
        begin = time.perf_counter()
        stored = sum(
            store.record_progress([TrialUpdate(trial_id, results=batch)])
            for trial_id, batch in batches
        )
        elapsed = time.perf_counter() - begin
        if stored != per_trial * num_trials:
            raise SystemExit(f"ingest stored {stored} results, expected {per_trial * num_trials}")
        return stored / elapsed
    finally:
        store.dispose()


def _result_rows(trial_ids: list[str], iterations: int) -> Iterator[tuple[str, int, float, str]]:
    rng = random.Random(1)
    for t, trial_id in enumerate(trial_ids):
        for it in range(1, iterations + 1):
            result = _result(t, it, rng)
            if t % 50 == 0:
                del result["loss"]  # some trials never report the metric: they rank last
            yield trial_id, it, result["timestamp"], json.dumps(result)


def bulk_load_results(store: TrialStore, trial_ids: list[str], iterations: int) -> None:
    """Load the leaderboard fixture with the driver's fastest path: COPY or executemany."""
    raw = store._engine.raw_connection()
    try:
        cursor = raw.cursor()
        if store._engine.dialect.name == "postgresql":
            with cursor.copy(  # type: ignore[attr-defined]
                "COPY at_results (trial_id, iteration, timestamp, metrics) FROM STDIN"
            ) as copy:
                for row in _result_rows(trial_ids, iterations):
                    copy.write_row(row)
            cursor.execute("ANALYZE at_results")
            cursor.execute("ANALYZE at_trials")
        else:
            cursor.execute("BEGIN IMMEDIATE")
            cursor.executemany(
                "INSERT INTO at_results (trial_id, iteration, timestamp, metrics) VALUES (?, ?, ?, "
                "?)",
                _result_rows(trial_ids, iterations),
            )
            cursor.execute("COMMIT")
            cursor.execute("ANALYZE")
        raw.commit()
    finally:
        raw.close()


def bench_leaderboard(url: str, num_trials: int, iterations: int, repeats: int) -> dict[str, float]:
    store = TrialStore(url, create=True)
    try:
        store.ensure_experiment("bench-leaderboard", metric="loss", mode="min")
        run_id = store.create_experiment_run("bench-leaderboard", f"lb-{uuid.uuid4().hex[:8]}")
        trial_ids = [f"lb-{i:05d}" for i in range(num_trials)]
        begin = time.perf_counter()
        _register_trials(store, run_id, trial_ids)
        bulk_load_results(store, trial_ids, iterations)
        load_s = time.perf_counter() - begin
        # The bulk load bypasses record_progress, which keeps each trial's best up to date; bring
        # the maintained bests to where record_progress would have left them.
        begin = time.perf_counter()
        store.recompute_best(run_id)
        recompute_s = time.perf_counter() - begin
        store.record_progress(
            [
                TrialUpdate(t, kept_checkpoints=[KeptCheckpoint(f"/ckpt/{t}/50", 50)])
                for t in trial_ids[::10]
            ]
        )
        figures = {"load_s": load_s, "recompute_s": recompute_s}
        for mode in ("min", "max"):
            rows = store.reader.leaderboard(run_id, "loss", mode)  # warm-up, and a sanity check
            if (
                len(rows) != num_trials
                or rows[-1].best_value is not None
                or rows[0].best_value is None
            ):
                raise SystemExit(f"leaderboard returned an unexpected ranking ({len(rows)} rows)")
            timings = []
            for _ in range(repeats):
                begin = time.perf_counter()
                store.reader.leaderboard(run_id, "loss", mode)
                timings.append((time.perf_counter() - begin) * 1000)
            figures[f"{mode}_ms"] = statistics.median(timings)
        timings = []
        for _ in range(repeats):
            begin = time.perf_counter()
            store.reader.leaderboard(run_id, "loss", "min", limit=10)
            timings.append((time.perf_counter() - begin) * 1000)
        figures["top10_ms"] = statistics.median(timings)
        return figures
    finally:
        store.dispose()


def _postgres_schema_url(url: str, schema: str) -> str:
    separator = "&" if "?" in url else "?"
    return f"{url}{separator}options=-csearch_path%3D{schema}"


@contextmanager
def fresh_postgres_schema(url: str) -> Iterator[str]:
    """A URL whose connections work in a new schema, dropped with everything in it at the end."""
    from sqlalchemy import create_engine, text

    schema = f"bench_{uuid.uuid4().hex[:8]}"
    admin = create_engine(url)
    with admin.begin() as connection:
        connection.execute(text(f'CREATE SCHEMA "{schema}"'))
    try:
        yield _postgres_schema_url(url, schema)
    finally:
        with admin.begin() as connection:
            connection.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


def _verdict(ms: float) -> str:
    return "" if ms < LEADERBOARD_TARGET_MS else "  OVER BUDGET"


def run_backend(name: str, url: str, args: argparse.Namespace) -> list[str]:
    """Runs both benchmarks on one backend, prints their figures; returns the figures that miss
    their targets."""
    missed = []
    if not args.skip_ingest:
        rate = bench_ingest(url, args.results, args.batch_size, args.ingest_trials)
        low = rate < INGEST_TARGET_PER_S
        print(
            f"[{name}] ingest: {rate:,.0f} results/s  (target >= {INGEST_TARGET_PER_S:,.0f}/s, "
            f"ratio {rate / INGEST_TARGET_PER_S:.2f}x){'  UNDER TARGET' if low else ''}",
            flush=True,
        )
        if low:
            missed.append(f"[{name}] ingest {rate:,.0f} results/s < {INGEST_TARGET_PER_S:,.0f}/s")
    lb = bench_leaderboard(url, args.trials, args.iterations, args.repeats)
    print(
        f"[{name}] leaderboard fixture: {args.trials:,} trials x {args.iterations} results "
        f"loaded in {lb['load_s']:.1f} s",
        flush=True,
    )
    print(f"[{name}] recompute_best over the fixture: {lb['recompute_s']:.1f} s", flush=True)
    for mode, how in (
        ("min", "the experiment's metric and mode: maintained bests"),
        ("max", "the other mode of the experiment's metric: maintained bests too"),
    ):
        ms = lb[f"{mode}_ms"]
        print(
            f"[{name}] leaderboard mode={mode} ({how}): median {ms:.1f} ms over {args.repeats} "
            "runs  "
            f"(target < {LEADERBOARD_TARGET_MS:.0f} ms, ratio {ms / LEADERBOARD_TARGET_MS:.2f} of "
            f"target){_verdict(ms)}",
            flush=True,
        )
        if _verdict(ms):
            missed.append(f"[{name}] leaderboard mode={mode}: {ms:.1f} ms")
    ms = lb["top10_ms"]
    print(
        f"[{name}] leaderboard limit=10: median {ms:.1f} ms over {args.repeats} runs  (target < "
        f"{LEADERBOARD_TARGET_MS:.0f} ms){_verdict(ms)}",
        flush=True,
    )
    if _verdict(ms):
        missed.append(f"[{name}] leaderboard limit=10: {ms:.1f} ms")
    return missed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--postgres-url", default=os.environ.get("AIRFLOW_TRIALS_TEST_POSTGRES_URL")
    )
    parser.add_argument("--results", type=int, default=100_000)
    parser.add_argument("--batch-size", type=int, default=500)
    parser.add_argument("--ingest-trials", type=int, default=20)
    parser.add_argument("--trials", type=int, default=10_000)
    parser.add_argument("--iterations", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--skip-sqlite", action="store_true")
    parser.add_argument("--skip-ingest", action="store_true", help="the leaderboard only")
    parser.add_argument(
        "--check",
        action="store_true",
        help="exit with status 1 when a figure misses its target (each one named)",
    )
    args = parser.parse_args()
    total = time.perf_counter()
    missed: list[str] = []

    if not args.skip_sqlite:
        with tempfile.TemporaryDirectory(prefix="bench_store_") as tmp:
            missed += run_backend("sqlite", f"sqlite:///{os.path.join(tmp, 'trials.db')}", args)

    if args.postgres_url:
        with fresh_postgres_schema(args.postgres_url) as url:
            missed += run_backend("postgresql", url, args)
    else:
        print("[postgresql] skipped: pass --postgres-url or set AIRFLOW_TRIALS_TEST_POSTGRES_URL")
    print(f"total {time.perf_counter() - total:.0f} s")
    if args.check:
        if missed:
            print(
                f"check failed: {len(missed)} figure(s) over budget: {'; '.join(missed)}. Profile "
                "the ranking's queries (docs/benchmarks.md, 'Trials store') before merging.",
                file=sys.stderr,
            )
            raise SystemExit(1)
        print("check passed: every figure within its target")


if __name__ == "__main__":
    main()
