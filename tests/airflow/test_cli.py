"""The airflow-trials CLI against a store filled by a real experiment run (dag.test, real Ray)."""

from __future__ import annotations

import json
import os

import pytest
from typer.testing import CliRunner

from airflow_trials.cli import app
from tests.airflow.test_experiment_dag import experiment_dag

runner = CliRunner()


@pytest.fixture(scope="module")
def experiment(airflow_home, tmp_path_factory):
    """One real two-trial experiment; its store URL is passed to the CLI with --db-url."""
    from airflow_trials.core.search import grid_search
    from airflow_trials.store import TrialStore
    from tests.conftest import start_ray

    tmp = tmp_path_factory.mktemp("cli")
    url = f"sqlite:///{tmp / 'trials.db'}"
    saved = {k: os.environ.get(k) for k in ("AIRFLOW_TRIALS_DB_URL", "AIRFLOW_TRIALS_STORAGE")}
    os.environ["AIRFLOW_TRIALS_DB_URL"] = url
    os.environ["AIRFLOW_TRIALS_STORAGE"] = str(tmp / "storage")
    TrialStore(url, create=True).dispose()
    start_ray(num_cpus=2, num_gpus=2)
    try:
        run = experiment_dag("cli_exp", search_space={"scale": grid_search([1.0, 2.0])}).test()
        assert run.state == "success"
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    return {"url": url, "run_id": run.run_id, "tmp": tmp}


def invoke(*args):
    return runner.invoke(app, list(args))


def test_experiments_and_runs_as_json(experiment):
    result = invoke("experiments", "--db-url", experiment["url"], "--json")
    assert result.exit_code == 0, result.output
    (exp,) = json.loads(result.stdout)
    assert (exp["name"], exp["metric"], exp["mode"]) == ("cli_exp", "score", "max")
    result = invoke("runs", "cli_exp", "--db-url", experiment["url"], "--json")
    (run,) = json.loads(result.stdout)
    assert run["run_key"] == experiment["run_id"] and run["status"] == "SUCCESS"


def test_leaderboard_json_and_table(experiment):
    result = invoke("leaderboard", "cli_exp", "--db-url", experiment["url"], "--json")
    assert result.exit_code == 0, result.output
    board = json.loads(result.stdout)
    assert board["metric"] == "score" and board["mode"] == "max"
    assert [(r["config"]["scale"], r["best_value"]) for r in board["rows"]] == [
        (2.0, 6.0),
        (1.0, 3.0),
    ]
    assert all(r["status"] == "TERMINATED" and r["best_checkpoint"] for r in board["rows"])
    table = runner.invoke(
        app,
        ["leaderboard", "cli_exp", "--db-url", experiment["url"], "--run", experiment["run_id"]],
        env={"COLUMNS": "250"},
    )
    assert (
        table.exit_code == 0
        and "max score" in table.stdout
        and board["rows"][0]["trial_id"] in table.stdout
    )


def test_trials_shows_status_failures_best_and_checkpoint(experiment):
    result = invoke("trials", "cli_exp", "--db-url", experiment["url"], "--json")
    assert result.exit_code == 0, result.output
    trials = json.loads(result.stdout)["trials"]
    assert sorted(t["best_score"] for t in trials) == [3.0, 6.0]
    assert all(
        t["num_failures"] == 0
        and t["iterations"] == 3
        and t["best_checkpoint"]
        and t["latest_checkpoint"]
        for t in trials
    )


@pytest.mark.parametrize("command", ["leaderboard", "plot"])
def test_a_metric_no_trial_reported_is_an_error_that_lists_the_reported_ones(experiment, command):
    out = experiment["tmp"] / "never.png"
    result = (
        invoke(
            command,
            "cli_exp",
            "--db-url",
            experiment["url"],
            "--metric",
            "acurracy",
            "--out",
            str(out),
        )
        if command == "plot"
        else invoke(command, "cli_exp", "--db-url", experiment["url"], "--metric", "acurracy")
    )
    assert result.exit_code == 1
    assert (
        "reported metric 'acurracy'; its trials report score. Pass --metric with one of them."
        in result.output
    )
    assert not out.exists()


def test_piped_tables_keep_full_trial_ids_run_keys_and_paths(experiment):
    import subprocess
    import sys

    from airflow_trials.store import TrialStore

    store = TrialStore(experiment["url"])
    try:
        (run,) = store.reader.list_experiment_runs("cli_exp")
        board = store.reader.leaderboard(run.id, "score", "max")
    finally:
        store.dispose()
    cli = os.path.join(os.path.dirname(sys.executable), "airflow-trials")
    env = {**os.environ, "COLUMNS": "40"}  # a narrow terminal's setting must not cut a pipe's lines
    shown = {}
    for command in ("leaderboard", "runs", "trials"):
        done = subprocess.run(
            [cli, command, "cli_exp", "--db-url", experiment["url"]],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        shown[command] = done.stdout
    assert experiment["run_id"] in shown["runs"]
    for row in board:
        assert row.trial_id in shown["leaderboard"] and row.trial_id in shown["trials"]
        assert (
            row.best_checkpoint in shown["leaderboard"] and row.latest_checkpoint in shown["trials"]
        )
    assert "…" not in shown["leaderboard"] + shown["runs"] + shown["trials"]


def test_plot_writes_a_png(experiment):
    path = experiment["tmp"] / "curves.png"
    result = invoke("plot", "cli_exp", "--db-url", experiment["url"], "--out", str(path), "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["trials"] == 2
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5_000


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["leaderboard", "nope"], "Experiment 'nope' has no runs"),
        (["leaderboard", "cli_exp", "--run", "manual__missing"], "has no run 'manual__missing'"),
        (["plot", "cli_exp", "--out", "curves.jpg"], "--out must name a .png file"),
        (["leaderboard", "cli_exp", "--mode", "best"], "mode must be 'min' or 'max'"),
    ],
)
def test_bad_arguments_are_one_readable_line_with_exit_code_1(experiment, args, message):
    result = runner.invoke(app, [*args, "--db-url", experiment["url"]])
    assert result.exit_code == 1
    assert message in result.stderr and "Traceback" not in result.output
    assert len(result.stderr.strip().splitlines()) == 1


def test_usage_errors_exit_2():
    assert runner.invoke(app, ["leaderboard"]).exit_code == 2


def test_db_url_goes_before_or_after_the_command_and_the_command_s_own_wins(
    experiment, tmp_path, monkeypatch
):
    from airflow_trials.store import TrialStore

    empty = f"sqlite:///{tmp_path / 'empty.db'}"
    TrialStore(empty, create=True).dispose()

    def names(*args):
        result = invoke(*args, "--json")
        assert result.exit_code == 0, result.output
        return [e["name"] for e in json.loads(result.stdout)]

    assert names("--db-url", experiment["url"], "experiments") == ["cli_exp"]
    assert names("experiments", "--db-url", experiment["url"]) == ["cli_exp"]
    assert names("--db-url", empty, "experiments", "--db-url", experiment["url"]) == ["cli_exp"]
    assert names("--db-url", experiment["url"], "experiments", "--db-url", empty) == []
    # The flag before the command wins over the environment, which fills in without a flag.
    monkeypatch.setenv("AIRFLOW_TRIALS_DB_URL", empty)
    assert names("--db-url", experiment["url"], "experiments") == ["cli_exp"]
    assert names("experiments") == []
    monkeypatch.setenv("AIRFLOW_TRIALS_DB_URL", experiment["url"])
    assert names("--db-url", empty, "runs") == []
    # A nested command (db upgrade) reads the global flag too.
    fresh = tmp_path / "fresh.db"
    result = invoke("--db-url", f"sqlite:///{fresh}", "db", "upgrade")
    assert result.exit_code == 0 and "is up to date" in result.stdout and fresh.exists()


def test_db_upgrade_is_idempotent(tmp_path):
    url = f"sqlite:///{tmp_path / 'fresh.db'}"
    for _ in range(2):
        result = invoke("db", "upgrade", "--db-url", url)
        assert result.exit_code == 0 and "is up to date" in result.stdout


def test_pool_set(airflow_home):
    result = invoke("pool", "set", "--gpus", "2", "--name", "cli_gpu", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == {"pool": "cli_gpu", "slots": 8, "include_deferred": True}
