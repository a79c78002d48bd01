"""Where one line was promised, a real ``airflow-trials`` process prints one ``Error:`` line that
names the fix, exits 1, and creates nothing (issue 52, C): ``extend`` against an AIRFLOW_HOME
that is not a deployment, ``export mlflow`` to a ``file://`` URI that MLflow 3 refuses, and a
``trials_default`` connection of SQLite without a file."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess

import pytest

from airflow_trials.core.end import TrialEnd
from airflow_trials.core.fate import CRITERION_MET, Transition
from airflow_trials.core.status import TrialStatus
from tests.airflow.test_cli_output import CLI
from tests.factories import add_checkpoint, add_results

EXPERIMENT = "newcomer"


def _finished_run(url: str) -> None:
    """Run ``r1`` (id 1) of DAG ``newcomer``: two trials stopped by their criterion, ended."""
    from airflow_trials.store import TrialStore

    store = TrialStore(url, create=True)
    try:
        store.ensure_experiment(EXPERIMENT, metric="loss", mode="min")
        run = store.create_experiment_run(EXPERIMENT, "r1", dag_id=EXPERIMENT, run_id="r1")
        for i in range(2):
            trial_id = f"{EXPERIMENT}-{i}"
            store.upsert_trial(
                trial_id, trainable="m:f", config={"lr": 0.1 * (i + 1)}, resources={"cpu": 1},
                max_failures=0, experiment_run_id=run,
            )  # fmt: skip
            store.record_transition(trial_id, Transition.PLACED)
            last = {"training_iteration": 3, "loss": 1.0 + i}
            add_results(store, trial_id, [last])
            add_checkpoint(store, trial_id, f"/nowhere/{trial_id}/3", 3)
            store.record_end(
                TrialEnd(
                    trial_id,
                    EXPERIMENT,
                    TrialStatus.TERMINATED,
                    last_result=last,
                    stop_reason=CRITERION_MET,
                )
            )
        store.finish_experiment_run(run, "SUCCESS")
    finally:
        store.dispose()


@pytest.fixture
def finished(tmp_path):
    url = f"sqlite:///{tmp_path / 'trials.db'}"
    _finished_run(url)
    return url


def run_cli(*args, env=None, cwd=None):
    """The installed console script, in ``cwd``; ``env`` entries of None are unset."""
    merged = {k: v for k, v in {**os.environ, **(env or {})}.items() if v is not None}
    return subprocess.run(
        [CLI, *map(str, args)], env=merged, cwd=cwd, capture_output=True, text=True, timeout=120
    )


def _one_error_line(done) -> str:
    """The process's one stderr line (``Error: ...``): exit code 1, nothing on stdout."""
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1, (done.returncode, done.stdout, done.stderr)
    assert done.stdout == "", done.stdout
    assert len(lines) == 1 and lines[0].startswith("Error: "), done.stderr
    return lines[0]


def _files_under(folder) -> list[str]:
    """Every file below ``folder`` (Airflow's import makes an empty ``logs/`` in AIRFLOW_HOME:
    a folder, not a file, made by any Airflow process)."""
    return sorted(
        os.path.relpath(os.path.join(root, name), folder)
        for root, _, names in os.walk(folder)
        for name in names
    )


def _airflow_env(home) -> dict[str, str | None]:
    return {"AIRFLOW_HOME": str(home), "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": None}


# -- extend against an AIRFLOW_HOME that is not the deployment ----------------------------------
def test_extend_against_an_empty_airflow_home_is_one_line_and_creates_no_airflow_db(
    finished, tmp_path
):
    home = tmp_path / "empty_home"
    home.mkdir()
    done = run_cli(
        "extend", "1", "--stop", "training_iteration=5", "--db-url", finished,
        env=_airflow_env(home),
    )  # fmt: skip
    line = _one_error_line(done)
    assert line == (
        f"Error: Could not trigger DAG {EXPERIMENT}: Airflow's metadata DB "
        f"sqlite:///{home / 'airflow.db'} does not exist; point AIRFLOW_HOME (or "
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN) at the Airflow deployment that runs DAG "
        f"{EXPERIMENT} (the main job's is its state directory's airflow/, ./.state/airflow), "
        "then retry; nothing was triggered."
    )
    assert _files_under(home) == []  # no empty airflow.db left behind


def test_extend_against_a_never_migrated_airflow_db_changes_nothing(finished, tmp_path):
    home = tmp_path / "unmigrated_home"
    home.mkdir()
    with sqlite3.connect(home / "airflow.db") as connection:  # a SQLite DB, not Airflow's
        connection.execute("CREATE TABLE unrelated (x INTEGER)")
    done = run_cli(
        "extend", "1", "--stop", "training_iteration=5", "--db-url", finished,
        env=_airflow_env(home),
    )  # fmt: skip
    line = _one_error_line(done)
    assert "has no tables (never migrated); point AIRFLOW_HOME" in line
    assert _files_under(home) == ["airflow.db"]
    with sqlite3.connect(home / "airflow.db") as connection:
        tables = connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        assert [name for (name,) in tables] == ["unrelated"]  # nothing migrated or written


def test_extend_dry_run_needs_no_airflow_db(finished, tmp_path):
    home = tmp_path / "empty_home"
    home.mkdir()
    done = run_cli(
        "extend", "1", "--stop", "training_iteration=5", "--dry-run", "--db-url", finished,
        env=_airflow_env(home),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "Dry run: would trigger DAG newcomer" in done.stdout
    assert _files_under(home) == []


# -- export mlflow to a file store ---------------------------------------------------------------
@pytest.mark.parametrize("form", ["file_uri", "path"])
def test_export_mlflow_to_a_file_store_is_one_line_that_names_the_ways_out(
    finished, tmp_path, form
):
    pytest.importorskip("mlflow")
    store = tmp_path / "mlruns"
    uri = f"file://{store}" if form == "file_uri" else str(store)
    env = {"MLFLOW_ALLOW_FILE_STORE": None, "MLFLOW_TRACKING_URI": None}
    done = run_cli(
        "export", "mlflow", EXPERIMENT, "--tracking-uri", uri, "--db-url", finished, env=env
    )
    line = _one_error_line(done)
    assert line.startswith(f"Error: MLflow refuses the tracking URI {uri}: MLflow 3 no longer ")
    assert "--tracking-uri http://host:5000" in line and "MLFLOW_ALLOW_FILE_STORE=true" in line
    assert not store.exists()
    assert _files_under(tmp_path) == ["trials.db"]


# -- trials_default: SQLite without a file -------------------------------------------------------
NO_FILE = [
    pytest.param("sqlite://", "is a SQLite connection without a file", id="uri-without-path"),
    pytest.param(
        json.dumps({"conn_type": "sqlite"}),
        "is a SQLite connection without a file",
        id="json-without-host",
    ),
    pytest.param(
        json.dumps({"conn_type": "trials_db", "extra": {"url": "sqlite://"}}),
        "sqlite:// names no SQLite file (an in-memory database",
        id="url-in-memory",
    ),
]


@pytest.mark.parametrize(("connection", "said"), NO_FILE)
@pytest.mark.parametrize("command", [["experiments"], ["db", "upgrade"]], ids=lambda c: c[0])
def test_a_sqlite_connection_without_a_file_is_one_line(connection, said, command, tmp_path):
    env = {
        "AIRFLOW_CONN_TRIALS_DEFAULT": connection,
        "AIRFLOW_TRIALS_DB_URL": None,
        **_airflow_env(tmp_path / "airflow_home"),
    }
    line = _one_error_line(run_cli(*command, env=env, cwd=tmp_path))
    assert said in line and "sqlite:////abs/path/trials.db" in line, line
    assert _files_under(tmp_path) == []


def test_a_sqlite_connection_to_a_missing_file_is_one_line_and_creates_it_not(tmp_path):
    missing = tmp_path / "gone" / "trials.db"
    env = {
        "AIRFLOW_CONN_TRIALS_DEFAULT": f"sqlite:///{missing}",
        "AIRFLOW_TRIALS_DB_URL": None,
        **_airflow_env(tmp_path / "airflow_home"),
    }
    for command in (["experiments"], ["history", EXPERIMENT, "-o", "json"]):
        line = _one_error_line(run_cli(*command, env=env, cwd=tmp_path))
        assert line.startswith(
            f"Error: No trials DB at sqlite:///{missing} (from connection trials_default): "
            f"{missing} does not exist."
        ), line
    assert _files_under(tmp_path) == [] and not missing.parent.exists()
