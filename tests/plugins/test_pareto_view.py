"""The Pareto scatter of a run with several metrics: its JSON API, the chart on the run page (the
front's step line, dominated and infeasible trials, a picked trial's label), the choice of axes,
and the refusals; on a real SQLite store filled through TrialStore (tests/pareto_seed.py)."""

from __future__ import annotations

import dataclasses
import re

import pytest

from airflow_trials.plugins.charts.pareto_chart import pareto_svg
from airflow_trials.plugins.data.queries import get_experiment_run
from airflow_trials.plugins.services.pareto_front import of_board
from tests.pareto_seed import EXPERIMENT, FRONT, METRICS, MODES, seed_pareto

# The seeded trials with both values (last result), and those without: p-5 has no latency, p-6
# a NaN one, p-7 no result and p-8 a string val_acc.
PLOTTED = {"p-0": (0.9, 30.0), "p-1": (0.8, 10.0), "p-2": (0.7, 40.0), "p-3": (0.9, 30.0)}
PLOTTED["p-4"] = (0.6, 50.0)


@pytest.fixture
def pareto(tmp_path, make_dashboard):
    """(dashboard, run id, a TrialStore on the same DB, the seeded one-metric dashboard's run)."""
    from airflow_trials.store import TrialReader, TrialStore

    url = f"sqlite:///{tmp_path / 'trials.db'}"
    run = seed_pareto(url).run
    reader, store = TrialReader(url), TrialStore(url)
    yield make_dashboard(reader), run, store
    reader.dispose()
    store.dispose()


def _json(dashboard, path, **params):
    response = dashboard.get(path, params=params)
    assert response.status_code == 200, response.text
    return response.json()


def _circles(html: str, css: str) -> dict[str, tuple[float, float]]:
    found = re.findall(
        rf'<circle class="point {css}" data-trial="([^"]+)" cx="([\d.]+)" cy="([\d.]+)"', html
    )
    return {t: (float(x), float(y)) for t, x, y in found}


def _step(html: str) -> list[tuple[float, float]]:
    points = re.search(r'<polyline class="front-step"[^>]* points="([^"]+)"', html)
    assert points is not None
    return [tuple(float(v) for v in p.split(",")) for p in points.group(1).split()]


def test_the_api_gives_each_trials_values_rank_and_the_front(pareto):
    dashboard, run, _ = pareto
    body = _json(dashboard, f"/api/runs/{run}/pareto")
    assert (body["x"], body["y"], body["metrics"], body["modes"]) == (
        "val_acc",
        "latency",
        ["val_acc", "latency"],
        ["max", "min"],
    )
    points = {p["trial_id"]: p for p in body["points"]}
    assert {t: (p["x"], p["y"]) for t, p in points.items()} == PLOTTED
    assert body["left_out"] == 4  # p-5, p-6 (NaN), p-7, p-8 (a string)
    assert sorted(t for t, p in points.items() if p["on_front"]) == FRONT
    assert sorted(t for t, p in points.items() if p["on_step"]) == FRONT
    assert points["p-4"]["pareto_rank"] == 2 and points["p-4"]["feasible"] is None
    assert body["constraints"] is False and body["picked_trial_id"] is None
    swapped = _json(dashboard, f"/api/runs/{run}/pareto", x="latency", y="val_acc")
    assert {p["trial_id"]: (p["y"], p["x"]) for p in swapped["points"]} == PLOTTED


def test_the_run_page_draws_the_front_as_a_step_line(pareto):
    dashboard, run, _ = pareto
    html = dashboard.get(f"/runs/{run}").text
    assert '<svg xmlns="http://www.w3.org/2000/svg" class="pareto"' in html
    front, dominated = _circles(html, "front"), _circles(html, "dominated")
    assert sorted(front) == FRONT and sorted(dominated) == ["p-2", "p-4"]
    assert "infeasible" not in re.sub(r"<p class=\"pareto-note\">.*?</p>", "", html, flags=re.S)
    # max val_acc to the right, min latency up: p-1 (0.8, 10) is left of and above p-0 (0.9, 30).
    assert front["p-1"][0] < front["p-0"][0] and front["p-1"][1] > front["p-0"][1]
    assert front["p-0"] == front["p-3"]  # the same values
    # The staircase: p-1, the corner (val_acc 0.8, latency 30), then p-0 and p-3.
    step = _step(html)
    assert step[0] == front["p-1"] and step[-1] == front["p-0"]
    assert step[1] == (front["p-1"][0], front["p-0"][1])
    assert "front (3)" in html and "4 trial(s) without both values not shown" in html
    assert "select_best has not picked a trial of this run" in html
    assert 'class="picked"' not in html


def test_the_recorded_pick_is_in_the_api_and_ringed_on_the_page(pareto):
    dashboard, run, store = pareto
    store.record_pick(run, "p-1")
    assert _json(dashboard, f"/api/runs/{run}/pareto")["picked_trial_id"] == "p-1"
    html = dashboard.get(f"/runs/{run}").text
    assert re.search(r'<g class="picked" data-trial="p-1">.*?picked: p-1</text></g>', html, re.S)
    assert "The trial select_best picked, p-1, is ringed." in html
    store.record_pick(run, "p-0")  # a later pick replaces it
    assert _json(dashboard, f"/api/runs/{run}/pareto")["picked_trial_id"] == "p-0"


def test_a_pick_outside_the_run_is_refused(pareto):
    from airflow_trials.exceptions import TrialNotFoundError

    dashboard, run, store = pareto
    other = store.create_experiment_run(EXPERIMENT, "another-run")
    store.upsert_trial(
        "elsewhere",
        trainable="pkg:fn",
        config={},
        resources={"cpu": 1},
        max_failures=0,
        experiment_run_id=other,
    )
    with pytest.raises(
        ValueError,
        match=rf"trial elsewhere belongs to experiment run {other}, "
        rf"not to run {run}; nothing was written",
    ):
        store.record_pick(run, "elsewhere")
    with pytest.raises(TrialNotFoundError, match="trial nope is not in the trial store"):
        store.record_pick(run, "nope")
    assert _json(dashboard, f"/api/runs/{run}/pareto")["picked_trial_id"] is None


def test_constraints_mark_the_infeasible_trials(pareto):
    dashboard, run, store = pareto
    store.ensure_experiment(EXPERIMENT, constraints=["latency <= 20"])
    body = _json(dashboard, f"/api/runs/{run}/pareto")
    assert body["constraints"] is True
    points = {p["trial_id"]: p for p in body["points"]}
    assert [t for t, p in points.items() if p["on_front"]] == ["p-1"]  # the only feasible one
    assert {t for t, p in points.items() if p["feasible"] is False} == {"p-0", "p-2", "p-3", "p-4"}
    html = dashboard.get(f"/runs/{run}").text
    crosses = re.findall(r'<path class="point infeasible" data-trial="([^"]+)"', html)
    assert sorted(crosses) == ["p-0", "p-2", "p-3", "p-4"]
    assert list(_circles(html, "front")) == ["p-1"] and _circles(html, "dominated") == {}
    assert len(_step(html)) == 1 and ">infeasible</text>" in html


def test_the_axes_can_be_chosen_and_must_be_two_metrics(pareto):
    dashboard, run, _ = pareto
    html = dashboard.get(f"/runs/{run}", params={"x": "latency", "y": "val_acc"}).text
    front = _circles(html, "front")
    assert front["p-1"][0] < front["p-0"][0]  # latency 10 left of 30 now
    assert "min latency</text>" in html
    for params, says in (
        ({"x": "loss"}, "?x= names no metric of experiment pareto_experiment"),
        ({"x": "latency", "y": "latency"}, "?x= and ?y= both name latency"),
    ):
        for path in (f"/api/runs/{run}/pareto", f"/runs/{run}"):
            response = dashboard.get(path, params=params)
            assert response.status_code == 422 and says in response.text


def test_a_run_with_one_metric_has_no_scatter(dashboard):
    run = dashboard.seeded.run
    response = dashboard.get(f"/api/runs/{run}/pareto")
    assert response.status_code == 404 and "has no Pareto front" in response.text
    assert 'class="pareto"' not in dashboard.get(f"/runs/{run}").text


def test_a_run_with_several_metrics_and_no_trials(pareto):
    dashboard, _, store = pareto
    empty = store.create_experiment_run(EXPERIMENT, "empty", dag_id="pareto", run_id="empty")
    body = _json(dashboard, f"/api/runs/{empty}/pareto")
    assert (body["points"], body["left_out"]) == ([], 0)
    assert "No trial has reported both val_acc and latency yet." in (
        dashboard.get(f"/runs/{empty}").text
    )


def test_a_user_without_access_is_refused(pareto):
    dashboard, run, _ = pareto
    for path in (f"/api/runs/{run}/pareto", f"/runs/{run}"):
        response = dashboard.get(path, user="bob")
        assert response.status_code == 403 and "User bob may not read" in response.text
    assert dashboard.get(f"/api/runs/{run}/pareto", user=None).status_code == 401
    assert dashboard.get("/api/runs/999/pareto").status_code == 404


def test_a_picked_trial_is_ringed_and_labelled(pareto):
    """The trials DB records no pick; given one, the chart marks it."""
    _, run, store = pareto
    record = get_experiment_run(store.reader, run)
    view = of_board(store.reader, record, METRICS, MODES, None, None)
    assert view.picked is None
    svg = pareto_svg(dataclasses.replace(view, picked="p-1"))
    assert re.search(r'<g class="picked" data-trial="p-1">.*picked: p-1</text></g>', svg)


def test_a_run_past_the_cap_is_a_409_that_names_the_reads_that_answer(pareto, monkeypatch):
    from airflow_trials.plugins.data import queries

    dashboard, run, _ = pareto
    monkeypatch.setattr(queries, "MAX_PARETO_TRIALS", 3)
    for path in (f"/api/runs/{run}/pareto", f"/api/runs/{run}/leaderboard", f"/runs/{run}"):
        response = dashboard.get(path)
        assert response.status_code == 409, path
        assert "up to 3 trials" in response.text and "?metric=val_acc" in response.text
    # One metric of the run is still ranked, in SQL.
    assert dashboard.get(f"/runs/{run}", params={"metric": "val_acc"}).status_code == 200
