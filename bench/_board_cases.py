"""The boards of bench/dashboard_render.py's leaderboard case beyond the run page (issue 53, item
2): a run of two metrics beside the one-metric run, every other route that shows a run's trials,
and the CLI's leaderboard in process and as a subprocess."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from sqlalchemy import text

PARETO_EXPERIMENT = "bench-pareto"


def fill_pareto(url: str, num_trials: int) -> int:
    """A run of ``num_trials`` trials of an experiment ranked by two metrics (min loss, max
    accuracy), one result each, bulk-loaded as the one-metric run; each trial's last result and
    kept bests set as ``record_progress`` leaves them (the Pareto board places trials by the
    last result, a ranking by one of the metrics reads the bests)."""
    from airflow_trials.store import TrialStore
    from bench.store_ingest import _register_trials, bulk_load_results

    store = TrialStore(url, create=True)
    try:
        store.ensure_experiment(PARETO_EXPERIMENT, metric=["loss", "accuracy"], mode=["min", "max"])
        run = store.create_experiment_run(
            PARETO_EXPERIMENT, "bench-run", dag_id="bench_dag", run_id="bench-run-pareto"
        )
        trial_ids = [f"pa-{i:05d}" for i in range(num_trials)]
        _register_trials(store, run, trial_ids)
        bulk_load_results(store, trial_ids, 1)
        cast = "::json" if store._engine.dialect.name == "postgresql" else ""
        with store._engine.begin() as connection:
            connection.execute(
                text(
                    f"UPDATE at_trials SET last_result = (SELECT r.metrics{cast} FROM at_results r "
                    "WHERE r.trial_id = at_trials.trial_id) WHERE experiment_run_id = :run"
                ),
                {"run": run},
            )
        # The bulk load bypasses record_progress, which keeps each trial's best of each metric
        # (migration 0021); bring them to where it would have left them.
        store.recompute_best(run)
        return run
    finally:
        store.dispose()


def board_cases(run: int, pareto: int, num_trials: int) -> list[tuple[str, str, str, int]]:
    """(label, path, a needle of the answer, its status) of every other route showing the run's
    trials; the importances and the Pareto run's boards answer 409 past the dashboard's caps."""
    from airflow_trials.plugins.data import queries
    from airflow_trials.plugins.services import importances as evaluated

    # No cap before issue 53 (a commit before it, run side by side through PYTHONPATH).
    over_importances = num_trials > getattr(evaluated, "MAX_TRIALS", num_trials)
    over_pareto = num_trials > getattr(queries, "MAX_PARETO_TRIALS", num_trials)
    importances = (409, "at most") if over_importances else (200, "importances")
    pareto_json = (409, "up to") if over_pareto else (200, "front_trial_ids")
    pareto_front = (409, "up to") if over_pareto else (200, "points")
    pareto_page = (409, "up to") if over_pareto else (200, "trial-row")
    return [
        ("run page, other mode (?mode=max)", f"/trials/runs/{run}?mode=max", "trial-row", 200),
        ("run page sorted by status", f"/trials/runs/{run}?sort=status", "trial-row", 200),
        ("run page, early-stopped only", f"/trials/runs/{run}?stopped=early", "<table", 200),
        (
            "JSON leaderboard, ?mode=max",
            f"/trials/api/runs/{run}/leaderboard?mode=max",
            "rows",
            200,
        ),
        ("JSON learning curves (best 20)", f"/trials/api/runs/{run}/curves", "curves", 200),
        ("parallel coordinates page", f"/trials/runs/{run}/coordinates", "<polyline", 200),
        ("JSON parallel coordinates", f"/trials/api/runs/{run}/coordinates", "axes", 200),
        ("scheduler decisions page", f"/trials/runs/{run}/decisions", "<main", 200),
        ("JSON scheduler decisions", f"/trials/api/runs/{run}/decisions", "rungs", 200),
        ("importances page", f"/trials/runs/{run}/importances", "importances", 200),
        ("JSON importances", f"/trials/api/runs/{run}/importances", *importances[::-1]),
        ("experiments page", "/trials/", "bench-dashboard", 200),
        ("experiment page (history)", "/trials/experiments/bench-dashboard", "history-row", 200),
        ("JSON history", "/trials/api/experiments/bench-dashboard/history", "runs", 200),
        (
            "DAG run link (redirect + run page)",
            "/trials/dag-run?dag_id=bench_dag&run_id=bench-run",
            "trial-row",
            200,
        ),
        ("trial page", "/trials/trials/lb-00000", "<main", 200),
        ("Pareto run page (2 metrics)", f"/trials/runs/{pareto}", *pareto_page[::-1]),
        ("JSON Pareto leaderboard", f"/trials/api/runs/{pareto}/leaderboard", *pareto_json[::-1]),
        ("JSON Pareto front", f"/trials/api/runs/{pareto}/pareto", *pareto_front[::-1]),
        ("Pareto run ranked by one metric", f"/trials/runs/{pareto}?metric=loss", "trial-row", 200),
    ]


def median_ms(client, path: str, headers: dict, repeats: int, needle: str, code: int) -> float:
    response = client.get(path, headers=headers)  # warm-up, and a sanity check
    if response.status_code != code or needle not in response.text:
        raise SystemExit(f"GET {path} answered {response.status_code}: {response.text[:300]}")
    timings = []
    for _ in range(repeats):
        begin = time.perf_counter()
        client.get(path, headers=headers)
        timings.append((time.perf_counter() - begin) * 1000)
    return statistics.median(timings)


def time_cli(name: str, url: str, repeats: int, target_ms: float) -> None:
    """``airflow-trials leaderboard bench-dashboard --limit 50`` (table, and ``--json``): in
    process through Typer's runner (median after a warm-up), then as a subprocess (the
    interpreter's start and imports included; median of 3)."""
    from typer.testing import CliRunner

    from airflow_trials.cli import app

    runner = CliRunner()
    for extra in ([], ["--json"]):
        args = ["leaderboard", "bench-dashboard", "--db-url", url, "--limit", "50", *extra]
        timings = []
        for _ in range(repeats + 1):
            begin = time.perf_counter()
            result = runner.invoke(app, args)
            timings.append((time.perf_counter() - begin) * 1000)
            if result.exit_code != 0:
                raise SystemExit(f"airflow-trials {' '.join(args)}: {result.output[-300:]}")
        label = f"CLI leaderboard --limit 50{' --json' if extra else ''}"
        print(
            f"[{name}] {label}, in process: median {statistics.median(timings[1:]):.1f} ms over "
            f"{repeats}  (target < {target_ms:.0f} ms)",
            flush=True,
        )
        command = [sys.executable, "-m", "airflow_trials.cli", *args]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        walls = []
        for _ in range(3):
            begin = time.perf_counter()
            subprocess.run(command, check=True, capture_output=True, env=env, cwd=Path.cwd())
            walls.append((time.perf_counter() - begin) * 1000)
        print(
            f"[{name}] {label}, as a subprocess: median {statistics.median(walls):.1f} ms of 3 "
            "(interpreter start and imports included)",
            flush=True,
        )
