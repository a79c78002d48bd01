"""A real experiment DAG run (dag.test() on a local Ray) read back through the dashboard."""

from __future__ import annotations

from urllib.parse import quote

import pytest

from tests.airflow.conftest import trials_env  # noqa: F401 - the fixture, shared with tests/airflow
from tests.airflow.test_experiment_dag import experiment_dag
from tests.airflow.test_provider_info import extra_link


@pytest.mark.timeout(600)
def test_a_real_run_is_on_the_dashboard_and_reachable_from_its_task_instances(
    trials_env,  # noqa: F811
    make_dashboard,
):
    from airflow_trials.core.search import grid_search
    from airflow_trials.store import TrialReader

    dag = experiment_dag("dashboard_real", search_space={"start": grid_search([0, 10])})
    run = dag.test()
    assert run.state == "success"
    store = TrialReader(trials_env.url)
    dashboard = make_dashboard(store)
    try:
        (exp_run,) = store.list_experiment_runs("dashboard_real")
        assert (exp_run.dag_id, exp_run.run_id) == (dag.dag_id, run.run_id)

        board = dashboard.get(f"/api/runs/{exp_run.id}/leaderboard").json()
        expected = store.leaderboard(exp_run.id, "score", "max")
        assert [r["trial_id"] for r in board["rows"]] == [r.trial_id for r in expected]
        assert board["status_counts"] == {"TERMINATED": 2} and board["mode"] == "max"
        assert all(r["best_checkpoint"] is not None for r in board["rows"])
        curves = dashboard.get(f"/api/runs/{exp_run.id}/curves").json()["curves"]
        assert all([it for it, _ in curve] == [1, 2, 3] for curve in curves.values())

        # The UI's DAG-run tab lands on the run; each trial task's tab on its trial.
        response = dashboard.get("/dag-run", params={"dag_id": dag.dag_id, "run_id": run.run_id})
        assert response.headers["location"] == f"/trials/runs/{exp_run.id}"
        trial_tis = [ti for ti in run.get_task_instances() if ti.task_id == "tune.trial"]
        assert len(trial_tis) == 2
        for ti in trial_tis:
            response = dashboard.get(
                "/task-instance",
                params={
                    "dag_id": ti.dag_id,
                    "run_id": ti.run_id,
                    "task_id": ti.task_id,
                    "map_index": ti.map_index,
                },
            )
            assert response.status_code == 303
            trial = dashboard.get(
                response.headers["location"]
                .removeprefix("/trials")
                .replace("/trials/", "/api/trials/", 1)
            ).json()
            assert (trial["trial"]["task_id"], trial["trial"]["map_index"]) == (
                ti.task_id,
                ti.map_index,
            )
            assert trial["task_instance_url"] == (
                f"/dags/{dag.dag_id}/runs/{quote(run.run_id, safe='')}"
                f"/tasks/tune.trial/mapped/{ti.map_index}"
                f"?try_number={ti.try_number}"
            )
            # Its "Trial dashboard" button, as the api-server reads it, opens the same trial.
            link = extra_link(run, ti.task_id, ti.map_index)
            assert link == f"/trials/trials/{trial['trial']['trial_id']}"
            page = dashboard.get(link.removeprefix("/trials"))
            assert (
                page.status_code == 200 and "TERMINATED" in page.text and "<polyline" in page.text
            )
    finally:
        store.dispose()
