"""The dashboard's leaderboard API for an experiment with several metrics: Pareto rank, each
metric's value and the front, on a real trials DB (SQLite and PostgreSQL) filled through
TrialStore."""

from __future__ import annotations

import pytest

from tests.contract.conftest import postgres_schema_url  # noqa: F401  (a fixture)
from tests.pareto_seed import EXPERIMENT, FRONT, METRICS, MODES, ORDER, RANKS, seed_pareto


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def pareto_dashboard(request, tmp_path, make_dashboard):
    from airflow_trials.store import TrialReader

    if request.param == "postgresql":
        url = request.getfixturevalue("postgres_schema_url")
    else:
        url = f"sqlite:///{tmp_path / 'trials.db'}"
    seeded = seed_pareto(url)
    reader = TrialReader(url)
    yield make_dashboard(reader), seeded.run
    reader.dispose()


def _html_row(html: str, trial_id: str) -> str:
    """The run page's leaderboard row of ``trial_id``."""
    start = html.index(f'data-trial="{trial_id}">')  # the table's row, not the chart's line
    return html[start : html.index("</tr>", start)]


def _board(dashboard, run: int, **params):
    response = dashboard.get(f"/api/runs/{run}/leaderboard", params=params)
    assert response.status_code == 200, response.text
    return response.json()


def test_the_leaderboard_of_several_metrics_gives_ranks_values_and_the_front(pareto_dashboard):
    dashboard, run = pareto_dashboard
    board = _board(dashboard, run)
    assert (board["metrics"], board["modes"]) == (METRICS, MODES)
    assert (board["metric"], board["mode"]) == ("val_acc", "max")  # the first: the tie-break
    # The run board's best (select_best's without a pick): the front's best val_acc.
    assert board["front_trial_ids"] == FRONT and board["best_trial_id"] == ORDER[0]
    assert [row["trial_id"] for row in board["rows"]] == ORDER
    assert [row["rank"] for row in board["rows"]] == list(range(1, len(ORDER) + 1))
    rows = {row["trial_id"]: row for row in board["rows"]}
    assert {t: row["pareto_rank"] for t, row in rows.items()} == {t: RANKS.get(t) for t in ORDER}
    assert {t for t, row in rows.items() if row["on_front"]} == set(FRONT)
    assert rows["p-4"]["values"] == {"val_acc": 0.6, "latency": 50.0}  # its last result
    assert rows["p-4"]["iteration"] == 2
    assert rows["p-6"]["values"] == {"val_acc": 0.95, "latency": None}  # NaN is stored as null
    assert rows["p-4"]["best_checkpoint"]["path"] == "/ckpt/p-4/2"  # the newest kept
    assert rows["p-7"]["values"] == {"val_acc": None, "latency": None}
    assert rows["p-7"]["best_checkpoint"] is None


def test_pages_and_descending_order_keep_the_ranks_and_the_front(pareto_dashboard):
    dashboard, run = pareto_dashboard
    second = _board(dashboard, run, page=2, page_size=3)
    assert [row["trial_id"] for row in second["rows"]] == ORDER[3:6]
    assert [row["rank"] for row in second["rows"]] == [4, 5, 6]
    assert second["front_trial_ids"] == FRONT and second["total"] == len(ORDER)
    reverse = _board(dashboard, run, order="desc")
    ranked = [t for t in ORDER if t in RANKS]
    assert [row["trial_id"] for row in reverse["rows"]] == ranked[::-1] + ORDER[len(ranked) :]


def test_one_metric_of_several_ranks_as_one_metric_in_its_mode(pareto_dashboard):
    dashboard, run = pareto_dashboard
    board = _board(dashboard, run, metric="latency")
    assert (board["metric"], board["mode"], board["metrics"]) == ("latency", "min", None)
    assert board["front_trial_ids"] is None
    assert [row["trial_id"] for row in board["rows"][:3]] == ["p-8", "p-4", "p-1"]
    assert all(row["pareto_rank"] is None and row["values"] is None for row in board["rows"])


def test_mode_without_metric_is_a_422_that_says_the_fix(pareto_dashboard):
    dashboard, run = pareto_dashboard
    response = dashboard.get(f"/api/runs/{run}/leaderboard", params={"mode": "min"})
    assert response.status_code == 422
    assert "?mode=min goes with ?metric=" in response.json()["detail"]


def test_the_experiment_lists_its_metrics_and_the_run_page_renders(pareto_dashboard):
    dashboard, run = pareto_dashboard
    experiment = dashboard.get(f"/api/experiments/{EXPERIMENT}").json()
    assert (experiment["metric"], experiment["mode"]) == (None, None)
    assert (experiment["metrics"], experiment["modes"]) == (METRICS, MODES)
    curves = dashboard.get(f"/api/runs/{run}/curves").json()
    assert (curves["metric"], curves["mode"]) == ("val_acc", "max")
    page = dashboard.get(f"/runs/{run}")
    assert page.status_code == 200 and "p-0" in page.text
    html = page.text
    # Each metric's column holds the trial's last value (what the Pareto ranks are taken over), and
    # its heading says so; the mode is in its title.
    assert ">last val_acc</th>" in html and ">last latency</th>" in html and "Pareto rank" in html
    assert 'title="the last value; mode max">last val_acc' in html
    assert "feasible</th>" not in html  # no constraints, no column
    for trial_id in ORDER:
        row = _html_row(html, trial_id)
        on_front = '<td class="front">yes</td>' in row
        assert on_front is (trial_id in FRONT), (trial_id, row)
        rank = RANKS.get(trial_id)
        assert f'<td class="num pareto-rank">{"-" if rank is None else rank}</td>' in row, row
    assert '<td class="num metric">50</td>' in _html_row(html, "p-4")  # its last latency
    trial = dashboard.get("/api/trials/p-0")
    assert trial.status_code == 200 and trial.json()["best_iteration"] == 2
