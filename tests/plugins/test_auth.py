"""Every page and endpoint needs an Airflow user who may read the experiment's DAG."""

from __future__ import annotations

import pytest

PATHS = [
    "/",
    "/experiments/mnist",
    "/runs/1",
    "/runs/1/curves",
    "/trials/mnist-00",
    "/dag-run?dag_id=tune_mnist&run_id=manual__2026-11-21",
    "/task-instance?dag_id=tune_mnist&run_id=manual__2026-11-21&task_id=mnist.trial&map_index=0",
    "/api/experiments",
    "/api/experiments/mnist",
    "/api/runs/1/leaderboard",
    "/api/runs/1/curves",
    "/api/trials/mnist-00",
    "/api/trials/mnist-00/results",
]


@pytest.mark.parametrize("path", PATHS)
def test_requests_without_a_token_are_refused(dashboard, path):
    response = dashboard.get(path, user=None)
    assert response.status_code == 401
    assert "mnist-00" not in response.text and "0.1" not in response.text


def test_the_401_page_links_to_the_airflow_login(dashboard):
    response = dashboard.get("/runs/1", user=None)
    assert response.headers["content-type"].startswith("text/html")
    assert 'href="/auth/login' in response.text


@pytest.mark.parametrize("path", ["/runs/1", "/api/runs/1/leaderboard"])
def test_a_forged_token_is_refused(dashboard, path):
    forged = dashboard.tokens["admin"][:-4] + "AAAA"
    response = dashboard.get(path, user=None, headers={"Authorization": f"Bearer {forged}"})
    assert response.status_code == 403


def test_the_ui_cookie_authenticates_like_the_header(dashboard):
    dashboard.client.cookies.set("_token", dashboard.tokens["alice"])
    try:
        response = dashboard.get("/api/runs/1/leaderboard", user=None)
    finally:
        dashboard.client.cookies.clear()
    assert response.status_code == 200 and response.json()["total"] == 12


@pytest.mark.parametrize(
    "path",
    [
        "/runs/1",
        "/runs/1/curves",
        "/trials/mnist-00",
        "/api/runs/1/leaderboard",
        "/api/runs/1/curves",
        "/api/trials/mnist-00",
        "/api/trials/mnist-00/results",
    ],
)
def test_a_user_not_allowed_on_the_dag_is_refused(dashboard, path):
    response = dashboard.get(path, user="bob")
    assert response.status_code == 403
    assert "User bob may not read" in response.text and "DAG tune_mnist" in response.text


def test_lists_show_only_the_dags_the_user_may_read(dashboard):
    assert [e["name"] for e in dashboard.get("/api/experiments", user="bob").json()] == ["secret"]
    assert dashboard.get("/api/experiments/mnist", user="bob").status_code == 404
    page = dashboard.get("/", user="bob").text
    assert "secret" in page and "mnist" not in page
    assert dashboard.get(f"/runs/{dashboard.seeded.other_run}", user="bob").status_code == 200
    assert (
        dashboard.get(
            "/dag-run?dag_id=tune_mnist&run_id=manual__2026-11-21", user="bob"
        ).status_code
        == 404
    )
    assert [e["name"] for e in dashboard.get("/api/experiments", user="alice").json()] == [
        "mnist",
        "secret",
        "hostile",
    ]


def test_a_run_outside_airflow_needs_access_to_all_dags(dashboard, trials_store):
    run = trials_store.create_experiment_run(
        "mnist", "local-run"
    )  # no dag_id: started outside Airflow
    assert dashboard.get(f"/api/runs/{run}/leaderboard", user="alice").status_code == 200
    response = dashboard.get(f"/api/runs/{run}/leaderboard", user="bob")
    assert response.status_code == 403 and "all DAGs" in response.json()["detail"]
