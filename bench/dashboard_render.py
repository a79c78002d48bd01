"""Benchmark: server time of the dashboard's leaderboard page at 10,000 trials x 100 results.

The trials DB (SQLite file) holds one experiment run of 10,000 trials with 100 results each
(bulk-loaded as in bench/store_ingest.py, bests brought up to date with ``recompute_best``) and
a checkpoint for every tenth trial. Each request goes through the whole server path in process:
Airflow's JWT check (SimpleAuthManager, a temporary AIRFLOW_HOME), the per-DAG authorisation,
the store's full ranking, the page's sort and slice, its checkpoints, the SVG chart and the
template. Target: < 100 ms for the run page. Median of several requests after a warm-up.

    .venv/bin/python -m bench.dashboard_render                       # SQLite file
    .venv/bin/python -m bench.dashboard_render --postgres-url postgresql+psycopg://postgres@127.0.0.1:5432/test
    .venv/bin/python -m bench.dashboard_render --trials 1000 --repeats 5   # quicker

PostgreSQL runs in a fresh schema, dropped at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGET_MS = 100.0


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
        for i in range(0, num_trials, 10):
            store.add_checkpoint(trial_ids[i], f"/ckpt/{trial_ids[i]}/50", 50)
        return run
    finally:
        store.dispose()


def _median_ms(
    client, path: str, headers: dict[str, str], repeats: int, must_contain: str
) -> float:
    response = client.get(path, headers=headers)  # warm-up, and a sanity check
    if response.status_code != 200 or must_contain not in response.text:
        raise SystemExit(f"GET {path} answered {response.status_code}: {response.text[:300]}")
    timings = []
    for _ in range(repeats):
        begin = time.perf_counter()
        client.get(path, headers=headers)
        timings.append((time.perf_counter() - begin) * 1000)
    return statistics.median(timings)


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
    try:
        with TestClient(root) as client:
            token = client.post(
                "/auth/token", json={"username": "admin", "password": "bench"}
            ).json()["access_token"]
            headers = {"Authorization": f"Bearer {token}"}
            for label, path, needle in cases:
                ms = _median_ms(client, path, headers, args.repeats, needle)
                print(
                    f"[{name}] {label}: median {ms:.1f} ms over {args.repeats} requests  "
                    f"(target < {TARGET_MS:.0f} ms, ratio {ms / TARGET_MS:.2f} of target)",
                    flush=True,
                )
    finally:
        store.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--postgres-url", default=None)
    parser.add_argument("--trials", type=int, default=10_000)
    parser.add_argument("--iterations", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--skip-sqlite", action="store_true")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="bench_dashboard_") as tmp:
        _prepare_airflow_home(Path(tmp) / "airflow")
        if not args.skip_sqlite:
            run_backend("sqlite", f"sqlite:///{os.path.join(tmp, 'trials.db')}", args)
        if args.postgres_url:
            from bench.store_ingest import fresh_postgres_schema

            with fresh_postgres_schema(args.postgres_url) as url:
                run_backend("postgresql", url, args)


if __name__ == "__main__":
    main()
