"""A trial task's handle in Airflow's task state store (AIP-103), on real Airflow (dag.test), real
Ray and a real trials store: written by each try, read back through the REST API's own route
functions, re-attached through on a retry, and a fresh start when a user clears it."""

from __future__ import annotations

import json

from airflow_trials.operators.task_handle import HANDLE_KEY
from tests.airflow.conftest import load_dag_source
from tests.conftest import live_trial_actors

# Try 1 launches its trial and dies before it defers (its worker was lost), leaving the actor
# running, held before iteration 3. Try 2 opens the gate once it has decided how it starts, so the
# trial cannot finish before try 2 looks at it.
DAG_SOURCE = """
import datetime as dt
import json
from pathlib import Path

import ray
from airflow.sdk import DAG
from airflow.sdk.exceptions import TaskDeferred

from airflow_trials.operators.trial_operator import RunTrialOperator

TMP = Path({tmp!r})
CLEAR_BETWEEN_TRIES = {clear!r}


class WorkerLostAfterTheLaunch(RunTrialOperator):
    def execute(self, context):
        if context["ti"].try_number > 1:
            return super().execute(context)
        try:
            super().execute(context)
        except TaskDeferred:
            pass
        actor = ray.get_actor("trial.{dag_id}.one", namespace="airflow_trials")
        (TMP / "pid").write_text(json.dumps(ray.get(actor.poll.remote(0)).pid))
        if CLEAR_BETWEEN_TRIES:
            from tests.airflow.test_task_state_store import clear_task_state_store

            clear_task_state_store(context["ti"])
        raise RuntimeError("the worker was lost after the launch")

    def _launch_unless_running(self, context, *args):
        event = super()._launch_unless_running(context, *args)
        if context["ti"].try_number > 1:
            (TMP / "gate").touch()
        return event


with DAG("{dag_id}", schedule=None, start_date=dt.datetime(2026, 1, 1, tzinfo=dt.UTC)) as dag:
    WorkerLostAfterTheLaunch(
        task_id="trial",
        trial_id="one",
        trainable="tests.trainables:counting",
        config={{"sleep": 0.05, "hold_at": 3, "gate": str(TMP / "gate")}},
        stopping_criterion={{"training_iteration": 4}},
        poll_interval_seconds=0.05,
        deferrable=True,
        retries=1,
        retry_delay=dt.timedelta(0),
    )
"""


def _scope(ti):
    from airflow._shared.state import TaskScope

    map_index = ti.map_index if ti.map_index is not None else -1
    return TaskScope(dag_id=ti.dag_id, run_id=ti.run_id, task_id=ti.task_id, map_index=map_index)


def clear_task_state_store(ti):
    """What a user's ``DELETE .../taskInstances/{task_id}/state-store`` does (its route)."""
    from airflow.api_fastapi.core_api.routes.public import task_state_store as routes
    from airflow.utils.session import create_session

    with create_session() as session:
        routes.clear_task_state_store(_scope(ti), session)


def stored_handle(run, task_id="trial"):
    """The handle as ``GET .../taskInstances/{task_id}/state-store/{key}`` answers it."""
    from airflow.api_fastapi.core_api.routes.public import task_state_store as routes
    from airflow.utils.session import create_session

    (ti,) = [ti for ti in run.get_task_instances() if ti.task_id == task_id]
    with create_session() as session:
        return routes.get_task_state_store(_scope(ti), HANDLE_KEY, session).value


def _run(dag_id, tmp_path, clear):
    source = DAG_SOURCE.format(tmp=str(tmp_path), clear=clear, dag_id=dag_id)
    run = load_dag_source(dag_id, source).test()
    assert run.state == "success", {ti.task_id: ti.state for ti in run.get_task_instances()}
    return run


def test_a_retry_reattaches_through_the_handle_in_the_task_state_store(trials_env, tmp_path, capfd):
    run = _run("handle_kept", tmp_path, clear=False)
    # The handle Airflow's UI and REST API show: the trial, its actor, the latest try, the run.
    assert stored_handle(run) == {
        "trial_id": "one",
        "actor_name": "trial.handle_kept.one",
        "try_number": 2,
        "run_key": run.run_id,
    }
    assert "Trial one is RUNNING on Ray already; re-attaching to it." in capfd.readouterr().out
    # One actor ran the whole trial: the one try 1 started.
    first_pid = json.loads((tmp_path / "pid").read_text())
    results = trials_env.store.reader.get_results("one")
    assert [r["training_iteration"] for r in results] == [1, 2, 3, 4]
    assert {r["pid"] for r in results} == {first_pid}
    record = trials_env.store.reader.get_trial("one")
    assert (record.status.value, record.try_number, record.num_failures) == ("TERMINATED", 2, 0)
    assert live_trial_actors() == []


def test_a_cleared_handle_makes_the_next_try_start_the_trial_afresh(trials_env, tmp_path, capfd):
    run = _run("handle_cleared", tmp_path, clear=True)
    log = capfd.readouterr().out
    assert "its handle in the task state store was cleared" in log
    assert "re-attaching" not in log
    # Try 2 stopped try 1's actor and started the trial in a new one from its latest checkpoint,
    # as a cleared task does (RESET: a fresh failure budget), and wrote its own handle.
    first_pid = json.loads((tmp_path / "pid").read_text())
    results = trials_env.store.reader.get_results("one")
    assert [r["training_iteration"] for r in results] == [1, 2, 3, 4]
    assert results[-1]["pid"] != first_pid and results[-1]["iterations_since_restore"] < 4
    record = trials_env.store.reader.get_trial("one")
    assert (record.status.value, record.try_number, record.num_failures) == ("TERMINATED", 2, 0)
    assert stored_handle(run)["try_number"] == 2
    assert live_trial_actors() == []


def test_without_a_task_state_store_the_operator_keeps_its_old_way(trials_env, fake_context):
    """Called directly (no task runner, so no task state store), the operator keeps its old way:
    the trials DB and the actor's name alone."""
    from airflow_trials.operators.task_handle import handle_kept, read_handle, write_handle

    context = fake_context(try_number=2)
    assert read_handle(context) is None
    write_handle(context, "ops", "t")  # writes nothing, raises nothing
    assert handle_kept(context, trials_env.store, "ops", "t")
