"""airflow-trials leaderboard of an experiment with several metrics: trials ranked by Pareto rank
over their last results, on a real trials DB (SQLite and PostgreSQL) filled through TrialStore."""

from __future__ import annotations

import json
import math

import pytest
from typer.testing import CliRunner

from airflow_trials.cli import app
from tests.contract.conftest import postgres_schema_url  # noqa: F401  (a fixture)
from tests.pareto_seed import (
    EXPERIMENT,
    FRONT,
    HISTORIES,
    METRICS,
    MODES,
    ORDER,
    RANKS,
    RUN_KEY,
    seed_pareto,
)

runner = CliRunner()


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def pareto_url(request, tmp_path) -> str:
    if request.param == "postgresql":
        url = request.getfixturevalue("postgres_schema_url")
    else:
        url = f"sqlite:///{tmp_path / 'trials.db'}"
    return seed_pareto(url).url


def invoke(*args: str):
    return runner.invoke(app, list(args))


def _finite(value: object) -> float | None:
    return value if isinstance(value, float) and math.isfinite(value) else None


def _last(trial_id: str) -> dict[str, object]:
    return HISTORIES[trial_id][-1] if HISTORIES[trial_id] else {}


def test_json_ranks_by_pareto_rank_then_the_first_metric_and_names_the_front(pareto_url):
    result = invoke("leaderboard", EXPERIMENT, "--db-url", pareto_url, "--output", "json")
    assert result.exit_code == 0, result.output
    board = json.loads(result.stdout)
    assert (board["experiment"], board["run_key"]) == (EXPERIMENT, RUN_KEY)
    assert (board["metrics"], board["modes"]) == (METRICS, MODES)
    assert board["front_trial_ids"] == FRONT
    assert [row["trial_id"] for row in board["rows"]] == ORDER
    for row in board["rows"]:
        trial_id = row["trial_id"]
        assert row["pareto_rank"] == RANKS.get(trial_id), trial_id
        assert row["on_front"] is (trial_id in FRONT)
        last = _last(trial_id)
        expected = {m: _finite(last.get(m)) for m in METRICS}
        assert row["values"] == expected, trial_id  # the last result's, NaN and strings as null
        history = HISTORIES[trial_id]
        assert row["iteration"] == (len(history) or None)
        assert row["latest_checkpoint"] == (f"/ckpt/{trial_id}/{len(history)}" if history else None)
    # The trial whose best val_acc (0.99) came from an earlier result is placed by its last one.
    p4 = next(row for row in board["rows"] if row["trial_id"] == "p-4")
    assert p4["values"] == {"val_acc": 0.6, "latency": 50.0} and p4["pareto_rank"] == 2


def test_the_front_is_the_one_result_grid_gives(pareto_url):
    from airflow_trials.results import ResultGrid

    grid = ResultGrid.from_db(EXPERIMENT, db_url=pareto_url)
    board = json.loads(invoke("leaderboard", EXPERIMENT, "--db-url", pareto_url, "--json").stdout)
    assert board["front_trial_ids"] == sorted(r.trial_id for r in grid.get_pareto_front())
    import pandas as pd

    ranks = grid.get_dataframe().set_index("trial_id")["pareto_rank"]
    expected = {t: None if pd.isna(rank) else int(rank) for t, rank in ranks.items()}
    assert {row["trial_id"]: row["pareto_rank"] for row in board["rows"]} == expected


def test_a_limit_cuts_the_rows_but_not_the_front(pareto_url):
    result = invoke("leaderboard", EXPERIMENT, "--db-url", pareto_url, "--json", "--limit", "2")
    board = json.loads(result.stdout)
    assert [row["trial_id"] for row in board["rows"]] == ORDER[:2]
    assert board["front_trial_ids"] == FRONT


def test_plain_has_a_column_per_metric_the_pareto_rank_and_the_front(pareto_url):
    result = invoke("leaderboard", EXPERIMENT, "--db-url", pareto_url, "--output", "plain")
    assert result.exit_code == 0, result.output
    header, *lines = [line.split("\t") for line in result.stdout.splitlines()]
    assert header == [
        "rank",
        "trial",
        "width",
        "status",
        "failures",
        "last val_acc",
        "last latency",
        "pareto rank",
        "front",
        "iteration",
        "latest checkpoint",
    ]
    cells = {line[1]: dict(zip(header, line, strict=True)) for line in lines}
    assert [line[1] for line in lines] == ORDER
    assert [line[0] for line in lines] == [str(i) for i in range(1, len(ORDER) + 1)]
    assert cells["p-1"]["last val_acc"] == "0.8" and cells["p-1"]["last latency"] == "10"
    # The column shows what its heading says: p-4's last val_acc, not its best (0.99).
    assert cells["p-4"]["last val_acc"] == "0.6" and cells["p-4"]["last latency"] == "50"
    assert [t for t, c in cells.items() if c["front"] == "yes"] == ["p-0", "p-3", "p-1"]
    assert {t: c["pareto rank"] for t, c in cells.items()} == {
        t: str(RANKS[t]) if t in RANKS else "-" for t in ORDER
    }
    assert cells["p-5"]["last latency"] == "-" and cells["p-7"]["iteration"] == "-"


def test_the_table_titles_the_front_and_shows_every_metric(pareto_url):
    result = invoke("leaderboard", EXPERIMENT, "--db-url", pareto_url)
    assert result.exit_code == 0, result.output
    text = result.stdout
    assert "Pareto front of max val_acc, min latency" in text
    for column in ("last val_acc", "last latency", "pareto rank", "front"):
        assert column in text
    assert text.index("p-0") < text.index("p-3") < text.index("p-1") < text.index("p-2")


def test_one_metric_of_several_ranks_as_one_metric_in_the_experiment_s_mode(pareto_url):
    result = invoke(
        "leaderboard", EXPERIMENT, "--db-url", pareto_url, "--metric", "latency", "--json"
    )
    assert result.exit_code == 0, result.output
    board = json.loads(result.stdout)
    assert (board["metric"], board["mode"]) == ("latency", "min")
    best = [(row["trial_id"], row["best_value"]) for row in board["rows"][:3]]
    assert best == [("p-8", 1.0), ("p-4", 5.0), ("p-1", 10.0)]  # every result counts here


def test_mode_without_metric_is_refused_with_the_fix(pareto_url):
    result = invoke("leaderboard", EXPERIMENT, "--db-url", pareto_url, "--mode", "min")
    assert result.exit_code == 1
    assert "--mode min goes with --metric" in result.stderr
    assert "max val_acc, min latency" in result.stderr


def test_plot_asks_for_one_of_the_metrics(pareto_url, tmp_path):
    result = invoke("plot", EXPERIMENT, "--db-url", pareto_url, "--out", str(tmp_path / "c.png"))
    assert result.exit_code == 1
    assert "ranks trials by several metrics (max val_acc, min latency)" in result.stderr
    assert "pass --metric with one of them" in result.stderr


def test_experiments_list_the_metrics_and_modes(pareto_url):
    result = invoke("experiments", "--db-url", pareto_url, "--json")
    assert result.exit_code == 0, result.output
    (experiment,) = json.loads(result.stdout)
    assert (experiment["metric"], experiment["mode"]) == (METRICS, MODES)
    plain = invoke("experiments", "--db-url", pareto_url, "-o", "plain").stdout.splitlines()
    assert plain[1].split("\t")[:3] == [EXPERIMENT, "val_acc, latency", "max, min"]


def test_trials_show_the_best_of_the_first_metric(pareto_url):
    result = invoke("trials", EXPERIMENT, "--db-url", pareto_url, "--json")
    assert result.exit_code == 0, result.output
    rows = {row["trial_id"]: row for row in json.loads(result.stdout)["trials"]}
    assert rows["p-4"]["best_val_acc"] == 0.99 and rows["p-8"]["best_val_acc"] is None


def test_trials_of_several_metrics_give_each_metric_s_last_value_and_the_pareto_rank(pareto_url):
    board = json.loads(invoke("trials", EXPERIMENT, "--db-url", pareto_url, "--json").stdout)
    rows = {row["trial_id"]: row for row in board["trials"]}
    assert sorted(rows) == sorted(HISTORIES)
    for trial_id, row in rows.items():
        last = _last(trial_id)
        assert row["values"] == {m: _finite(last.get(m)) for m in METRICS}, trial_id
        assert row["pareto_rank"] == RANKS.get(trial_id), trial_id
    assert rows["p-4"]["best_val_acc"] == 0.99  # the first metric's best over all its results
    table = invoke("trials", EXPERIMENT, "--db-url", pareto_url, "--output", "plain")
    assert table.exit_code == 0, table.output
    header, *lines = table.stdout.splitlines()
    for column in ("best val_acc", "last val_acc", "last latency", "pareto rank"):
        assert column in header
    p4 = next(line for line in lines if line.startswith("p-4"))
    assert "0.99" in p4 and "50" in p4


def test_the_main_job_s_progress_and_report_of_several_metrics(pareto_url, tmp_path):
    """`airflow-trials run` of a DAG with several metrics: its live table's best column is the
    first metric's, and its closing report prints the Pareto leaderboard and plots the first
    metric's learning curves (it used to stop at "pass --metric")."""
    from types import SimpleNamespace

    from airflow_trials.cli.common import out
    from airflow_trials.cli.mainjob_cmd import _progress_table, _report
    from airflow_trials.store import TrialReader

    store = TrialReader(pareto_url)
    table = _progress_table(store, EXPERIMENT, RUN_KEY, "running")
    best = dict(zip(table.columns[0]._cells, table.columns[3]._cells, strict=True))
    assert best["p-4"] == "0.99" and best["p-7"] == "-"
    stack = SimpleNamespace(trials_db_url=pareto_url, home=tmp_path)
    with out.capture() as captured:
        code = _report(stack, EXPERIMENT, RUN_KEY, "success", str(tmp_path / "curves.png"))
    text = captured.get()
    assert code == 0
    assert text.rstrip().endswith(f"leaderboard {EXPERIMENT} --run {RUN_KEY}")  # how to read it
    assert "Pareto front of max val_acc, min latency" in text
    assert "Learning curves:" in text and (tmp_path / "curves.png").exists()
