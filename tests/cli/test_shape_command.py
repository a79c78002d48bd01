"""``airflow-trials shape``: its refusals name the cause and the fix, and leave nothing behind.
The shape itself runs in tests/faults/test_production_shape.py."""

from __future__ import annotations

import os
import sys

import pytest
from typer.testing import CliRunner

from airflow_trials.cli import app
from airflow_trials.ports import free_port

runner = CliRunner()


def test_env_and_down_without_a_shape_say_how_to_start_one(tmp_path):
    home = tmp_path / "nothing"
    result = runner.invoke(app, ["shape", "env", "--home", str(home)])
    assert result.exit_code == 1
    assert f"No shape in {home}" in result.output and "airflow-trials shape up" in result.output
    result = runner.invoke(app, ["shape", "down", "--home", str(home)])
    assert result.exit_code == 1 and f"No shape in {home}" in result.output


def test_status_without_a_shape_says_so_as_env_does(tmp_path):
    """Not twelve "stopped" lines and exit code 0, as if a shape were there and down."""
    home = tmp_path / "nothing"
    result = runner.invoke(app, ["shape", "status", "--home", str(home)])
    assert result.exit_code == 1, result.output
    assert result.stdout == ""
    assert result.stderr.strip() == (
        f"Error: No shape in {home}: start one with `airflow-trials shape up --home {home}`."
    )
    assert result.stderr == runner.invoke(app, ["shape", "env", "--home", str(home)]).stderr
    assert not home.exists()


def test_up_says_what_it_needs_in_its_help():
    shown = runner.invoke(app, ["shape", "up", "--help"], env={"COLUMNS": "400"})
    text = " ".join(shown.output.split())
    assert "a PostgreSQL server, given by --postgres-url, whose user may create databases" in text
    assert "`redis-server` on PATH" in text


def test_up_without_redis_server_is_refused_before_anything_starts(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable))  # the venv's programs only
    dags = tmp_path / "dags"
    dags.mkdir()
    home = tmp_path / "shape"
    result = runner.invoke(app, ["shape", "up", "--home", str(home), "--dags-folder", str(dags)])
    assert result.exit_code == 1, result.output
    assert result.stderr.strip() == (
        "Error: shape up needs redis-server on PATH (e.g. apt-get install redis-server); nothing "
        "was started."
    )
    assert not home.exists()


def test_up_without_a_dags_folder_is_refused(tmp_path):
    result = runner.invoke(
        app, ["shape", "up", "--home", str(tmp_path), "--dags-folder", str(tmp_path / "no")]
    )
    assert result.exit_code == 1 and "--dags-folder" in result.output


def test_up_against_an_unreachable_postgres_starts_and_writes_nothing(tmp_path):
    port = free_port()  # nothing listens there
    url = f"postgresql+psycopg://postgres:hunter2@127.0.0.1:{port}/postgres"
    dags = tmp_path / "dags"
    dags.mkdir()
    home = tmp_path / "shape"
    result = runner.invoke(
        app,
        ["shape", "up", "--home", str(home), "--dags-folder", str(dags), "--postgres-url", url],
    )
    assert result.exit_code == 1, result.output
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(
        f"Error: No PostgreSQL server answers at postgresql+psycopg://postgres:***@127.0.0.1:{port}"
        "/postgres (--postgres-url): OperationalError: "
    ), line
    assert line.endswith("whose user may create databases; nothing was started.")
    assert "hunter2" not in result.output
    assert not home.exists()
    status = runner.invoke(app, ["shape", "status", "--home", str(home)])
    assert status.exit_code == 1 and f"No shape in {home}" in status.output


@pytest.mark.postgres
def test_up_with_a_user_who_may_not_create_databases_is_refused(tmp_path):
    """The shape creates its two databases on the server: a user without CREATEDB is refused
    before anything starts."""
    from sqlalchemy.engine import make_url

    from airflow_trials.shape.setup import _server
    from tests.contract.conftest import postgres_url

    server = postgres_url()
    role = f"shape_nocreatedb_{os.getpid()}"
    with _server(server) as conn:
        conn.execute(f"DROP ROLE IF EXISTS {role}")
        conn.execute(f"CREATE ROLE {role} LOGIN PASSWORD 'not-a-secret' NOCREATEDB")
    try:
        url = (
            make_url(server)
            .set(username=role, password="not-a-secret", database="postgres")
            .render_as_string(hide_password=False)
        )
        dags = tmp_path / "dags"
        dags.mkdir()
        home = tmp_path / "shape"
        result = runner.invoke(
            app,
            ["shape", "up", "--home", str(home), "--dags-folder", str(dags), "--postgres-url", url],
        )
        assert result.exit_code == 1, result.output
        assert f"The user of postgresql+psycopg://{role}:***@" in result.stderr
        assert "may not create databases" in result.stderr and "CREATEDB" in result.stderr
        assert not home.exists()
    finally:
        with _server(server) as conn:
            conn.execute(f"DROP ROLE IF EXISTS {role}")
