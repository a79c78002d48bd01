"""Every page and endpoint needs an Airflow user who may read the experiment's DAG."""

from __future__ import annotations

import pytest

from airflow_trials.core.end import TrialEnd
from airflow_trials.core.fate import Transition
from airflow_trials.core.status import TrialStatus
from tests.factories import add_results

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


def _trial(store, trial_id, run, dag_id, run_key, config, loss, **kwargs) -> None:
    store.upsert_trial(
        trial_id,
        trainable="pkg.train:fn",
        config=config,
        resources={"cpu": 1},
        max_failures=0,
        experiment_run_id=run,
        dag_id=dag_id,
        run_id=run_key,
        task_id="t",
        map_index=0,
        **kwargs,
    )
    store.record_transition(trial_id, Transition.PLACED)
    add_results(store, trial_id, [{"training_iteration": 1, "loss": loss}])
    # Ended TERMINATED, so it counts for its run's best (docs/store.md, "Which trials count").
    store.record_end(TrialEnd(trial_id, "secret", TrialStatus.TERMINATED))


def _secret_runs_with_a_hidden_one(store) -> tuple[int, int]:
    """Experiment secret: bob's run r1 (other_dag), then a run on tune_mnist (bob may not read it)
    with a better config, then bob's run r2, warm-started from the hidden run. Returns (hidden
    run, r2)."""
    key = "hidden-run-key"
    # r1's trial ends, so that r1 has a best to compare with (only an ended trial counts).
    store.record_transition("secret-0", Transition.PLACED)
    store.record_end(TrialEnd("secret-0", "secret", TrialStatus.TERMINATED))
    hidden = store.create_experiment_run("secret", key, dag_id="tune_mnist", run_id=key)
    _trial(store, "hidden-trial-0", hidden, "tune_mnist", key, {"lr": 0.987, "hidden_key": 1}, 0.01)
    r2 = store.create_experiment_run("secret", "r2", dag_id="other_dag", run_id="r2")
    origin = {
        "run_key": key,
        "experiment_run_id": hidden,
        "trial_id": "hidden-trial-0",
        "value": 0.01,
        "checkpoint": "/ckpt/hidden-trial-0/1",
    }
    _trial(store, "secret-r2-0", r2, "other_dag", "r2", {"lr": 0.4}, 0.2, warm_start=origin)
    return hidden, r2


HIDDEN = ("hidden-run-key", "hidden-trial-0", "0.987", "hidden_key", "/ckpt/hidden-trial-0")


@pytest.mark.parametrize("last", ["", "?last=1"])
def test_the_history_names_no_run_of_a_dag_the_user_may_not_read(dashboard, trials_store, last):
    hidden, r2 = _secret_runs_with_a_hidden_one(trials_store)
    other_run = dashboard.seeded.other_run
    body = dashboard.get(f"/api/experiments/secret/history{last}", user="bob").json()
    runs = {line["run"]["run_key"]: line for line in body["runs"]}
    assert "hidden-run-key" not in runs
    # r2 compares with r1, the closest earlier run bob may read, not with the hidden one.
    assert runs["r2"]["previous_run_id"] == other_run
    assert runs["r2"]["previous_best_config"] == {"lr": 0.5}
    assert runs["r2"]["changed_keys"] == ["lr"]
    # It was warm-started, from a run bob may not read: not named.
    assert runs["r2"]["warm_started_from"] == {
        "experiment_run_id": None,
        "run_key": None,
        "url": None,
    }
    page = dashboard.get("/experiments/secret", user="bob").text
    for shown in (str(body), page):
        assert not [word for word in HIDDEN if word in shown]
    # Alice may read both DAGs: r2 compares with the hidden run and names its source.
    alice = dashboard.get(f"/api/experiments/secret/history{last}", user="alice").json()
    line = next(r for r in alice["runs"] if r["run"]["run_key"] == "r2")
    assert line["previous_run_id"] == hidden and line["warm_started_from"]["run_key"] == (
        "hidden-run-key"
    )


def test_the_trial_page_names_no_warm_start_source_the_user_may_not_read(dashboard, trials_store):
    _secret_runs_with_a_hidden_one(trials_store)
    page = dashboard.get("/trials/secret-r2-0", user="bob")
    api = dashboard.get("/api/trials/secret-r2-0", user="bob")
    assert page.status_code == api.status_code == 200
    assert "warm-started from" in page.text and "a run you may not read" in page.text
    assert api.json()["trial"]["warm_start"] == {
        "run_key": None,
        "experiment_run_id": None,
        "trial_id": None,
        "value": None,
        "checkpoint": None,
    }
    for shown in (page.text, api.text):
        assert not [word for word in HIDDEN if word in shown]
    alice = dashboard.get("/api/trials/secret-r2-0", user="alice").json()
    assert alice["trial"]["warm_start"]["trial_id"] == "hidden-trial-0"
    assert 'href="/trials/trials/hidden-trial-0"' in dashboard.get("/trials/secret-r2-0").text


def test_task_instance_links_answer_an_unreadable_dag_as_a_missing_trial(dashboard):
    """/task-instance tells nothing of a DAG the user may not read: bob gets for tune_mnist's
    trial task exactly what he gets for a task instance that ran no trial."""

    def link(map_index: str):
        params = {
            "dag_id": "tune_mnist",
            "run_id": "manual__2026-11-21",
            "task_id": "mnist.trial",
            "map_index": map_index,
        }
        return dashboard.get("/task-instance", params=params, user="bob")

    unreadable, missing = link("3"), link("999")
    assert (unreadable.status_code, missing.status_code) == (404, 404)
    assert unreadable.text == missing.text.replace("999", "3")
    assert "location" not in unreadable.headers and "mnist-03" not in unreadable.text
    assert link("3").headers.get("content-type") == missing.headers.get("content-type")
