"""After ``./scripts/run.sh`` the CLI finds the run (issue 52, A): the main job ends by printing
the CLI line that reads its results from the trials DB in its state directory, and that line,
run in a shell, prints the run's leaderboard; a read that finds no trials DB names the main job's
(``./.state/trials.db``, ``$AIRFLOW_TRIALS_STATE/trials.db``) with its exact ``--db-url`` and says
``db upgrade`` only as the way to a new, empty one."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import pytest

from airflow_trials import mainjob, trials_db_url
from tests.airflow.test_cli_output import (
    CLI,
    EXPERIMENT,
    RUN_KEY,
    TRIAL_IDS,
    one_error_line,
    seed,
)
from tests.conftest import REPO


@pytest.fixture
def state(tmp_path):
    """A main job's state directory with a trials DB holding one finished run."""
    home = tmp_path / "state"
    home.mkdir()
    seed(f"sqlite:///{home / 'trials.db'}")
    return home


def _shell(line: str, cwd, env=None):
    """Run ``line`` as a user pastes it into a shell; no trials DB is configured otherwise."""
    merged = {**os.environ, **(env or {})}
    for name in ("AIRFLOW_TRIALS_DB_URL", "AIRFLOW_CONN_TRIALS_DEFAULT", "AIRFLOW_TRIALS_STATE"):
        if name not in (env or {}):
            merged.pop(name, None)
    return subprocess.run(
        ["bash", "-c", line], cwd=cwd, env=merged, capture_output=True, text=True, timeout=120
    )


def test_the_results_line_reads_the_run_from_the_repository(state, monkeypatch):
    monkeypatch.chdir(REPO)
    stack = mainjob.Stack(home=state, dags_folder=state)
    line = mainjob.results_command(stack.trials_db_url, EXPERIMENT, RUN_KEY)
    # Its shape: the venv's script, relative to where the job ran; the global --db-url with the
    # absolute file; the leaderboard of the run.
    script = os.path.relpath(CLI, REPO) if CLI.startswith(REPO + os.sep) else CLI
    assert line.startswith(f"{script} --db-url sqlite:////"), line
    assert f"--db-url sqlite:///{state / 'trials.db'} leaderboard {EXPERIMENT} --run " in line
    assert shlex.split(line)[-1] == RUN_KEY
    done = _shell(line, REPO)
    assert done.returncode == 0, done.stderr
    assert all(trial_id in done.stdout for trial_id in TRIAL_IDS), done.stdout
    assert "no trials DB is configured" not in done.stderr


def test_a_relative_state_dir_still_gives_a_line_that_works_elsewhere(state, tmp_path, monkeypatch):
    monkeypatch.chdir(state.parent)
    stack = mainjob.Stack(home=Path("state"), dags_folder=state)
    assert stack.trials_db_url == f"sqlite:///{state / 'trials.db'}"
    line = mainjob.results_command(stack.trials_db_url, EXPERIMENT, RUN_KEY)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    # Printed outside the repository, the script's path is absolute.
    assert shlex.split(line)[0].startswith("/"), line
    done = _shell(line, elsewhere)
    assert done.returncode == 0 and TRIAL_IDS[0] in done.stdout, done.stderr


def test_the_main_job_s_report_ends_with_the_line(state, tmp_path, monkeypatch, capsys):
    from airflow_trials.cli import mainjob_cmd

    monkeypatch.chdir(REPO)
    stack = mainjob.Stack(home=state, dags_folder=state)
    for ended in ("success", "failed"):
        code = mainjob_cmd._report(stack, EXPERIMENT, RUN_KEY, ended, str(tmp_path / "c.png"))
        assert code == (0 if ended == "success" else 1)
        lines = capsys.readouterr().out.strip().splitlines()
        assert lines[-3] == f"DAG run {RUN_KEY}: {ended}."
        assert lines[-2] == f"Its results, from this job's trials DB in {state}:"
        assert lines[-1] == mainjob.results_command(stack.trials_db_url, EXPERIMENT, RUN_KEY)
        done = _shell(lines[-1], REPO)
        assert done.returncode == 0 and TRIAL_IDS[2] in done.stdout, done.stderr


# -- a read that finds no trials DB --------------------------------------------------------------
def _no_db_configured(tmp_path, monkeypatch) -> dict[str, str]:
    """A process that falls back to the default SQLite file, which does not exist."""
    monkeypatch.setattr(trials_db_url, "_said_default", False)
    return {
        "AIRFLOW_TRIALS_HOME": str(tmp_path / "trials_home"),
        "AIRFLOW__AIRFLOW_TRIALS__HOME": "",
        "AIRFLOW__AIRFLOW_TRIALS__DB_URL": "",
    }


def test_no_trials_db_names_the_main_job_s_in_the_current_directory(state, tmp_path, monkeypatch):
    env = _no_db_configured(tmp_path, monkeypatch)
    cwd = state.parent
    (state.parent / ".state").mkdir()
    os.replace(state / "trials.db", cwd / ".state" / "trials.db")
    done = _shell(f"{shlex.quote(_cli())} leaderboard {EXPERIMENT}", cwd, env)
    line = one_error_line(done)
    default = tmp_path / "trials_home" / "trials.db"
    assert line.startswith(
        f"Error: No trials DB at sqlite:///{default} (from the default SQLite file in "
        "AIRFLOW_TRIALS_HOME, no --db-url, no trials_default connection, no "
        f"AIRFLOW_TRIALS_DB_URL or [airflow_trials] db_url): {default} does not exist."
    ), line
    exact = f"--db-url sqlite:///{cwd / '.state' / 'trials.db'}"
    assert f"keeps its trials DB in its state directory; to read it, pass {exact};" in line
    assert line.endswith("; to start a new, empty trials DB there: airflow-trials db upgrade.")
    assert "run 'airflow-trials db upgrade'" not in line
    assert not (tmp_path / "trials_home").exists()
    # The --db-url it names reads the run.
    done = _shell(f"{shlex.quote(_cli())} {exact} leaderboard {EXPERIMENT}", tmp_path, env)
    assert done.returncode == 0 and TRIAL_IDS[0] in done.stdout, done.stderr


def test_no_trials_db_names_the_main_job_s_in_airflow_trials_state(state, tmp_path, monkeypatch):
    env = {**_no_db_configured(tmp_path, monkeypatch), "AIRFLOW_TRIALS_STATE": str(state)}
    line = one_error_line(_shell(f"{shlex.quote(_cli())} runs", tmp_path, env))
    assert f"to read it, pass --db-url sqlite:///{state / 'trials.db'};" in line


def test_no_trials_db_and_no_main_job_says_how_to_name_one(tmp_path, monkeypatch):
    env = _no_db_configured(tmp_path, monkeypatch)
    missing = tmp_path / "nowhere.db"
    line = one_error_line(
        _shell(f"{shlex.quote(_cli())} --db-url sqlite:///{missing} experiments", tmp_path, env)
    )
    assert line == (
        f"Error: No trials DB at sqlite:///{missing} (from --db-url): {missing} does not exist. "
        "To read another trials DB, pass its URL with --db-url; to start a new, empty trials DB "
        f"there: airflow-trials --db-url sqlite:///{missing} db upgrade."
    )
    assert "main job" not in line and sorted(os.listdir(tmp_path)) == []


def _cli() -> str:
    return CLI
