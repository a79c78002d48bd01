"""tuning_experiment(approval=True) answered for real: ``dag.test()`` runs the DAG (Ray trials, a
SQLite trials DB) and one real ``airflow api-server`` takes the answer through Airflow's REST API,
as a person's click in the Required Actions page does: an approval is recorded and published, the
user who triggered the run cannot approve it, a rejected best is never published.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from airflow_trials.core.search import grid_search
from tests.airflow.conftest import load_dag_source
from tests.airflow.test_approval import APPROVER, TRIGGERER
from tests.airflow.test_experiment_dag import task_states, xcom
from tests.conftest import remove_leftovers, start_ray
from tests.plugins.browser_support import start_api_server, token_for

# -- the real thing: dag.test() answered through a real api-server's REST API --------------------


class ServerStarting(threading.Thread):
    """``start_api_server`` entered in a thread of its own, so that the api-server boots while
    the module's first DAG runs its trials; :meth:`get` waits for it."""

    def __init__(self, url: str, directory: Path) -> None:
        super().__init__(daemon=True)
        # bob approves; dag_test is the user dag.test() triggers its DAG runs as.
        self._server = start_api_server(url, directory, more_users=(APPROVER, TRIGGERER))
        self._base_and_token: tuple[str, str] | None = None
        self._error: BaseException | None = None

    def run(self) -> None:
        try:
            self._base_and_token = self._server.__enter__()
        except BaseException as e:  # handed to whoever calls get()
            self._error = e

    def get(self) -> tuple[str, str]:
        """(base URL, an admin's token), once the api-server answers."""
        self.join()
        if self._error is not None:
            raise self._error
        assert self._base_and_token is not None
        return self._base_and_token

    def stop(self) -> None:
        self.join()
        if self._base_and_token is not None:
            self._server.__exit__(None, None, None)


@pytest.fixture(scope="module")
def stack(airflow_home, tmp_path_factory):
    """A trials DB and checkpoint storage found by this process's tasks, a local Ray, and one
    ``airflow api-server`` over the session's metadata DB serving the REST API and the dashboard
    (from the same trials DB), still starting when the fixture returns."""
    from airflow_trials.store import TrialStore

    directory = tmp_path_factory.mktemp("approval")
    url = f"sqlite:///{directory / 'trials.db'}"
    storage = directory / "storage"
    storage.mkdir()
    store = TrialStore(url, create=True)
    server = ServerStarting(url, directory)
    server.start()
    try:
        with pytest.MonkeyPatch.context() as env:
            env.setenv("AIRFLOW_TRIALS_DB_URL", url)
            env.setenv("AIRFLOW_TRIALS_STORAGE", str(storage))
            # The server's port is known only once it runs: the body's link is host-relative.
            env.delenv("AIRFLOW__API__BASE_URL", raising=False)
            start_ray(num_cpus=2, num_gpus=2)
            yield SimpleNamespace(server=server, store=store)
            remove_leftovers()
    finally:
        server.stop()
        store.dispose()


def approval_dag(dag_id: str):
    """A DAG file with one approved experiment (two trials, best score 6 by the trial of scale
    2) and a task ``deploy`` after its group, written into the DAGs folder and loaded. Its
    approvers: bob, and dag_test, who triggers the run."""
    source = (
        "import datetime\n"
        "from airflow.sdk import DAG, task\n"
        "from airflow_trials.experiment import tuning_experiment\n\n"
        f"with DAG({dag_id!r}, schedule=None, start_date=datetime.datetime(2026, 1, 1)) as dag:\n"
        "    group = tuning_experiment(\n"
        f"        experiment_name={dag_id!r},\n"
        "        trainable='tests.trainables:counting',\n"
        f"        search_space={{'scale': {grid_search([1.0, 2.0])!r}}},\n"
        "        metric='score',\n"
        "        mode='max',\n"
        "        stop={'training_iteration': 3},\n"
        "        resources_per_trial={'cpu': 0.5},\n"
        "        poll_interval_seconds=0.05,\n"
        "        group_id='tune',\n"
        "        approval=True,\n"
        f"        approvers={[APPROVER, TRIGGERER]!r},\n"
        "    )\n\n"
        "    @task(task_id='deploy')\n"
        "    def deploy():\n"
        "        return 'deployed'\n\n"
        "    group >> deploy()\n"
    )
    return load_dag_source(dag_id, source)


class Answerer(threading.Thread):
    """Answers the DAG's approval through the REST API once it asks, as a person would: reads
    the pending HITL detail, then PATCHes the answer as ``user``. ``dag.test()`` runs the DAG
    meanwhile.

    :param intruder: a user who tries to answer first; the status Airflow gave them is kept in
        ``intruder_status``.
    :param mark_success: instead of answering, mark ``approve_best`` success (as an admin may in
        the UI), skipping the question.
    """

    def __init__(
        self,
        server: ServerStarting,
        dag_id: str,
        option: str,
        reason: str,
        user: str = APPROVER,
        intruder: str | None = None,
        mark_success: bool = False,
    ) -> None:
        super().__init__(daemon=True)
        self.server, self.dag_id, self.option, self.reason = server, dag_id, option, reason
        self.user, self.intruder, self.mark_success = user, intruder, mark_success
        self.base, self.headers = "", {}
        self.asked: dict[str, Any] | None = None
        self.answered: dict[str, Any] | None = None
        self.intruder_status: int | None = None
        self.error: BaseException | None = None
        self.done = threading.Event()

    def pending(self) -> dict[str, Any] | None:
        response = httpx.get(
            f"{self.base}/api/v2/dags/{self.dag_id}/dagRuns/~/hitlDetails",
            headers=self.headers,
            timeout=10,
        )
        response.raise_for_status()
        waiting = [d for d in response.json()["hitl_details"] if not d["response_received"]]
        return waiting[0] if waiting else None

    def answer_as(self, user: str, ti: dict[str, Any]) -> httpx.Response:
        return httpx.patch(
            f"{self.base}/api/v2/dags/{self.dag_id}/dagRuns/{quote(ti['dag_run_id'])}"
            f"/taskInstances/{ti['task_id']}/{ti['map_index']}/hitlDetails",
            headers={"Authorization": f"Bearer {token_for(self.base, user)}"},
            json={"chosen_options": [self.option], "params_input": {"reason": self.reason}},
            timeout=10,
        )

    def run(self) -> None:
        try:
            self.base, token = self.server.get()
            self.headers = {"Authorization": f"Bearer {token}"}
            # A bound on a hang only (the DAG run ends first in every passing case).
            deadline = time.monotonic() + 240
            while (asked := self.pending()) is None:
                if self.done.is_set() or time.monotonic() > deadline:
                    return
                time.sleep(0.5)
            self.asked = asked
            ti = asked["task_instance"]
            if self.intruder is not None:
                self.intruder_status = self.answer_as(self.intruder, ti).status_code
            if self.mark_success:
                response = httpx.patch(
                    f"{self.base}/api/v2/dags/{self.dag_id}/dagRuns/{quote(ti['dag_run_id'])}"
                    f"/taskInstances/{ti['task_id']}",
                    headers=self.headers,
                    json={"new_state": "success"},
                    timeout=10,
                )
            else:
                response = self.answer_as(self.user, ti)
            response.raise_for_status()
            self.answered = response.json()
        except BaseException as e:  # handed to the test's thread
            self.error = e


def run_answered(stack, dag_id: str, option: str, reason: str, **how: Any):
    dag = approval_dag(dag_id)
    answerer = Answerer(stack.server, dag_id, option, reason, **how)
    answerer.start()
    try:
        run = dag.test()
    finally:
        answerer.done.set()
        answerer.join(timeout=30)
    if answerer.error is not None:
        raise answerer.error
    assert answerer.asked is not None and answerer.answered is not None, task_states(run)
    return run, answerer


def clear_and_run(stack, dag_id: str, run, task_id: str) -> str:
    """Clear ``task_id`` of the finished DAG run through the REST API (as the UI's Clear does),
    then run it as dag.test() runs a scheduled task (no scheduler runs here); its new state."""
    from airflow.models.taskinstance import TaskInstance
    from airflow.sdk.definitions.dag import _run_task
    from airflow.utils.state import TaskInstanceState
    from sqlalchemy import select

    from airflow import settings

    base, token = stack.server.get()
    response = httpx.post(
        f"{base}/api/v2/dags/{dag_id}/clearTaskInstances",
        headers={"Authorization": f"Bearer {token}"},
        json={
            "dry_run": False,
            "only_failed": False,
            "task_ids": [task_id],
            "dag_run_id": run.run_id,
        },
        timeout=30,
    )
    assert response.status_code == 200, response.text
    assert [t["task_id"] for t in response.json()["task_instances"]] == [task_id]
    session = settings.Session()
    try:
        ti = session.scalars(
            select(TaskInstance).where(
                TaskInstance.dag_id == dag_id,
                TaskInstance.run_id == run.run_id,
                TaskInstance.task_id == task_id,
            )
        ).one()
        assert ti.state is None  # cleared
        ti.try_number += 1
        ti.state = TaskInstanceState.SCHEDULED
        session.commit()
        try:
            _run_task(ti=ti, task=approval_dag(dag_id).task_dict[task_id])
        except Exception:  # the task's failure is its state, read below
            pass
        session.expire_all()
        return str(session.get(TaskInstance, ti.id).state)
    finally:
        session.close()


def asset_events(run) -> list[dict[str, Any]]:
    from airflow.models.asset import AssetEvent
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        events = session.scalars(
            select(AssetEvent).where(
                AssetEvent.source_dag_id == run.dag_id, AssetEvent.source_run_id == run.run_id
            )
        ).all()
        return [dict(e.extra) for e in events]


def recorded(stack, dag_id: str):
    """The answers the trials DB recorded about the DAG's one experiment run."""
    (exp_run,) = stack.store.reader.list_experiment_runs(dag_id)
    return stack.store.reader.run_approvals(exp_run.id)


def test_an_approver_s_approval_is_recorded_and_published_and_the_run_page_shows_it(stack, capfd):
    run, answerer = run_answered(
        stack, "approved_best", "Approve", "beats last week's", intruder="admin"
    )
    states = task_states(run)
    assert run.state == "success", states
    assert states[("tune.publish_best", -1)] == "success"
    assert states[("deploy", -1)] == "success"
    assert answerer.intruder_status == 403  # admin is no approver: Airflow refuses their answer

    base, token = stack.server.get()
    best = xcom(run, "tune.select_best")
    (exp_run,) = stack.store.reader.list_experiment_runs("approved_best")
    assert best["value"] == 6.0 and best["experiment_run_id"] == exp_run.id
    assert asset_events(run) == [best]  # published once, by publish_best

    # What the person was shown, as the REST API gives it.
    asked = answerer.asked
    assert asked["subject"] == "Publish the best trial of experiment approved_best?"
    assert asked["options"] == ["Approve", "Reject"] and list(asked["params"]) == ["reason"]
    assert asked["assigned_users"] == [
        {"id": APPROVER, "name": APPROVER},
        {"id": TRIGGERER, "name": TRIGGERER},
    ]
    link = f"/trials/runs/{exp_run.id}"
    assert f"- **Best trial:** `{best['trial_id']}`" in asked["body"]
    assert "- **score** (max): **6** at iteration 3" in asked["body"]
    assert f"[Open the run in the trials dashboard]({link})" in asked["body"]

    # The decision, recorded beside the run: who, when, why, and who triggered the run.
    (approval,) = recorded(stack, "approved_best")
    assert approval.outcome.value == "APPROVED" and approval.dag_run_id == run.run_id
    assert (approval.responded_by_id, approval.responded_by_name) == (APPROVER, APPROVER)
    assert approval.triggered_by == TRIGGERER and approval.trial_id == best["trial_id"]
    assert approval.reason == "beats last week's"
    assert approval.responded_at.isoformat() == answerer.answered["responded_at"].replace(
        "Z", "+00:00"
    )
    page = httpx.get(base + link, headers={"Authorization": f"Bearer {token}"}, timeout=30)
    assert page.status_code == 200 and best["trial_id"] in page.text
    assert "approved by bob (id bob); reason: beats last week&#39;s" in page.text

    decision = xcom(run, "tune.approve_best", key="decision")
    assert xcom(run, "tune.approve_best") == decision
    assert decision["chosen_options"] == ["Approve"] and decision["approved"] is True
    assert decision["outcome"] == "APPROVED" and decision["triggered_by"] == TRIGGERER
    assert decision["reason"] == "beats last week's"
    assert decision["responded_by_user"] == answerer.answered["responded_by"]
    assert decision["responded_by_user"] == {"id": APPROVER, "name": APPROVER}
    assert decision["trial_id"] == best["trial_id"]
    assert f"bob (id bob) approved the best trial {best['trial_id']}" in capfd.readouterr().out


def test_the_user_who_triggered_the_run_cannot_approve_it(stack):
    run, _ = run_answered(stack, "self_approved", "Approve", "mine is fine", user=TRIGGERER)
    states = task_states(run)
    assert run.state == "failed", states
    assert states[("tune.approve_best", -1)] == "failed"
    assert states[("tune.publish_best", -1)] == "upstream_failed"
    assert states[("deploy", -1)] == "upstream_failed"
    assert asset_events(run) == []
    (approval,) = recorded(stack, "self_approved")
    assert approval.outcome.value == "SELF_APPROVED"
    assert approval.responded_by_id == approval.triggered_by == TRIGGERER
    # Running publish_best anyway (cleared, as the UI's Clear does) publishes nothing.
    assert clear_and_run(stack, "self_approved", run, "tune.publish_best") == "failed"
    assert asset_events(run) == []


def test_marking_approve_best_success_skips_no_gate(stack):
    run, answerer = run_answered(stack, "marked_best", "Approve", "", mark_success=True)
    states = task_states(run)
    (marked,) = answerer.answered["task_instances"]
    assert (marked["task_id"], marked["state"]) == ("tune.approve_best", "success")
    assert states[("tune.approve_best", -1)] == "success"  # marked, never answered
    assert states[("tune.publish_best", -1)] == "failed"  # no recorded answer: refused
    assert states[("deploy", -1)] == "upstream_failed"
    assert run.state == "failed" and asset_events(run) == []
    assert recorded(stack, "marked_best") == []


def test_a_rejected_best_is_never_published_and_who_rejected_it_and_why_is_kept(stack, capfd):
    reason = "val set leaked into training"
    run, answerer = run_answered(stack, "rejected_best", "Reject", reason)
    states = task_states(run)
    assert states[("tune.select_best", -1)] == "success"
    assert states[("tune.approve_best", -1)] == "success"  # the person answered
    assert states[("tune.publish_best", -1)] == "skipped"
    assert states[("deploy", -1)] == "skipped"  # nothing after the group runs
    assert asset_events(run) == []

    best = xcom(run, "tune.select_best")
    assert xcom(run, "tune.approve_best") is None  # ApprovalOperator skips by raising
    decision = xcom(run, "tune.approve_best", key="decision")
    assert decision["chosen_options"] == ["Reject"] and decision["approved"] is False
    assert decision["reason"] == reason and decision["params_input"] == {"reason": reason}
    assert decision["responded_by_user"]["name"] == APPROVER
    assert decision["outcome"] == "REJECTED"
    log = capfd.readouterr().out
    assert f"bob (id bob) rejected the best trial {best['trial_id']}" in log
    assert (
        f"reason: {reason}. publish_best is skipped: the Asset gets no event, and the rejection "
        "is final." in log
    )
    (approval,) = recorded(stack, "rejected_best")
    assert approval.outcome.value == "REJECTED" and approval.reason == reason

    # Airflow keeps the answer too: the task instance's HITL detail, read back through the API.
    base, token = stack.server.get()
    response = httpx.get(
        f"{base}/api/v2/dags/rejected_best/dagRuns/{quote(run.run_id)}/taskInstances/"
        "tune.approve_best/-1/hitlDetails",
        headers={"Authorization": f"Bearer {token}"},
        timeout=10,
    )
    kept = response.json()
    assert response.status_code == 200, kept
    assert kept["chosen_options"] == ["Reject"] and kept["params_input"] == {"reason": reason}
    assert kept["responded_by_user"] == decision["responded_by_user"]
    assert kept["response_received"] is True

    # A rejection is final: clearing publish_best publishes nothing, and approve_best cleared
    # does not ask again.
    assert clear_and_run(stack, "rejected_best", run, "tune.publish_best") == "failed"
    assert clear_and_run(stack, "rejected_best", run, "tune.approve_best") == "failed"
    assert asset_events(run) == []
    assert recorded(stack, "rejected_best") == [approval]
    log = capfd.readouterr().out
    assert "bob (id bob) rejected it, and a rejection is final" in log
    assert "was rejected by bob at" in log and "it is not asked again" in log
