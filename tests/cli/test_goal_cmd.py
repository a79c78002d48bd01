"""``--metric`` of a metric that is not the experiment's needs ``--mode`` (issue 48): without it,
``leaderboard``, ``plot`` and ``importances`` are refused in one line naming ``--mode``, where
they used to rank the metric in the experiment's mode (the lowest accuracy first). The
experiment's own metric keeps its recorded mode. On a trials DB filled through TrialStore
(SQLite and PostgreSQL)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from airflow_trials.cli import app
from tests.contract.conftest import postgres_schema_url  # noqa: F401  (a fixture)
from tests.plugins.conftest import seed_store

runner = CliRunner()
# The dashboard's seed: experiment "mnist" ranks by min loss; its trials also report acc (1 - loss),
# so mnist-00 has both the lowest loss and the highest acc.
EXPERIMENT = "mnist"


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def goal_url(request, tmp_path) -> str:
    from airflow_trials.store import TrialStore

    if request.param == "postgresql":
        url = request.getfixturevalue("postgres_schema_url")
    else:
        url = f"sqlite:///{tmp_path / 'trials.db'}"
    store = TrialStore(url, create=True)
    try:
        seed_store(store)
    finally:
        store.dispose()
    return url


def invoke(*args: str):
    return runner.invoke(app, list(args))


def _refused_naming_mode(result, metric: str = "acc") -> None:
    assert result.exit_code == 1, result.output
    (line,) = result.stderr.strip().splitlines()
    assert f"--metric {metric} is not a metric the experiment records" in line
    assert f"pass --mode min or --mode max with --metric {metric}" in line
    assert "Traceback" not in result.output


@pytest.mark.parametrize(
    "command",
    [["leaderboard"], ["importances"], ["plot", "--out", "curves.png"]],
    ids=["leaderboard", "importances", "plot"],
)
def test_another_metric_without_mode_is_refused_naming_mode(goal_url, command, tmp_path):
    args = [a if a != "curves.png" else str(tmp_path / a) for a in command]
    result = invoke(*args, EXPERIMENT, "--db-url", goal_url, "--metric", "acc")
    _refused_naming_mode(result)
    assert not (tmp_path / "curves.png").exists()


def _board(url: str, *args: str) -> tuple[dict, list[float]]:
    result = invoke("leaderboard", EXPERIMENT, "--db-url", url, *args, "--json")
    assert result.exit_code == 0, result.output
    board = json.loads(result.stdout)
    return board, [row["best_value"] for row in board["rows"] if row["best_value"] is not None]


def test_another_metric_with_mode_ranks_in_that_mode(goal_url):
    board, values = _board(goal_url, "--metric", "acc", "--mode", "max")
    assert (board["metric"], board["mode"]) == ("acc", "max")
    assert board["rows"][0]["trial_id"] == "mnist-00" and values == sorted(values, reverse=True)


@pytest.mark.parametrize("metric", [[], ["--metric", "loss"]], ids=["default", "own"])
def test_the_experiment_s_own_metric_keeps_its_recorded_mode(goal_url, metric):
    board, values = _board(goal_url, *metric)
    assert (board["metric"], board["mode"]) == ("loss", "min")
    assert board["rows"][0]["trial_id"] == "mnist-00" and values == sorted(values)


def test_plot_takes_mode_for_another_metric(goal_url, tmp_path):
    path = str(tmp_path / "acc.png")
    args = ["--metric", "acc", "--mode", "max", "--out", path, "--json"]
    result = invoke("plot", EXPERIMENT, "--db-url", goal_url, *args)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["best_trial_id"] == "mnist-00"


def test_a_typo_still_names_the_reported_metrics_not_mode(goal_url):
    result = invoke("leaderboard", EXPERIMENT, "--db-url", goal_url, "--metric", "acu")
    assert result.exit_code == 1
    assert "its trials report acc, loss. Pass --metric with one of them." in result.stderr
