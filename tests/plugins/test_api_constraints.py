"""The dashboard's API for an experiment with constraints: its constraints on the experiment and
leaderboard endpoints, each row's feasible and violations, and feasible trials ranked first on
both boards; on a real trials DB (SQLite and PostgreSQL) filled through TrialStore."""

from __future__ import annotations

import pytest

from airflow_trials.store import TrialStore
from tests.contract.conftest import postgres_schema_url  # noqa: F401  (a fixture)
from tests.pareto_seed import EXPERIMENT, seed_pareto

# Of the seeded trials' last results only p-1 (latency 10) and p-8 (latency 1) meet it.
KEY = "latency <= 20.0"


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def seeded(request, tmp_path, make_dashboard):
    """(dashboard, run id, store to add the constraints with) over the seeded Pareto run."""
    from airflow_trials.store import TrialReader

    if request.param == "postgresql":
        url = request.getfixturevalue("postgres_schema_url")
    else:
        url = f"sqlite:///{tmp_path / 'trials.db'}"
    run = seed_pareto(url).run
    reader, store = TrialReader(url), TrialStore(url)
    yield make_dashboard(reader), run, store
    reader.dispose()
    store.dispose()


def _get(dashboard, path: str, **params):
    response = dashboard.get(path, params=params)
    assert response.status_code == 200, response.text
    return response.json()


def test_the_pareto_board_ranks_the_feasible_front_first(seeded):
    dashboard, run, store = seeded
    store.ensure_experiment(EXPERIMENT, constraints=["latency <= 20"])
    board = _get(dashboard, f"/api/runs/{run}/leaderboard")
    assert board["constraints"] == [KEY]
    assert board["front_trial_ids"] == ["p-1"]
    assert [(r["trial_id"], r["pareto_rank"], r["feasible"]) for r in board["rows"][:3]] == [
        ("p-1", 0, True),
        ("p-0", 1, False),
        ("p-3", 1, False),
    ]
    rows = {r["trial_id"]: r for r in board["rows"]}
    assert rows["p-0"]["violations"] == {KEY: 10.0}
    assert rows["p-6"]["violations"] == {KEY: None}  # NaN latency: not reported
    assert (rows["p-8"]["feasible"], rows["p-8"]["violations"]) == (True, {})


def test_one_metric_s_board_ranks_feasible_trials_first_and_picks_a_feasible_best(seeded):
    dashboard, run, store = seeded
    before = _get(dashboard, f"/api/runs/{run}/leaderboard", metric="val_acc")
    assert before["best_trial_id"] == "p-4" and before["constraints"] == []
    assert {r["feasible"] for r in before["rows"]} == {None}
    store.ensure_experiment(EXPERIMENT, constraints=["latency <= 20"])
    board = _get(dashboard, f"/api/runs/{run}/leaderboard", metric="val_acc")
    assert board["constraints"] == [KEY]
    # p-4's best val_acc (0.99) came with latency 5: it is judged on that result, not on its
    # last (too slow) one. p-0's best (0.9) came with latency 30.
    assert board["best_trial_id"] == "p-4"
    assert [(r["rank"], r["trial_id"], r["feasible"]) for r in board["rows"][:4]] == [
        (1, "p-4", True),
        (2, "p-1", True),
        (3, "p-8", True),
        (4, "p-5", False),
    ]
    assert board["rows"][0]["violations"] == {}
    assert next(r for r in board["rows"] if r["trial_id"] == "p-0")["violations"] == {KEY: 10.0}
    # A later page keeps the ranks of the whole, feasibility-first ranking.
    page = _get(dashboard, f"/api/runs/{run}/leaderboard", metric="val_acc", page=2, page_size=2)
    assert [(r["rank"], r["trial_id"]) for r in page["rows"]] == [(3, "p-8"), (4, "p-5")]


def test_the_experiment_endpoints_give_its_constraints(seeded):
    dashboard, _, store = seeded
    assert _get(dashboard, f"/api/experiments/{EXPERIMENT}")["constraints"] == []
    store.ensure_experiment(EXPERIMENT, constraints=["latency <= 20", "val_acc >= 0.5"])
    experiment = _get(dashboard, f"/api/experiments/{EXPERIMENT}")
    assert experiment["constraints"] == [KEY, "val_acc >= 0.5"]
    listed = {e["name"]: e for e in _get(dashboard, "/api/experiments")}
    assert listed[EXPERIMENT]["constraints"] == [KEY, "val_acc >= 0.5"]


def test_the_run_page_shows_each_trials_feasibility_and_what_it_missed(seeded):
    dashboard, run, store = seeded
    store.ensure_experiment(EXPERIMENT, constraints=["latency <= 20"])
    page = dashboard.get(f"/runs/{run}")
    assert page.status_code == 200
    html, shown = page.text, KEY.replace("<", "&lt;")

    def row(trial_id: str) -> str:
        start = html.index(f'data-trial="{trial_id}">')  # the table's row, not the chart's line
        return html[start : html.index("</tr>", start)]

    assert f'<th title="{shown}">feasible</th>' in html
    for trial_id, feasible in (("p-1", "yes"), ("p-8", "yes"), ("p-0", "no"), ("p-6", "no")):
        assert f'class="feasible feasible-{feasible}"' in row(trial_id), (trial_id, row(trial_id))
    assert f'title="{shown}: missed by 10"' in row("p-0")
    assert f'title="{shown}: not reported"' in row("p-6")
    one_metric = dashboard.get(f"/runs/{run}", params={"metric": "val_acc"}).text
    assert f'<th title="{shown}">feasible</th>' in one_metric and "Pareto rank" not in one_metric
