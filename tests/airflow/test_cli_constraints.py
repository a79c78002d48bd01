"""airflow-trials leaderboard of an experiment with constraints: a feasible column, feasible
trials first on both boards, and the constraints and each row's violations in JSON; on a real
trials DB (SQLite and PostgreSQL) filled through TrialStore."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from airflow_trials.cli import app
from airflow_trials.store import TrialStore
from tests.contract.conftest import postgres_schema_url  # noqa: F401  (a fixture)
from tests.pareto_seed import EXPERIMENT, seed_pareto

runner = CliRunner()
# Of the seeded trials' last results only p-1 (latency 10) and p-8 (latency 1) meet it.
KEY = "latency <= 20.0"


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def seeded_url(request, tmp_path) -> str:
    if request.param == "postgresql":
        url = request.getfixturevalue("postgres_schema_url")
    else:
        url = f"sqlite:///{tmp_path / 'trials.db'}"
    return seed_pareto(url).url


@pytest.fixture
def constrained_url(seeded_url) -> str:
    store = TrialStore(seeded_url)
    try:
        store.ensure_experiment(EXPERIMENT, constraints=["latency <= 20"])
    finally:
        store.dispose()
    return seeded_url


def invoke(*args: str):
    result = runner.invoke(app, list(args))
    assert result.exit_code == 0, result.output
    return result


def test_json_of_the_pareto_board_carries_the_constraints_and_each_row_s_feasibility(
    constrained_url,
):
    board = json.loads(
        invoke("leaderboard", EXPERIMENT, "--db-url", constrained_url, "--json").stdout
    )
    assert board["constraints"] == [KEY]
    assert board["front_trial_ids"] == ["p-1"]
    rows = {row["trial_id"]: row for row in board["rows"]}
    assert [row["trial_id"] for row in board["rows"]][:3] == ["p-1", "p-0", "p-3"]
    assert (rows["p-1"]["feasible"], rows["p-1"]["violations"]) == (True, {})
    assert (rows["p-0"]["feasible"], rows["p-0"]["violations"]) == (False, {KEY: 10.0})
    assert rows["p-5"]["violations"] == {KEY: None}  # no latency reported


def test_the_board_s_front_is_the_one_result_grid_gives_from_the_stored_constraints(
    constrained_url,
):
    from airflow_trials.results import ResultGrid

    grid = ResultGrid.from_db(EXPERIMENT, db_url=constrained_url)
    assert grid.constraints.spec == [KEY]  # read back from the trials DB
    board = json.loads(
        invoke("leaderboard", EXPERIMENT, "--db-url", constrained_url, "--json").stdout
    )
    assert board["front_trial_ids"] == sorted(r.trial_id for r in grid.get_pareto_front())


def test_the_table_has_a_feasible_column_only_with_constraints(seeded_url):
    plain = ["leaderboard", EXPERIMENT, "--db-url", seeded_url, "--output", "plain"]
    header, *_ = invoke(*plain).stdout.splitlines()
    assert "feasible" not in header.split("\t")
    store = TrialStore(seeded_url)
    try:
        store.ensure_experiment(EXPERIMENT, constraints=["latency <= 20"])
    finally:
        store.dispose()
    header, *lines = invoke(*plain).stdout.splitlines()
    columns = header.split("\t")
    feasible = {
        cells[columns.index("trial")]: cells[columns.index("feasible")]
        for cells in (line.split("\t") for line in lines)
    }
    assert feasible == {f"p-{i}": "yes" if i in (1, 8) else "no" for i in range(9)}


def test_one_metric_s_board_ranks_feasible_trials_first(constrained_url):
    args = ["leaderboard", EXPERIMENT, "--db-url", constrained_url, "--metric", "val_acc"]
    board = json.loads(invoke(*args, "--json").stdout)
    assert board["constraints"] == [KEY]
    # p-4's best val_acc (0.99) came with latency 5: judged on that result, it is feasible,
    # though its last result is too slow (docs/store.md "Constraints").
    assert [(row["trial_id"], row["feasible"]) for row in board["rows"][:4]] == [
        ("p-4", True),
        ("p-1", True),
        ("p-8", True),
        ("p-5", False),
    ]
    rows = {row["trial_id"]: row for row in board["rows"]}
    assert rows["p-0"]["violations"] == {KEY: 10.0}  # its best (0.9) came with latency 30
    header, first, *_ = invoke(*args, "--output", "plain").stdout.splitlines()
    columns = header.split("\t")
    assert first.split("\t")[columns.index("feasible")] == "yes"


def test_without_constraints_json_says_so(seeded_url):
    args = ["leaderboard", EXPERIMENT, "--db-url", seeded_url, "--metric", "val_acc", "--json"]
    board = json.loads(invoke(*args).stdout)
    assert board["constraints"] == []
    assert {(row["feasible"], row["violations"]) for row in board["rows"]} == {(None, None)}


@pytest.mark.parametrize("constrained", [False, True])
def test_a_limited_board_names_the_whole_board_s_best_and_front(seeded_url, constrained):
    # With --limit only the rows shown are read; the best and the front, read in SQL
    # (TrialReader.ranked_page), are still those of every trial.
    if constrained:
        store = TrialStore(seeded_url)
        try:
            store.ensure_experiment(EXPERIMENT, constraints=["latency <= 20"])
        finally:
            store.dispose()
    args = ["leaderboard", EXPERIMENT, "--db-url", seeded_url, "--metric", "val_acc", "--json"]
    whole = json.loads(invoke(*args).stdout)
    for limit in ("1", "3"):
        limited = json.loads(invoke(*args, "--limit", limit).stdout)
        assert limited["rows"] == whole["rows"][: int(limit)]
        assert limited["best_trial_id"] == whole["best_trial_id"] is not None
        assert limited["front_trial_ids"] == whole["front_trial_ids"] != []
