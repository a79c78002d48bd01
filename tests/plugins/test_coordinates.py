"""Parallel coordinates and slice plots of a run's trials: the JSON API, the page, its link from
the run page, the refusal of a user without access, and the edge cases (no trials, a config key
some trials lack, values that are not numbers, NaN and infinite metrics), on a real SQLite store
filled through TrialStore."""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime

import pytest

from airflow_trials.core.end import TrialEnd
from airflow_trials.core.fate import Transition
from airflow_trials.core.status import TrialStatus
from airflow_trials.plugins.charts.coordinates import parallel_coordinates_svg
from airflow_trials.plugins.charts.kit import ACCENT, ramp
from airflow_trials.plugins.datamodels.chart_scale import Scale
from airflow_trials.plugins.datamodels.coordinates import Axis, Coordinates, Line
from airflow_trials.store import ExperimentRunRecord
from airflow_trials.store.records import ExperimentRunStatus
from tests.factories import add_results

# trial -> (config, the metric's only value: None for no result)
EDGE: dict[str, tuple[dict, float | None]] = {
    "e-0": ({"lr": 0.001, "opt": "adam", "width": 64}, 0.5),
    "e-1": ({"lr": 0.1, "opt": "sgd"}, 0.3),  # no width
    "e-2": ({"lr": 1.0, "opt": "sgd", "width": "wide"}, math.nan),  # width: not a number
    "e-3": ({"lr": 0.01, "opt": "adam", "width": 32}, math.inf),
    "e-4": ({"lr": 0.05, "opt": {"name": "lamb"}, "width": 16, "flag": True}, 0.1),
    "e-5": ({"lr": 0.02, "opt": "sgd", "width": 8}, None),  # no result yet
}


def seed_edges(store) -> tuple[int, int]:
    """(the run of :data:`EDGE`, a run with no trials), both on DAG tune_mnist."""
    store.ensure_experiment("edges", metric="loss", mode="min")
    run = store.create_experiment_run("edges", "r1", dag_id="tune_mnist", run_id="r1")
    empty = store.create_experiment_run("edges", "r2", dag_id="tune_mnist", run_id="r2")
    for i, (trial_id, (config, loss)) in enumerate(EDGE.items()):
        store.upsert_trial(
            trial_id,
            trainable="pkg.train:fn",
            config=config,
            resources={"cpu": 1},
            max_failures=0,
            experiment_run_id=run,
            dag_id="tune_mnist",
            run_id="r1",
            task_id="edges.trial",
            map_index=i,
        )
        if loss is None:
            continue
        store.record_transition(trial_id, Transition.PLACED)
        add_results(store, trial_id, [{"training_iteration": 1, "loss": loss}])
        store.record_end(TrialEnd(trial_id, "edges", TrialStatus.TERMINATED))
    return run, empty


@pytest.fixture
def edges(dashboard, trials_store):
    run, empty = seed_edges(trials_store)
    return dashboard, run, empty


def _json(dashboard, path, **params):
    response = dashboard.get(path, params=params)
    assert response.status_code == 200, response.text
    return response.json()


def _points(svg: str) -> dict[str, list[tuple[int, int]]]:
    """trial id -> its polyline's points in the parallel-coordinates SVG."""
    found = re.findall(r'<polyline class="[^"]*" data-trial="([^"]+)"[^>]* points="([^"]+)"', svg)
    return {
        trial: [tuple(int(v) for v in p.split(",")) for p in points.split()]
        for trial, points in found
    }


def test_the_api_gives_the_axes_and_every_trials_values(dashboard):
    seeded = dashboard.seeded
    body = _json(dashboard, f"/api/runs/{seeded.run}/coordinates")
    assert (body["metric"], body["mode"], body["metrics"], body["top"]) == ("loss", "min", None, 10)
    axes = {a["key"]: a for a in body["axes"]}
    assert list(axes) == ["layers", "lr"]  # sorted by key
    # lr runs 0.1 / 12 .. 0.1: barely more than a decade, so linear.
    assert axes["lr"]["scale"] == "linear" and axes["lr"]["high"] == pytest.approx(0.1)
    assert (axes["layers"]["low"], axes["layers"]["high"], axes["layers"]["missing"]) == (0, 2, 0)
    trials = body["trials"]
    assert len(trials) == 12
    assert [t["trial_id"] for t in trials[:3]] == ["mnist-00", "mnist-01", "mnist-02"]
    assert [t["rank"] for t in trials] == list(range(1, 13))
    # The 11 trials with a value: the 10 that count (TERMINATED: docs/store.md "Which trials
    # count") are emphasised, not mnist-03 (ERROR); the running one has no value.
    assert [t["top"] for t in trials] == [True] * 3 + [False] + [True] * 7 + [False]
    assert trials[-1]["trial_id"] == "mnist-11" and trials[-1]["value"] is None
    assert trials[0]["params"] == {"lr": 0.1, "layers": 0}
    assert trials[0]["value"] == pytest.approx(0.1)  # 1 / 10 + 0.01 * 0
    assert body["metric_axis"]["missing"] == 1
    assert trials[0]["url"].endswith("/trials/mnist-00")


def test_another_metric_and_mode_colour_the_lines(dashboard):
    seeded = dashboard.seeded
    body = _json(dashboard, f"/api/runs/{seeded.run}/coordinates", metric="acc", mode="max")
    assert (body["metric"], body["mode"]) == ("acc", "max")
    assert body["trials"][0]["trial_id"] == "mnist-00"  # the highest acc
    assert body["trials"][0]["value"] == pytest.approx(1 - 0.1)


def test_the_edge_cases_get_categorical_log_and_missing_marks(edges):
    dashboard, run, _ = edges
    body = _json(dashboard, f"/api/runs/{run}/coordinates")
    axes = {a["key"]: a for a in body["axes"]}
    assert list(axes) == ["flag", "lr", "opt", "width"]
    assert axes["lr"]["scale"] == "log"  # 0.001 .. 1.0: three decades
    assert (axes["lr"]["low"], axes["lr"]["high"]) == (0.001, 1.0)
    assert axes["width"]["scale"] == "categorical"  # "wide" among numbers
    assert axes["width"]["categories"] == ["8", "16", "32", "64", "wide"]
    assert axes["width"]["missing"] == 1  # e-1
    assert axes["opt"]["categories"] == ["adam", "sgd", '{"name": "lamb"}']
    assert axes["flag"] == {
        "key": "flag",
        "scale": "categorical",
        "low": None,
        "high": None,
        "categories": ["true"],
        "missing": 5,
    }
    trials = {t["trial_id"]: t for t in body["trials"]}
    # NaN and inf are stored as no value; so is a trial without results.
    assert {t: trials[t]["value"] for t in ("e-2", "e-3", "e-5")} == dict.fromkeys(
        ("e-2", "e-3", "e-5")
    )
    assert [t["trial_id"] for t in body["trials"][:3]] == ["e-4", "e-1", "e-0"]
    assert body["metric_axis"]["low"] == 0.1 and body["metric_axis"]["high"] == 0.5
    assert body["metric_axis"]["missing"] == 3
    assert trials["e-1"]["params"] == {"lr": 0.1, "opt": "sgd"}


def test_the_page_draws_one_line_per_trial_and_the_missing_marks(edges):
    dashboard, run, _ = edges
    response = dashboard.get(f"/runs/{run}/coordinates")
    assert response.status_code == 200, response.text
    html = response.text
    lines = _points(html)
    assert set(lines) == set(EDGE)
    assert all(len(points) == 5 for points in lines.values())  # 4 keys + the metric
    axes_x = [x for x, _ in lines["e-0"]]
    assert axes_x == sorted(axes_x) and len(set(axes_x)) == 5
    # Without a key, a line goes to the mark below the axis; so does one without a value.
    bottom = max(y for points in lines.values() for _, y in points)
    assert lines["e-1"][3][1] == bottom and lines["e-0"][3][1] < bottom  # width
    assert lines["e-2"][4][1] == bottom and lines["e-5"][4][1] == bottom  # NaN, none
    assert "missing (1)" in html and "no value (3)" in html
    # lr on a log axis: 0.01 is two thirds of the way from 0.001 to 1.0.
    lr = {t: points[1][1] for t, points in lines.items()}
    top_y, low_y = lr["e-2"], lr["e-0"]
    assert lr["e-3"] == pytest.approx(low_y + (top_y - low_y) / 3, abs=1)
    # The best (lowest loss) is drawn last, in the accent colour; no-value lines first, grey.
    drawn = re.findall(r'<polyline class="([^"]+)" data-trial="([^"]+)" stroke="([^"]+)"', html)
    assert drawn[-1][1] == "e-4" and drawn[-1][0] == "trial top" and drawn[-1][2] == ACCENT
    assert {t for css, t, _ in drawn[:3]} == {"e-2", "e-3", "e-5"}
    assert all(css == "trial no-value" for css, _, _ in drawn[:3])
    assert 'class="axis-name"' in html and ">log</text>" in html and ">categories</text>" in html
    assert "<script>" not in html.split("</head>")[1]
    # The slice plot: the first key (flag) by default; only e-4 has it and a value.
    assert 'data-param="flag"' in html and html.count('<circle class="point') == 1


def test_the_slice_plot_of_a_key_on_a_log_axis(edges):
    dashboard, run, _ = edges
    html = dashboard.get(f"/runs/{run}/coordinates", params={"param": "lr"}).text
    points = re.findall(r'<circle class="(point[^"]*)" data-trial="([^"]+)" cx="(\d+)"', html)
    assert {t for _, t, _ in points} == {"e-0", "e-1", "e-4"}  # the trials with a value
    cx = {t: int(x) for _, t, x in points}
    assert cx["e-0"] < cx["e-4"] < cx["e-1"]
    assert "lr (log)" in html and "3 trial(s) without lr or a value not shown" in html
    assert 'class="param-link current" data-param="lr"' in html


def test_an_unknown_key_is_a_422_that_names_the_keys(edges):
    dashboard, run, empty = edges
    response = dashboard.get(f"/runs/{run}/coordinates", params={"param": "momentum"})
    assert response.status_code == 422
    assert "flag, lr, opt, width" in response.text
    assert dashboard.get(f"/runs/{empty}/coordinates", params={"param": "lr"}).status_code == 422


def test_a_run_without_trials(edges):
    dashboard, _, empty = edges
    body = _json(dashboard, f"/api/runs/{empty}/coordinates")
    assert (body["axes"], body["trials"], body["metric_axis"]) == ([], [], None)
    html = dashboard.get(f"/runs/{empty}/coordinates").text
    assert "No trials in this run yet." in html and "has no trials with a config yet" in html


def test_the_run_page_links_the_page(dashboard):
    run = dashboard.seeded.run
    html = dashboard.get(f"/runs/{run}").text
    assert f'href="/trials/runs/{run}/coordinates" class="coordinates-link"' in html


def test_a_user_without_access_is_refused(dashboard):
    run = dashboard.seeded.run
    for path in (f"/api/runs/{run}/coordinates", f"/runs/{run}/coordinates"):
        response = dashboard.get(path, user="bob")
        assert response.status_code == 403
        assert "User bob may not read" in response.text
    assert dashboard.get(f"/api/runs/{run}/coordinates", user=None).status_code == 401
    assert dashboard.get("/api/runs/999/coordinates").status_code == 404


def test_a_thousand_trials_stay_one_polyline_each_and_small():
    """1,000 trials: one <polyline> each, whole-pixel points, the SVG under 300 kB (the browser
    test draws 1,000 from a real store)."""
    run = ExperimentRunRecord(
        1, 1, "big", "r", None, None, None, None, None, ExperimentRunStatus.SUCCESS,
        datetime(2026, 11, 26, tzinfo=UTC), None,
    )  # fmt: skip
    found = Coordinates(
        run=run,
        metric="loss",
        mode="min",
        metrics=None,
        axes=[
            Axis("act", Scale.of(["relu", "gelu"]), 0),
            Axis("layers", Scale.of(list(range(7))), 0),
            Axis("lr", Scale.of([1e-5, 0.1]), 0),
        ],
        metric_scale=Scale.numeric([0.1, 1.099]),
        lines=[
            Line(
                f"t-{i:04d}",
                "TERMINATED",
                i + 1,
                {"lr": 10 ** (-5 + 4 * i / 999), "layers": i % 7, "act": ["relu", "gelu"][i % 2]},
                0.1 + i / 1000,
                i < 10,
            )
            for i in range(1000)
        ],
    )
    svg = parallel_coordinates_svg(found)
    assert svg.count("<polyline") == 1000 and svg.count('class="trial top"') == 10
    assert len(svg.encode()) < 300_000
    assert not re.search(r'points="[^"]*\.\d', svg)  # whole pixels


def test_the_colour_ramp_runs_from_dark_to_light():
    assert ramp(0.0) == "#440154" and ramp(1.0) == "#bddf26"
    assert ramp(-1) == ramp(0.0) and ramp(2) == ramp(1.0)
    assert Scale.numeric([5.0]).fraction(5.0) == 0.5
    assert Scale.numeric([1.0, 1000.0]).ticks() == [
        (0.0, "1"),
        (pytest.approx(1 / 3), "10"),
        (pytest.approx(2 / 3), "100"),
        (1.0, "1000"),
    ]


def test_a_run_past_the_cap_draws_its_best_trials_and_says_how_many_it_has(dashboard, monkeypatch):
    # The cap at 5 of the seeded run's 12 trials: the best 5 of the ranking, ranked as before.
    from airflow_trials.plugins.services import coordinates

    seeded = dashboard.seeded
    whole = _json(dashboard, f"/api/runs/{seeded.run}/coordinates")
    monkeypatch.setattr(coordinates, "MAX_LINES", 5)
    body = _json(dashboard, f"/api/runs/{seeded.run}/coordinates")
    assert (body["num_trials"], len(body["trials"])) == (12, 5)
    assert body["trials"] == whole["trials"][:5]
    page = dashboard.get(f"/runs/{seeded.run}/coordinates")
    assert page.status_code == 200
    assert "The best 5 of the run's 12 trials by loss (min)" in page.text
    assert len(_points(page.text)) == 5
