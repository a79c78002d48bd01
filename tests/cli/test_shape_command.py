"""``airflow-trials shape``: its refusals name the cause and the fix, and leave nothing behind.
The shape itself runs in tests/faults/test_production_shape.py."""

from __future__ import annotations

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


def test_up_without_a_dags_folder_is_refused(tmp_path):
    result = runner.invoke(
        app, ["shape", "up", "--home", str(tmp_path), "--dags-folder", str(tmp_path / "no")]
    )
    assert result.exit_code == 1 and "--dags-folder" in result.output


def test_up_against_an_unreachable_postgres_stops_what_it_started(tmp_path):
    port = free_port()  # nothing listens there
    url = f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres"
    dags = tmp_path / "dags"
    dags.mkdir()
    home = tmp_path / "shape"
    result = runner.invoke(
        app,
        ["shape", "up", "--home", str(home), "--dags-folder", str(dags), "--postgres-url", url],
    )
    assert result.exit_code == 1, result.output
    assert "did not come up" in result.output and url in result.output
    status = runner.invoke(app, ["shape", "status", "--home", str(home)])
    assert "running" not in status.output.replace("stopped", ""), status.output
