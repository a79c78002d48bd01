"""Benchmark by counting: the work one run-page request does (SQL statements issued and Python
function calls), which, unlike its time, does not move with the machine's load.

    .venv/bin/python -m bench.run_page_work --trials 2000

Fills a SQLite run as ``bench/dashboard_render.py`` does (its ``_fill``), serves the dashboard
in-process, sends each request once to warm it, then counts the statements and cProfile's calls
of the next. Run it in two trees (a clone with its ``src`` first on ``PYTHONPATH``) to compare
them side by side; the statements are printed so their order can be diffed.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import tempfile
from pathlib import Path

from sqlalchemy import event

from bench import dashboard_render


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=2000)
    parser.add_argument("--iterations", type=int, default=100)
    parser.add_argument("--statements", action="store_true", help="print each statement")
    args = parser.parse_args()

    home = Path(tempfile.mkdtemp(prefix="run-page-work-"))
    dashboard_render._prepare_airflow_home(home / "airflow")  # before Airflow is imported
    from airflow.api_fastapi.app import init_auth_manager
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from airflow_trials.plugins.app import create_app
    from airflow_trials.store import TrialReader

    url = f"sqlite:///{home / 'trials.db'}"
    run = dashboard_render._fill(url, args.trials, args.iterations)
    store = TrialReader(url)
    root = FastAPI()
    init_auth_manager(root)
    root.mount("/trials", create_app(lambda: store))
    statements: list[str] = []
    event.listen(
        store._db.engine,
        "before_cursor_execute",
        lambda conn, cursor, statement, *rest: statements.append(" ".join(statement.split())),
    )
    last = -(-args.trials // 50)
    with TestClient(root) as client:
        token = client.post("/auth/token", json={"username": "admin", "password": "bench"})
        headers = {"Authorization": f"Bearer {token.json()['access_token']}"}
        for path in (f"/trials/runs/{run}", f"/trials/runs/{run}?page={last}"):
            client.get(path, headers=headers)
            statements.clear()
            profile = cProfile.Profile()
            profile.enable()
            response = client.get(path, headers=headers)
            profile.disable()
            calls = pstats.Stats(profile).total_calls  # type: ignore[attr-defined]
            counted = f"{len(statements)} statements, {calls} calls"
            print(f"{path}: HTTP {response.status_code}, {counted}")
            for statement in statements if args.statements else ():
                print(f"    {statement[:160]}")
    store.dispose()


if __name__ == "__main__":
    main()
