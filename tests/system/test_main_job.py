"""The README's main job with the real scheduler, dag-processor, triggerer and api-server on
SQLite."""

from __future__ import annotations

import os
import re
import sqlite3
import subprocess
import sys

from airflow_trials.ports import free_port
from tests.conftest import REPO


def _live_processes_mentioning(*needles: str) -> list[str]:
    out = subprocess.run(["ps", "-eo", "stat=,args="], capture_output=True, text=True).stdout
    return [
        line
        for line in out.splitlines()
        if not line.lstrip().startswith("Z")
        and any(n in line for n in needles)
        and "ps -eo" not in line
    ]


def test_main_job_runs_trials_concurrently_records_them_and_stops_everything(tmp_path):
    state = tmp_path / "state"
    plot = tmp_path / "curves.png"
    cli = os.path.join(os.path.dirname(sys.executable), "airflow-trials")
    done = subprocess.run(
        [
            cli,
            "run",
            "--state-dir",
            str(state),
            "--num-cpus",
            "2",
            "--plot",
            str(plot),
            "--dags-folder",
            os.path.join(REPO, "dags"),
            "--timeout-s",
            "900",
            "--api-port",
            str(free_port()),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=1200,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    assert "DAG run main_job__" in done.stdout and ": success." in done.stdout
    assert "Leaderboard: example_regression_tuning" in done.stdout
    # It ends with the CLI line that reads its results (issue 52, A), and that line works.
    run_key = re.search(r"DAG run (main_job__\S+): success\.", done.stdout).group(1)
    last = done.stdout.strip().splitlines()[-1]
    assert last.endswith(
        f" --db-url sqlite:///{state / 'trials.db'} leaderboard example_regression_tuning "
        f"--run {run_key}"
    ), last
    read = subprocess.run(["bash", "-c", last], cwd=REPO, capture_output=True, text=True)
    assert read.returncode == 0, read.stderr
    assert f"example_regression_tuning / {run_key}" in read.stdout, read.stdout

    from airflow_trials.store import TrialStore

    store = TrialStore(f"sqlite:///{state / 'trials.db'}")
    trials = store.reader.list_trials(experiment_name="example_regression_tuning")
    assert len(trials) == 8 and {t.status.value for t in trials} == {"TERMINATED"}
    for t in trials:
        assert [r["training_iteration"] for r in store.reader.get_results(t.trial_id)][:10] == list(
            range(1, 11)
        )
    # Concurrency: the most trials live at one moment, each from its task registering it to its
    # recorded end. (Not the spans of its results: the example's trials report for a fraction of a
    # second, so whether two of those overlap is a race; each trial's life on Ray, from a fresh
    # actor to the end its trigger records, lasts seconds, and one-at-a-time tasks never overlap.)
    spans = [(t.created_at, t.ended_at) for t in trials]
    most = max(sum(1 for s, e in spans if s <= start <= e) for start, _ in spans)
    assert most >= 2, spans

    with sqlite3.connect(state / "airflow" / "airflow.db") as db:
        trial_xcoms = db.execute(
            "SELECT count(*) FROM xcom WHERE dag_id = 'example_regression_tuning' AND key = 'trial'"
        ).fetchone()[0]
        best = db.execute(
            "SELECT count(*) FROM xcom WHERE task_id = 'example_regression_tuning.select_best' "
            "AND key = 'return_value'"
        ).fetchone()[0]
    assert trial_xcoms == 8 and best == 1
    assert plot.read_bytes()[:4] == b"\x89PNG"

    ray_address = re.search(r"Ray at (127\.0\.0\.1:\d+)", done.stdout).group(1)
    assert _live_processes_mentioning(str(state), ray_address) == []
