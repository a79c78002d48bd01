"""Benchmark: server time of the dashboard's leaderboard page at 10,000 trials x 100 results, and
of the experiment page's history at 365 nightly runs x 1,000 trials.

The trials DB (SQLite file) holds one experiment run of 10,000 trials with 100 results each
(bulk-loaded as in bench/store_ingest.py, bests brought up to date with ``recompute_best``) and
a checkpoint for every tenth trial. Each request goes through the whole server path in process:
Airflow's JWT check (SimpleAuthManager, a temporary AIRFLOW_HOME), the per-DAG authorisation,
the page ranked, sorted and sliced in SQL (``TrialReader.ranked_page``), its checkpoints, the
SVG chart and the template. Target: < 100 ms for the run page. Median of several requests after
a warm-up.

    .venv/bin/python -m bench.dashboard_render                       # SQLite file
    .venv/bin/python -m bench.dashboard_render --postgres-url postgresql+psycopg://postgres@127.0.0.1:5432/test
    .venv/bin/python -m bench.dashboard_render --trials 1000 --repeats 5   # quicker
    .venv/bin/python -m bench.dashboard_render --case leaderboard --trials 100000 --iterations 1
                                                    # a 100,000-trial sweep's run (issue 33)

The leaderboard case then times every other route that shows the run's trials (the other mode,
the parallel coordinates, the decisions, the importances, the experiment's pages, the trial page)
and the boards of a run of two metrics of the same size beside it (a 409 past the dashboard's
cap), against 200 ms (issue 53, item 2), and ``airflow-trials leaderboard --limit 50`` (table and
``--json``) in process and as a subprocess (``bench/_board_cases.py``).

Before the pages, it times the store's leaderboard top 50 alone (``TrialReader.leaderboard(run,
"loss", "min", limit=50)``), the query a run page's first rows need.

The history case (``--case history``) fills one experiment with 365 nightly runs of 1,000 trials
each (bulk INSERTs, each trial's best maintained), ends each run through
``TrialStore.finish_experiment_run`` (which stores its history line, as select_best's end of a
run does), and times the experiment page, whose history table and trend chart cover every run,
and the JSON history. Target: < 200 ms. ``--history-without-summaries`` forgets the stored lines
first, as for runs that ended before migration 0013: every line is computed from the trials.

    .venv/bin/python -m bench.dashboard_render --case history
    .venv/bin/python -m bench.dashboard_render --case history --postgres-url postgresql+psycopg://postgres@127.0.0.1:5432/test
    .venv/bin/python -m bench.dashboard_render --case history --history-without-summaries

PostgreSQL runs in a fresh schema, dropped at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from airflow_trials.core.fate import TRAINABLE_FINISHED
from bench._board_cases import board_cases, fill_pareto, median_ms, time_cli

TARGET_MS = 100.0
# Every board of a 100,000-trial run, and the CLI's leaderboard (issue 53, item 2).
BOARD_TARGET_MS = 200.0


def _prepare_airflow_home(home: Path) -> None:
    """A migrated Airflow home with SimpleAuthManager; set before Airflow is first imported."""
    passwords = home / "passwords.json"
    home.mkdir(parents=True, exist_ok=True)
    passwords.write_text(json.dumps({"admin": "bench"}))
    os.environ.update(
        {
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__AUTH_MANAGER": (
                "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager"
            ),
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:viewer",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords),
            "AIRFLOW__API_AUTH__JWT_SECRET": "bench-" + "s" * 64,
        }
    )
    subprocess.run(
        [str(Path(sys.executable).with_name("airflow")), "db", "migrate"],
        check=True,
        capture_output=True,
        env=os.environ.copy(),
        timeout=600,
    )


def _fill(url: str, num_trials: int, iterations: int) -> int:
    from airflow_trials.core.update import KeptCheckpoint, TrialUpdate
    from airflow_trials.store import TrialStore
    from bench.store_ingest import _register_trials, bulk_load_results

    store = TrialStore(url, create=True)
    try:
        store.ensure_experiment("bench-dashboard", metric="loss", mode="min")
        run = store.create_experiment_run(
            "bench-dashboard", "bench-run", dag_id="bench_dag", run_id="bench-run"
        )
        trial_ids = [f"lb-{i:05d}" for i in range(num_trials)]
        _register_trials(store, run, trial_ids)
        bulk_load_results(store, trial_ids, iterations)
        store.recompute_best(run)
        store.record_progress(
            [
                TrialUpdate(t, kept_checkpoints=[KeptCheckpoint(f"/ckpt/{t}/50", 50)])
                for t in trial_ids[::10]
            ]
        )
        return run
    finally:
        store.dispose()


HISTORY_EXPERIMENT = "bench-history"
HISTORY_TARGET_MS = 200.0


def _history_trial_rows(run_pks: list[int], trials_per_run: int) -> Iterator[dict[str, Any]]:
    """Nightly runs' trials as a sweep leaves them: bests maintained, an ASHA mix of completed and
    early-stopped trials (each stop reason its own text), a few errors, 3 warm-started seeds."""
    rng = random.Random(7)
    base = datetime(2025, 1, 1, 2, tzinfo=UTC)
    for night, run_pk in enumerate(run_pks):
        created = base + timedelta(days=night)
        for i in range(trials_per_run):
            loss = round(0.05 + rng.random() + 0.2 / (night + 1), 6)
            status, reason, failures = "TERMINATED", TRAINABLE_FINISHED, 0
            if i % 97 == 0:
                status, reason, failures = "ERROR", None, 2
            elif i % 3:
                reason = (
                    f"stopped by ASHA at training_iteration={1 + i % 9} (rung 1 of 4): "
                    f"loss={loss} is worse than the cutoff {loss / 2:.6f} of {i} trials"
                )
            warm = None
            if night and i < 3:
                warm = {
                    "run_key": f"nightly-{night - 1:03d}",
                    "experiment_run_id": run_pks[night - 1],
                    "trial_id": f"h-{night - 1:03d}-{i:04d}",
                    "value": loss,
                    "checkpoint": None,
                }
            last = {"loss": loss, "training_iteration": 10, "timestamp": created.timestamp()}
            yield {
                "trial_id": f"h-{night:03d}-{i:04d}",
                "experiment_run_id": run_pk,
                "trainable": "bench:trainable",
                "config": {
                    "lr": 10 ** -(1 + rng.randrange(5)),
                    "layers": rng.randrange(1, 8),
                    "optimizer": rng.choice(["adam", "sgd"]),
                },
                "resources": {"cpu": 1},
                "status": status,
                "num_failures": failures,
                "max_failures": 3,
                "stop_reason": reason,
                "last_result": None if status == "ERROR" else last,
                "warm_start": warm,
                # An errored trial that never reported has no maintained best, as record_progress
                # leaves it.
                "best_metric": None if status == "ERROR" else "loss",
                "best_mode": None if status == "ERROR" else "min",
                "best_value": None if status == "ERROR" else loss,
                "best_iteration": None if status == "ERROR" else 10,
                "created_at": created,
                "updated_at": created,
                "ended_at": created,
            }


def _fill_history(url: str, num_runs: int, trials_per_run: int, summaries: bool) -> None:
    """``num_runs`` nightly runs of ``trials_per_run`` trials each, in bulk INSERTs of 5,000 rows
    (each trial's best maintained, as ``record_progress`` leaves it; its one stored result is its
    last), each run then ended through ``finish_experiment_run``; with ``summaries`` False their
    stored history lines are forgotten again."""
    from sqlalchemy import insert, text, update

    from airflow_trials.store import TrialStore
    from airflow_trials.store.models import ExperimentRunRow, ResultRow, TrialRow

    store = TrialStore(url, create=True)
    try:
        store.ensure_experiment(HISTORY_EXPERIMENT, metric="loss", mode="min")
        experiment_id = store.reader.get_experiment(HISTORY_EXPERIMENT).id
        base = datetime(2025, 1, 1, 2, tzinfo=UTC)
        engine = store._engine
        with engine.begin() as connection:
            connection.execute(
                insert(ExperimentRunRow),
                [
                    {
                        "experiment_id": experiment_id,
                        "run_key": f"nightly-{night:03d}",
                        "dag_id": "bench_dag",
                        "run_id": f"scheduled__{(base + timedelta(days=night)).date()}",
                        "status": "RUNNING",
                        "created_at": base + timedelta(days=night),
                    }
                    for night in range(num_runs)
                ],
            )
            run_pks = list(
                connection.execute(
                    text(
                        "SELECT id FROM at_experiment_runs WHERE experiment_id = :e "
                        "ORDER BY created_at"
                    ),
                    {"e": experiment_id},
                ).scalars()
            )
            batch: list[dict[str, Any]] = []
            for row in _history_trial_rows(run_pks, trials_per_run):
                batch.append(row)
                if len(batch) == 5_000:
                    _insert_trials(connection, batch, insert(TrialRow), insert(ResultRow))
                    batch = []
            if batch:
                _insert_trials(connection, batch, insert(TrialRow), insert(ResultRow))
        # Each run ends as select_best ends it, which stores its history line; then its end time
        # is set to its night's (a bench cannot wait for nights to pass).
        for run_pk in run_pks:
            store.finish_experiment_run(run_pk, "SUCCESS")
        with engine.begin() as connection:
            for night, run_pk in enumerate(run_pks):
                ended = {"ended_at": base + timedelta(days=night, hours=3)}
                if not summaries:
                    ended["summary"] = None
                connection.execute(
                    update(ExperimentRunRow).where(ExperimentRunRow.id == run_pk).values(**ended)
                )
        # VACUUM too on PostgreSQL, as autovacuum would after a night's writes: an index-only
        # scan reads the heap for every page the visibility map does not mark all-visible.
        analyze = "VACUUM ANALYZE" if engine.dialect.name == "postgresql" else "ANALYZE"
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
            connection.execute(text(analyze))
    finally:
        store.dispose()


def _insert_trials(connection: Any, rows: list[dict[str, Any]], trials: Any, results: Any) -> None:
    connection.execute(trials, rows)
    stored = [
        {
            "trial_id": row["trial_id"],
            "iteration": 10,
            "timestamp": row["last_result"]["timestamp"],
            "metrics": row["last_result"],
        }
        for row in rows
        if row["last_result"] is not None
    ]
    connection.execute(results, stored)


def run_history(name: str, url: str, args: argparse.Namespace) -> None:
    """The experiment page (history of every run) and the history API of ``--history-runs``
    nightly runs of ``--history-trials`` trials."""
    from airflow.api_fastapi.app import init_auth_manager
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from airflow_trials.plugins.app import create_app
    from airflow_trials.store import TrialReader

    begin = time.perf_counter()
    summaries = not args.history_without_summaries
    _fill_history(url, args.history_runs, args.history_trials, summaries)
    print(
        f"[{name}] history fixture: {args.history_runs:,} runs x {args.history_trials:,} trials "
        f"loaded and ended in {time.perf_counter() - begin:.1f} s; history lines "
        f"{'stored' if summaries else 'forgotten (every line computed from the trials)'}",
        flush=True,
    )
    store = TrialReader(url)
    begin = time.perf_counter()
    found = store.experiment_history(HISTORY_EXPERIMENT)
    if len(found.runs) != args.history_runs or any(
        line.num_trials != args.history_trials for line in found.runs
    ):
        raise SystemExit(f"The history read {len(found.runs)} runs, not the fixture's.")
    print(
        f"[{name}] store read alone (TrialReader.experiment_history, first call): "
        f"{(time.perf_counter() - begin) * 1000:.1f} ms",
        flush=True,
    )
    root = FastAPI()
    init_auth_manager(root)
    root.mount("/trials", create_app(lambda: store))
    page = f"/trials/experiments/{HISTORY_EXPERIMENT}"
    cases = [
        (
            "experiment page (trend chart of every run, table of the newest 60)",
            page,
            'class="history-row',
        ),
        ("experiment page, last 30 runs", f"{page}?last=30", 'class="history-row'),
        ("experiment page, every run in the table", f"{page}?last=365", 'class="history-row'),
        (
            "JSON history, every run",
            f"/trials/api/experiments/{HISTORY_EXPERIMENT}/history",
            '"runs"',
        ),
        (
            "JSON history, last 30 runs",
            f"/trials/api/experiments/{HISTORY_EXPERIMENT}/history?last=30",
            '"runs"',
        ),
    ]
    try:
        with TestClient(root) as client:
            token = client.post(
                "/auth/token", json={"username": "admin", "password": "bench"}
            ).json()["access_token"]
            headers = {"Authorization": f"Bearer {token}"}
            for label, path, needle in cases:
                ms = median_ms(client, path, headers, args.repeats, needle, 200)
                print(
                    f"[{name}] {label}: median {ms:.1f} ms over {args.repeats} requests  "
                    f"(target < {HISTORY_TARGET_MS:.0f} ms, ratio {ms / HISTORY_TARGET_MS:.2f} "
                    "of target)",
                    flush=True,
                )
    finally:
        store.dispose()


def run_backend(name: str, url: str, args: argparse.Namespace) -> None:
    from airflow.api_fastapi.app import init_auth_manager
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from airflow_trials.plugins.app import create_app
    from airflow_trials.store import TrialReader

    begin = time.perf_counter()
    run = _fill(url, args.trials, args.iterations)
    print(
        f"[{name}] fixture: {args.trials:,} trials x {args.iterations} results loaded in "
        f"{time.perf_counter() - begin:.1f} s",
        flush=True,
    )
    store = TrialReader(url)
    timings = []
    for _ in range(args.repeats + 1):  # the first is a warm-up
        begin = time.perf_counter()
        top = store.leaderboard(run, "loss", "min", limit=50)
        timings.append((time.perf_counter() - begin) * 1000)
    if len(top) != min(50, args.trials):
        raise SystemExit(f"The leaderboard's top 50 had {len(top)} rows.")
    ms = statistics.median(timings[1:])
    print(
        f"[{name}] store leaderboard, top 50 (TrialReader.leaderboard(limit=50)): median "
        f"{ms:.1f} ms over {args.repeats} calls  (target < {TARGET_MS:.0f} ms)",
        flush=True,
    )
    root = FastAPI()
    init_auth_manager(root)
    root.mount("/trials", create_app(lambda: store))
    last = -(-args.trials // 50)
    cases = [
        (
            "run page (leaderboard page 1 of 50 rows + chart of the best 20)",
            f"/trials/runs/{run}",
            'class="trial-row',
        ),
        (f"run page, last page ({last})", f"/trials/runs/{run}?page={last}", 'class="trial-row'),
        (
            "run page sorted by trial id, descending",
            f"/trials/runs/{run}?sort=trial_id&order=desc",
            'class="trial-row',
        ),
        ("run page, 200 rows per page", f"/trials/runs/{run}?page_size=200", 'class="trial-row'),
        ("JSON leaderboard, page 1", f"/trials/api/runs/{run}/leaderboard", '"rows"'),
        ("learning-curves page (best 20)", f"/trials/runs/{run}/curves", "<polyline"),
    ]
    # Every other board of the run, and a run of two metrics beside it (issue 53, item 2).
    others = board_cases(run, fill_pareto(url, args.trials), args.trials)
    try:
        with TestClient(root) as client:
            token = client.post(
                "/auth/token", json={"username": "admin", "password": "bench"}
            ).json()["access_token"]
            headers = {"Authorization": f"Bearer {token}"}
            for label, path, needle, code in [(*case, 200) for case in cases] + others:
                ms = median_ms(client, path, headers, args.repeats, needle, code)
                print(
                    f"[{name}] {label}{'' if code == 200 else f' ({code})'}: median {ms:.1f} ms "
                    f"over {args.repeats} requests  (target < {BOARD_TARGET_MS:.0f} ms, ratio "
                    f"{ms / BOARD_TARGET_MS:.2f} of target)",
                    flush=True,
                )
        time_cli(name, url, args.repeats, BOARD_TARGET_MS)
    finally:
        store.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--postgres-url", default=None)
    parser.add_argument("--trials", type=int, default=10_000)
    parser.add_argument("--iterations", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--skip-sqlite", action="store_true")
    parser.add_argument(
        "--case",
        choices=["leaderboard", "history", "all"],
        default="all",
        help="the run page's leaderboard, the experiment page's history of nightly runs, or both",
    )
    parser.add_argument("--history-runs", type=int, default=365)
    parser.add_argument("--history-trials", type=int, default=1_000)
    parser.add_argument(
        "--history-without-summaries",
        action="store_true",
        help="forget the runs' stored history lines, as for runs ended before migration 0013",
    )
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="bench_dashboard_") as tmp:
        _prepare_airflow_home(Path(tmp) / "airflow")
        cases = [run_backend] if args.case == "leaderboard" else [run_history]
        if args.case == "all":
            cases = [run_backend, run_history]
        for case in cases:
            if not args.skip_sqlite:
                db = os.path.join(tmp, f"{case.__name__}.db")
                case("sqlite", f"sqlite:///{db}", args)
            if args.postgres_url:
                from bench.store_ingest import fresh_postgres_schema

                with fresh_postgres_schema(args.postgres_url) as url:
                    case("postgresql", url, args)


if __name__ == "__main__":
    main()
