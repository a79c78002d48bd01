"""The dashboard's JSON API against a real SQLite trials store holding experiment data."""

from __future__ import annotations

import pytest

from airflow_trials.core.stop_kind import StopKind
from tests.factories import update_trial
from tests.plugins.conftest import TRACEBACK, _loss
from tests.scheduler_writes import OneWriteEach


def _ranking(dashboard, run, **params):
    rows, page = [], 1
    while True:
        body = dashboard.get(
            f"/api/runs/{run}/leaderboard", params={**params, "page": page, "page_size": 5}
        ).json()
        rows += body["rows"]
        if page >= body["pages"]:
            return body, rows
        page += 1


def test_experiments_list_the_runs_with_their_trial_counts(dashboard):
    body = dashboard.get("/api/experiments").json()
    assert [e["name"] for e in body] == ["mnist", "secret", "hostile"]
    mnist = body[0]
    assert (mnist["metric"], mnist["mode"]) == ("loss", "min")
    assert [(r["run_key"], r["dag_id"], r["num_trials"], r["status"]) for r in mnist["runs"]] == [
        ("manual__2026-11-21", "tune_mnist", 12, "RUNNING")
    ]
    assert mnist["runs"][0]["url"] == f"/trials/runs/{dashboard.seeded.run}"
    assert dashboard.get("/api/experiments/mnist").json() == mnist


def test_leaderboard_pages_through_the_full_ranking_of_the_store(dashboard, trials_store):
    body, rows = _ranking(dashboard, dashboard.seeded.run)
    assert (body["total"], body["pages"], body["metric"], body["mode"]) == (12, 3, "loss", "min")
    expected = trials_store.reader.leaderboard(dashboard.seeded.run, "loss", "min")
    assert [r["trial_id"] for r in rows] == [r.trial_id for r in expected]
    assert [r["rank"] for r in rows] == list(range(1, 13))
    assert rows[0]["trial_id"] == body["best_trial_id"] == "mnist-00"
    assert rows[0]["best_value"] == pytest.approx(_loss(0, 10)) and rows[0]["best_iteration"] == 10
    assert rows[0]["best_checkpoint"]["path"] == "/ckpt/mnist-00/10"
    assert rows[0]["config"] == {"lr": 0.1, "layers": 0}
    assert rows[-1]["trial_id"] == "mnist-11" and rows[-1]["best_value"] is None  # no results: last
    assert body["status_counts"] == {"TERMINATED": 10, "ERROR": 1, "RUNNING": 1}
    assert body["config_keys"] == ["layers", "lr"]


def test_leaderboard_sorts_on_the_server_and_keeps_the_ranks(dashboard):
    _, by_metric = _ranking(dashboard, dashboard.seeded.run)
    rank = {r["trial_id"]: r["rank"] for r in by_metric}
    _, reverse = _ranking(dashboard, dashboard.seeded.run, order="desc")
    assert [r["trial_id"] for r in reverse] == [r["trial_id"] for r in by_metric[:-1]][::-1] + [
        "mnist-11"
    ]
    _, by_id = _ranking(dashboard, dashboard.seeded.run, sort="trial_id", order="desc")
    assert [r["trial_id"] for r in by_id] == sorted(rank, reverse=True)
    assert all(r["rank"] == rank[r["trial_id"]] for r in by_id)
    _, by_failures = _ranking(dashboard, dashboard.seeded.run, sort="failures", order="desc")
    assert (
        by_failures[0]["trial_id"] == dashboard.seeded.failed_trial
        and by_failures[0]["num_failures"] == 1
    )


def test_leaderboard_ranks_by_another_metric_and_mode(dashboard):
    _, rows = _ranking(dashboard, dashboard.seeded.run, metric="acc", mode="max")
    assert rows[0]["trial_id"] == "mnist-00"
    assert rows[0]["best_value"] == pytest.approx(1 - _loss(0, 10))
    values = [r["best_value"] for r in rows if r["best_value"] is not None]
    assert values == sorted(values, reverse=True)


def test_curves_return_the_best_trials_per_iteration(dashboard):
    body = dashboard.get(f"/api/runs/{dashboard.seeded.run}/curves", params={"top": 3}).json()
    assert body["best_trial_id"] == "mnist-00" and body["metric"] == "loss"
    assert list(body["curves"]) == ["mnist-00", "mnist-01", "mnist-02"]
    assert body["curves"]["mnist-01"] == [[it, pytest.approx(_loss(1, it))] for it in range(1, 11)]


def test_trial_shows_failures_checkpoints_and_its_task_instance(dashboard):
    body = dashboard.get(f"/api/trials/{dashboard.seeded.failed_trial}").json()
    trial = body["trial"]
    assert (trial["status"], trial["num_failures"], trial["error_msg"]) == ("ERROR", 1, TRACEBACK)
    assert trial["status_cause"] == "abandoned"  # why it is ERROR: its run abandoned it
    assert (trial["config"], trial["task_id"], trial["map_index"]) == (
        {"lr": 0.025, "layers": 0},
        "mnist.trial",
        3,
    )
    assert [c["path"] for c in body["checkpoints"]] == ["/ckpt/mnist-03/5", "/ckpt/mnist-03/10"]
    assert body["best_checkpoint"]["iteration"] == body["best_iteration"] == 10
    assert (
        body["task_instance_url"]
        == "/dags/tune_mnist/runs/manual__2026-11-21/tasks/mnist.trial/mapped/3?try_number=1"
    )
    results = dashboard.get("/api/trials/mnist-03/results").json()["results"]
    assert [r["training_iteration"] for r in results] == list(range(1, 11))


ASHA_STOP = (
    "stopped by ASHA at training_iteration=3 (rung 1 of 4): loss 0.41 above the rung's cutoff 0.35"
)


def test_leaderboard_rows_and_a_trial_say_why_it_stopped(dashboard, trials_store):
    update_trial(trials_store, "mnist-01", stop_reason=ASHA_STOP, stop_kind=StopKind.SCHEDULER)
    update_trial(
        trials_store,
        "mnist-02",
        stop_reason="it met its stopping criterion",
        stop_kind=StopKind.CRITERION,
    )
    body = dashboard.get(
        f"/api/runs/{dashboard.seeded.run}/leaderboard", params={"page_size": 3}
    ).json()
    assert [(r["trial_id"], r["stop_reason"], r["early_stopped"]) for r in body["rows"]] == [
        ("mnist-00", None, False),
        ("mnist-01", ASHA_STOP, True),
        ("mnist-02", "it met its stopping criterion", False),
    ]
    stopped = dashboard.get("/api/trials/mnist-01").json()
    assert (stopped["trial"]["stop_reason"], stopped["early_stopped"]) == (ASHA_STOP, True)
    running = dashboard.get("/api/trials/mnist-11").json()
    assert (running["trial"]["stop_reason"], running["early_stopped"]) == (None, False)


MAX_T_STOP = "stopped by ASHA at training_iteration=10: it reached max_t=10"


def test_leaderboard_filters_the_trials_stopped_early_and_keeps_their_ranks(
    dashboard, trials_store
):
    for trial_id in ("mnist-01", "mnist-04"):
        update_trial(trials_store, trial_id, stop_reason=ASHA_STOP, stop_kind=StopKind.SCHEDULER)
    # Its whole budget: not early.
    update_trial(trials_store, "mnist-02", stop_reason=MAX_T_STOP, stop_kind=StopKind.MAX_T)
    run = dashboard.seeded.run
    early, rows = _ranking(dashboard, run, stopped="early")
    assert [(r["rank"], r["trial_id"], r["early_stopped"]) for r in rows] == [
        (2, "mnist-01", True),
        (5, "mnist-04", True),
    ]
    assert (early["stopped"], early["total"], early["pages"], early["run"]["num_trials"]) == (
        "early",
        2,
        1,
        12,
    )
    assert early["status_counts"] == {"TERMINATED": 10, "ERROR": 1, "RUNNING": 1}  # the whole run's
    others, rows = _ranking(dashboard, run, stopped="not_early")
    assert (others["total"], others["pages"]) == (10, 2)
    assert [r["rank"] for r in rows] == [1, 3, 4, 6, 7, 8, 9, 10, 11, 12]
    everyone = dashboard.get(f"/api/runs/{run}/leaderboard").json()
    assert (everyone["stopped"], everyone["total"]) == ("all", 12)
    _, reverse = _ranking(dashboard, run, stopped="early", order="desc")
    assert [r["trial_id"] for r in reverse] == ["mnist-04", "mnist-01"]


def _record_decisions(trials_store, run):
    """ASHA judged mnist-05 at two rungs and recorded its end; PBT made mnist-06 from mnist-05, made
    from mnist-00."""
    from airflow_trials.core.scheduler import Decision
    from airflow_trials.schedulers.asha.asha_rungs import RungVerdict

    for milestone, value, decision, at_end in (
        (1, 0.3, Decision.CONTINUE, False),
        (4, 0.2, Decision.STOP, False),
        (16, 0.1, Decision.CONTINUE, True),
    ):
        reason = ASHA_STOP if decision is Decision.STOP else None
        OneWriteEach(trials_store).record_rung(
            run,
            "mnist-05",
            bracket=0,
            milestone=milestone,
            value=value,
            iteration=milestone,
            at_end=at_end,
            decide=lambda values, d=decision, r=reason: RungVerdict(
                decision=d, cutoff=None, reason=r
            ),
        )
    for trial_id, donor, iteration, lr in (
        ("mnist-05", "mnist-00", 4, 0.12),
        ("mnist-06", "mnist-05", 8, 0.144),
    ):
        trials_store.record_exploit(
            trial_id,
            iteration=iteration,
            donor_trial_id=donor,
            donor_checkpoint=f"/ckpt/{donor}/{iteration}",
            old_config=trials_store.reader.get_trial(trial_id).config,
            new_config={"lr": lr, "layers": 0},
            operations={"lr": f"x 1.2 = {lr}"},
        )


def test_a_trial_gives_its_asha_rungs_and_its_pbt_lineage(dashboard, trials_store):
    _record_decisions(trials_store, dashboard.seeded.run)
    asha = dashboard.get("/api/trials/mnist-05").json()
    assert [
        (r["milestone"], r["iteration"], r["value"], r["decision"], r["verdict"], r["at_end"])
        for r in asha["rungs"]
    ] == [
        (1.0, 1, 0.3, "CONTINUE", "CONTINUE", False),
        (4.0, 4, 0.2, "STOP", "STOP", False),
        (16.0, 16, 0.1, "CONTINUE", "recorded at end", True),
    ]
    assert asha["rungs"][1]["reason"] == ASHA_STOP
    pbt = dashboard.get("/api/trials/mnist-06").json()
    assert pbt["rungs"] == []
    assert [
        (e["trial_id"], e["donor_trial_id"], e["iteration"], e["donor_checkpoint"], e["donor_url"])
        for e in pbt["lineage"]
    ] == [
        ("mnist-05", "mnist-00", 4, "/ckpt/mnist-00/4", "/trials/trials/mnist-00"),
        ("mnist-06", "mnist-05", 8, "/ckpt/mnist-05/8", "/trials/trials/mnist-05"),
    ]
    assert pbt["lineage"][1]["changes"] == [
        {"key": "lr", "old": pytest.approx(0.1 / 7), "new": 0.144, "operation": "x 1.2 = 0.144"}
    ]
    assert pbt["trial"]["config"] == {"lr": 0.144, "layers": 0}  # the config the exploit gave it
    plain = dashboard.get("/api/trials/mnist-00").json()
    assert (plain["rungs"], plain["lineage"]) == ([], [])


def test_openapi_schema_lists_the_endpoints(dashboard):
    schema = dashboard.client.get("/trials/openapi.json").json()
    assert {
        "/api/experiments",
        "/api/experiments/{experiment}",
        "/api/runs/{run_pk}/leaderboard",
        "/api/runs/{run_pk}/curves",
        "/api/trials/{trial_id}",
        "/api/trials/{trial_id}/results",
    } <= set(schema["paths"])
    assert {"LeaderboardOut", "TrialOut", "TrialRecord", "CurvesOut", "ExperimentOut"} <= set(
        schema["components"]["schemas"]
    )
    models = schema["components"]["schemas"]
    assert {"stop_reason", "stop_kind", "early_stopped"} <= set(
        models["LeaderboardRowOut"]["properties"]
    )
    assert (
        "stop_reason" in models["TrialRecord"]["properties"]
        and "early_stopped" in models["TrialOut"]["properties"]
    )
    assert {"rungs", "lineage"} <= set(models["TrialOut"]["properties"])
    assert {"milestone", "iteration", "value", "decision", "verdict", "reason"} <= set(
        models["RungOut"]["properties"]
    )
    assert {"donor_trial_id", "donor_url", "iteration", "donor_checkpoint", "changes"} <= set(
        models["ExploitOut"]["properties"]
    )
    assert "stopped" in models["LeaderboardOut"]["properties"]
    leaderboard = schema["paths"]["/api/runs/{run_pk}/leaderboard"]["get"]
    [stopped] = [p for p in leaderboard["parameters"] if p["name"] == "stopped"]
    assert (
        stopped["schema"]["pattern"] == "^(all|early|not_early)$"
        and stopped["schema"]["default"] == "all"
    )
    assert not any(
        path.startswith("/runs") for path in schema["paths"]
    )  # pages stay out of the API


@pytest.mark.parametrize(
    ("path", "params", "status", "needle"),
    [
        ("/api/trials/bad$id", {}, 422, "pattern"),
        ("/api/trials/a..b", {}, 422, "without '..'"),
        ("/api/experiments/-x", {}, 422, "pattern"),
        ("/api/runs/0/leaderboard", {}, 422, "greater than or equal to 1"),
        ("/api/runs/abc/leaderboard", {}, 422, "integer"),
        ("/api/runs/1/leaderboard", {"page_size": 501}, 422, "less than or equal to 500"),
        ("/api/runs/1/leaderboard", {"sort": "config"}, 422, "pattern"),
        ("/api/runs/1/leaderboard", {"metric": 'lo"ss'}, 422, "pattern"),
        ("/api/runs/1/leaderboard", {"stopped": "yes"}, 422, "pattern"),
        ("/api/runs/999/leaderboard", {}, 404, "Experiment run 999 is not in the trials store"),
        ("/api/trials/nope-1", {}, 404, "Trial nope-1 is not in the trials store"),
        ("/api/experiments/nope", {}, 404, "Experiment nope has no runs"),
    ],
)
def test_ids_from_the_url_are_validated(dashboard, path, params, status, needle):
    response = dashboard.get(path, params=params)
    assert response.status_code == status, response.text
    assert needle in str(response.json()["detail"])


def test_a_page_shows_a_bad_id_as_an_html_error(dashboard):
    response = dashboard.get("/runs/999")
    assert response.status_code == 404 and response.headers["content-type"].startswith("text/html")
    assert "Experiment run 999 is not in the trials store" in response.text


def test_airflow_ui_links_land_on_the_run_and_the_trial(dashboard):
    seeded = dashboard.seeded
    response = dashboard.get(
        "/dag-run", params={"dag_id": "tune_mnist", "run_id": "manual__2026-11-21"}
    )
    assert (
        response.status_code == 303 and response.headers["location"] == f"/trials/runs/{seeded.run}"
    )
    response = dashboard.get(
        "/task-instance",
        params={
            "dag_id": "tune_mnist",
            "run_id": "manual__2026-11-21",
            "task_id": "mnist.trial",
            "map_index": "3",
        },
    )
    assert response.status_code == 303 and response.headers["location"] == "/trials/trials/mnist-03"
    # An unmapped task: the UI leaves the placeholder in; it ran no trial.
    response = dashboard.get(
        "/task-instance",
        params={
            "dag_id": "tune_mnist",
            "run_id": "manual__2026-11-21",
            "task_id": "mnist.select_best",
            "map_index": "{MAP_INDEX}",
        },
    )
    assert response.status_code == 404 and "ran no trial" in response.text
    response = dashboard.get("/dag-run", params={"dag_id": "tune_mnist", "run_id": "other"})
    assert response.status_code == 404 and "started no experiment run" in response.text


def test_an_experiment_without_a_metric_asks_for_one(dashboard, trials_store):
    run = trials_store.create_experiment_run("unranked", "r1", dag_id="tune_mnist", run_id="r1")
    response = dashboard.get(f"/api/runs/{run}/leaderboard")
    assert response.status_code == 422 and "records no metric" in response.json()["detail"]
    asked = {"metric": "loss", "mode": "min"}
    assert dashboard.get(f"/api/runs/{run}/leaderboard", params=asked).json()["total"] == 0
    # No recorded mode to keep (issue 48): ?metric= alone is refused, naming ?mode=.
    response = dashboard.get(f"/api/runs/{run}/leaderboard", params={"metric": "loss"})
    assert response.status_code == 400 and "pass ?mode=min or ?mode=max" in response.text


def _broken_store(kind: str, tmp_path) -> tuple[str, list[str]]:
    """A store URL the dashboard cannot read, and what its error names that a user must not see:
    an unmigrated SQLite file (its path, the driver), or a PostgreSQL server that refuses the
    role (host, port, user, driver)."""
    import os

    from sqlalchemy.engine import make_url

    if kind == "sqlite-unmigrated":
        path = tmp_path / "empty.db"
        return f"sqlite:///{path}", [str(path), "sqlite", "OperationalError", "no such table"]
    server = os.environ.get("AIRFLOW_TRIALS_TEST_POSTGRES_URL")
    if not server:
        pytest.skip("AIRFLOW_TRIALS_TEST_POSTGRES_URL is unset")
    url = make_url(server).set(username="dashboard_no_such_role", password="pw")
    return url.render_as_string(hide_password=False), [
        "dashboard_no_such_role",
        str(url.host),
        str(url.port or 5432),
        "psycopg",
        "OperationalError",
    ]


@pytest.mark.parametrize("kind", ["sqlite-unmigrated", "postgres-unknown-role"])
def test_a_store_error_shows_an_id_and_the_fix_and_logs_what_it_hides(
    dashboard, tmp_path, caplog, kind
):
    import logging
    import re

    from fastapi.testclient import TestClient

    from airflow_trials.plugins.app import create_app
    from airflow_trials.store import TrialReader

    url, hidden = _broken_store(kind, tmp_path)
    broken = TrialReader(url)
    dashboard.client.app.mount("/broken", create_app(lambda: broken))
    client = TestClient(dashboard.client.app)
    auth = {"Authorization": f"Bearer {dashboard.tokens['admin']}"}
    try:
        with caplog.at_level(logging.WARNING, logger="airflow_trials.plugins.app"):
            api = client.get("/broken/api/experiments", headers=auth)
            page = client.get("/broken/", headers=auth)
    finally:
        broken.dispose()
    assert api.status_code == page.status_code == 503
    detail = api.json()["detail"]
    for shown in (detail, page.text):
        for secret in hidden:
            assert secret not in shown, (secret, shown)
        assert "airflow-trials db upgrade" in shown  # the fix
    error_ids = re.findall(r"error ([0-9a-f]{8})", detail)
    assert error_ids and re.search(r"error [0-9a-f]{8}", page.text)
    logged = {r.getMessage() for r in caplog.records}
    # The api-server's log has the whole error under the id the user was shown.
    assert any(error_ids[0] in m and hidden[0] in m for m in logged), logged


def test_a_trial_page_lists_its_newest_results_and_links_to_all(
    dashboard, trials_store, monkeypatch
):
    from airflow_trials.plugins.routes import trials as app

    monkeypatch.setattr(app, "RESULTS_SHOWN", 3)
    page = dashboard.get("/trials/mnist-00").text
    assert "The newest 3 of 10" in page and 'href="/trials/api/trials/mnist-00/results"' in page
    assert page.count('<tr><td class="num">') == 3


def test_pages_of_a_live_run_refresh_and_those_of_a_finished_one_do_not(dashboard, trials_store):
    refresh = '<meta http-equiv="refresh" content="10">'
    seeded = dashboard.seeded
    assert refresh in dashboard.get(f"/runs/{seeded.hostile_run}").text
    trials_store.finish_experiment_run(
        seeded.hostile_run, "FAILED"
    )  # its one trial is in ERROR: all ended
    assert refresh not in dashboard.get(f"/runs/{seeded.hostile_run}").text
    assert refresh not in dashboard.get(f"/trials/{seeded.hostile_trial}").text
    trials_store.finish_experiment_run(seeded.run, "SUCCESS")  # mnist-11 is still RUNNING
    assert refresh in dashboard.get(f"/runs/{seeded.run}").text
    assert refresh in dashboard.get("/trials/mnist-11").text


def test_the_metric_heading_toggles_the_order_and_keeps_the_page_size(dashboard):
    page = dashboard.get(f"/runs/{dashboard.seeded.run}", params={"page_size": 5}).text
    assert (
        f'href="/trials/runs/{dashboard.seeded.run}?sort=metric&amp;order=desc&amp;page_size=5"'
        in page
    )
    assert (
        f'href="/trials/runs/{dashboard.seeded.run}'
        '?sort=metric&amp;order=asc&amp;page_size=5&amp;page=2" rel="next"' in page
    )


def test_a_trial_page_shows_its_best_value_and_where(dashboard):
    page = dashboard.get("/trials/mnist-03").text
    assert "best loss (min)</th><td>0.13 at iteration 10</td>" in page
