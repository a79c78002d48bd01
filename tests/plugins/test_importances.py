"""The hyperparameter importances of a run on the dashboard: the JSON endpoint, the page and its
bar chart, the run page's link, the too-few-trials message, the choice of metric and evaluator,
and the per-DAG access check, on the conftest's seeded store behind Airflow's auth manager."""

from __future__ import annotations

import math
import random
import re
import sys
from html import unescape

import pytest

from airflow_trials.core.end import TrialEnd
from airflow_trials.core.status import TrialStatus
from airflow_trials.plugins.charts.importances import importances_svg
from tests.factories import add_results
from tests.plugins.conftest import HOSTILE


def seed_two_metrics(store, num_trials: int = 40) -> int:
    """Run "m1" of experiment "multi" (DAG tune_mnist), ranked by min loss and max acc: lr alone
    drives loss, dropout alone drives acc, act drives neither."""
    store.ensure_experiment("multi", metric=["loss", "acc"], mode=["min", "max"])
    run = store.create_experiment_run(
        "multi",
        "m1",
        dag_id="tune_mnist",
        run_id="m1",
        search_space={
            "lr": {"loguniform": [1e-4, 1e-1]},
            "act": {"choice": ["relu", "tanh", "gelu"]},
            "dropout": {"uniform": [0, 0.6]},
        },
    )
    rng = random.Random(7)
    for i in range(num_trials):
        trial_id = f"multi-{i:02d}"
        config = {
            "lr": 10 ** rng.uniform(-4, -1),
            "act": rng.choice(["relu", "tanh", "gelu"]),
            "dropout": rng.uniform(0, 0.6),
        }
        store.upsert_trial(
            trial_id,
            trainable="pkg.train:fn",
            config=config,
            resources={"cpu": 1},
            max_failures=0,
            experiment_run_id=run,
            dag_id="tune_mnist",
            run_id="m1",
            task_id="multi.trial",
            map_index=i,
        )
        loss = abs(math.log10(config["lr"]) + 2.5) + 0.01 * rng.random()
        acc = 1 - abs(config["dropout"] - 0.3) + 0.001 * rng.random()
        add_results(store, trial_id, [{"training_iteration": 1, "loss": loss, "acc": acc}])
        store.record_end(TrialEnd(trial_id, "multi", TrialStatus.TERMINATED))
    return run


def test_the_api_ranks_the_run_s_hyperparameters(dashboard):
    run = dashboard.seeded.run
    response = dashboard.get(f"/api/runs/{run}/importances")
    assert response.status_code == 200, response.text
    body = response.json()
    # The seeded loss rises with the trial's index, as lr falls: lr drives it, layers (i % 3) not.
    assert [p["name"] for p in body["importances"]] == ["lr", "layers"]
    shares = [p["importance"] for p in body["importances"]]
    assert shares[0] > shares[1] and sum(shares) == pytest.approx(1.0)
    # 12 trials: the one still running has no result yet, and mnist-03 ended in ERROR: neither
    # counts (docs/store.md "Which trials count"; mnist-03's loss counted before).
    assert (body["trials"], body["skipped"], body["constant"]) == (10, 2, [])
    assert (body["metric"], body["mode"], body["metrics"], body["evaluator"]) == (
        "loss",
        "min",
        ["loss"],
        "ped-anova",
    )
    lr = body["importances"][0]
    # The run's recorded search space, {"lr": [0.1, 0.01]}, is a fixed value: the values decide.
    assert (lr["kind"], lr["from_search_space"]) == ("float", False)
    # The lowest lr, 0.1 / 12, is the running trial's: left out.
    assert lr["low"] == pytest.approx(0.1 / 11) and lr["high"] == pytest.approx(0.1)
    assert body["run"]["id"] == run and body["run"]["url"].endswith(f"/trials/runs/{run}")

    fanova = dashboard.get(f"/api/runs/{run}/importances?evaluator=fanova").json()
    assert fanova["evaluator"] == "fanova" and fanova["importances"][0]["name"] == "lr"


def test_the_api_answers_409_with_the_reason_when_the_trials_cannot_tell_yet(dashboard):
    # The hostile run has one trial with a value: importances need two.
    run = dashboard.seeded.hostile_run
    response = dashboard.get(f"/api/runs/{run}/importances")
    assert response.status_code == 409
    detail = response.json()["detail"]
    assert f"run h1 (id {run}) of experiment hostile" in detail
    assert "0 of its 1 trials reported loss" in detail and "at least 2" in detail


def test_a_metric_of_several_is_picked_with_the_metric_parameter(dashboard, trials_store):
    run = seed_two_metrics(trials_store)
    first = dashboard.get(f"/api/runs/{run}/importances").json()
    assert (first["metric"], first["mode"], first["metrics"]) == ("loss", "min", ["loss", "acc"])
    assert first["importances"][0]["name"] == "lr"
    assert first["importances"][0]["log"] and first["importances"][0]["from_search_space"]

    acc = dashboard.get(f"/api/runs/{run}/importances?metric=acc").json()
    assert (acc["metric"], acc["mode"]) == ("acc", "max")  # the experiment's mode for acc
    assert acc["importances"][0]["name"] == "dropout"

    page = dashboard.get(f"/runs/{run}/importances?metric=acc").text
    assert re.search(r'class="metric-link current" aria-current="page" data-metric="acc"', page)
    assert f'href="/trials/runs/{run}/importances?metric=loss"' in page
    assert re.findall(r'<g class="importance" data-param="([^"]+)"', page)[0] == "dropout"

    run_page = dashboard.get(f"/runs/{run}").text  # the run page links each metric's importances
    assert f'href="/trials/runs/{run}/importances?metric=loss"' in run_page
    assert f'href="/trials/runs/{run}/importances?metric=acc"' in run_page


def test_the_page_draws_the_bars_most_important_first(dashboard):
    run = dashboard.seeded.run
    response = dashboard.get(f"/runs/{run}/importances")
    assert response.status_code == 200
    page = response.text
    assert '<svg xmlns="http://www.w3.org/2000/svg" class="importances"' in page
    assert re.findall(r'<g class="importance" data-param="([^"]+)"', page) == ["lr", "layers"]
    shown = [float(v) for v in re.findall(r'data-importance="([^"]+)"', page)]
    assert shown == sorted(shown, reverse=True)
    assert "From 10 of the run's 12 trials; 2 left out" in page  # the running and the ERROR one
    assert "<script" not in page.replace("<script>(function(){", "")  # only the theme script
    assert 'class="evaluator-link current" aria-current="page" data-evaluator="ped-anova"' in page
    assert f'href="/trials/runs/{run}/importances?evaluator=fanova"' in page

    run_page = dashboard.get(f"/runs/{run}").text
    assert f'href="/trials/runs/{run}/importances?metric=loss"' in run_page


def test_the_page_shows_the_reason_in_place_of_the_chart(dashboard):
    run = dashboard.seeded.hostile_run
    response = dashboard.get(f"/runs/{run}/importances")
    assert response.status_code == 200
    assert 'class="importances"' not in response.text  # no chart, no table
    problem = re.search(r'<p class="importances-problem error"[^>]*>([^<]+)</p>', response.text)
    assert problem is not None
    assert "0 of its 1 trials reported loss" in problem.group(1)


def test_fanova_without_scikit_learn_is_501_and_says_how_to_install_it(dashboard, monkeypatch):
    monkeypatch.setitem(sys.modules, "sklearn", None)  # as if it were not installed
    run = dashboard.seeded.run
    response = dashboard.get(f"/api/runs/{run}/importances?evaluator=fanova")
    assert response.status_code == 501
    assert "pip install 'scikit-learn>=1.5'" in response.json()["detail"]
    page = dashboard.get(f"/runs/{run}/importances?evaluator=fanova").text
    assert "fANOVA needs scikit-learn" in page
    assert dashboard.get(f"/api/runs/{run}/importances").status_code == 200  # ped-anova does


@pytest.mark.parametrize("path", ["/api/runs/{run}/importances", "/runs/{run}/importances"])
def test_a_user_not_allowed_on_the_dag_is_refused(dashboard, path):
    url = path.format(run=dashboard.seeded.run)
    response = dashboard.get(url, user="bob")
    assert response.status_code == 403
    assert "User bob may not read" in response.text and "DAG tune_mnist" in response.text
    assert dashboard.get(url, user=None).status_code == 401
    assert dashboard.get(url, user="alice").status_code == 200
    # bob's own DAG: the run has one trial, so he is told why, not refused.
    other = path.format(run=dashboard.seeded.other_run)
    answer = dashboard.get(other, user="bob")
    assert answer.status_code == (409 if path.startswith("/api/") else 200)
    assert "0 of its 1 trials reported loss" in answer.text


def test_bad_parameters_are_422_and_an_unknown_run_404(dashboard):
    run = dashboard.seeded.run
    response = dashboard.get(f"/api/runs/{run}/importances?evaluator=shap")
    assert response.status_code == 422 and "evaluator" in response.text
    assert dashboard.get("/api/runs/999/importances").status_code == 404


def test_the_chart_escapes_names_cuts_long_ones_and_sorts_the_bars():
    long_name = "optimizer/" + "x" * 60
    svg = importances_svg(
        [("noise", 0.05), (HOSTILE, 0.15), ("lr", 0.7), (long_name, 0.1)], title=f"t {HOSTILE}"
    )
    assert "<script>" not in svg and "&lt;script&gt;" in svg
    assert re.findall(r'data-param="([^"]+)"', svg) == [
        "lr",
        "&lt;script&gt;alert(1)&lt;/script&gt;",
        long_name,
        "noise",
    ]
    labels = [unescape(t) for t in re.findall(r'<text class="param"[^>]*>([^<]+)</text>', svg)]
    assert max(len(label) for label in labels) <= 36 and labels[2].endswith("…")
    assert f"<title>{long_name}: 0.1</title>" in svg  # the whole name on hover
    widths = [float(w) for w in re.findall(r'<rect class="bar"[^>]* width="([^"]+)"', svg)]
    assert widths == sorted(widths, reverse=True) and widths[0] > 4 * widths[-1]
    assert "No hyperparameter to rank." in importances_svg([], title="none")


def test_the_openapi_schema_lists_the_endpoint_and_not_the_page(dashboard):
    schema = dashboard.client.get("/trials/openapi.json").json()
    assert "/api/runs/{run_pk}/importances" in schema["paths"]
    assert "/runs/{run_pk}/importances" not in schema["paths"]
    responses = schema["paths"]["/api/runs/{run_pk}/importances"]["get"]["responses"]
    assert {"200", "409", "501", "422"} <= set(responses)
    models = schema["components"]["schemas"]
    assert {"ImportancesOut", "ParamImportanceOut"} <= set(models)
    assert "evaluator" in models["ImportancesOut"]["properties"]


def test_a_run_past_the_cap_is_a_409_that_points_to_the_cli(dashboard, monkeypatch):
    from airflow_trials.plugins.services import importances

    run = dashboard.seeded.run
    monkeypatch.setattr(importances, "MAX_TRIALS", 11)
    response = dashboard.get(f"/api/runs/{run}/importances")
    assert response.status_code == 409
    detail = response.json()["detail"]
    assert f"Run {run} of experiment mnist has 12 trials" in detail
    assert f"airflow-trials importances mnist --run {run} --metric loss" in detail
    page = dashboard.get(f"/runs/{run}/importances")
    assert page.status_code == 200 and "at most 11" in page.text
