"""A real Airflow stack for fault tests, driven through Airflow's public REST API.

The stack is the main job's (``airflow_trials.mainjob``): ``airflow standalone`` (api-server,
scheduler, dag-processor, triggerer) with LocalExecutor in a temporary AIRFLOW_HOME, a migrated
SQLite trials DB and the ``gpu`` pool. Only the DAG files given are in its DAGs folder. It uses
the Ray cluster at ``ray_address``, so the test process can see every actor it starts.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

from airflow_trials import mainjob
from airflow_trials.ports import free_port

PASSWORD = "fault-tests-pw"


@dataclass
class RestStack:
    """A started stack and an authenticated client of its REST API.

    :param stack: what :mod:`airflow_trials.mainjob` started (stopped by :meth:`stop`).
    :param client: an ``httpx.Client`` on the api-server, with the admin's JWT.
    """

    stack: mainjob.Stack
    client: httpx.Client

    def trigger(self, dag_id: str, conf: Mapping[str, Any], run_id: str) -> httpx.Response:
        """``POST /api/v2/dags/{dag_id}/dagRuns``, the body encoded as Python's ``json.dumps``
        encodes it: a float NaN or infinity goes out as the bare ``NaN``/``Infinity`` token."""
        body = {"dag_run_id": run_id, "logical_date": None, "conf": dict(conf)}
        return self.client.post(
            f"/api/v2/dags/{dag_id}/dagRuns",
            content=json.dumps(body),
            headers={"Content-Type": "application/json"},
        )

    def run_state(self, dag_id: str, run_id: str) -> str | None:
        response = self.client.get(f"/api/v2/dags/{dag_id}/dagRuns/{quote(run_id, safe='')}")
        return response.json()["state"] if response.status_code == 200 else None

    def wait_for_runs(
        self, dag_id: str, run_ids: Iterable[str], timeout_s: float
    ) -> dict[str, str]:
        """Poll until every run has ended; returns each run's final state."""
        pending = set(run_ids)
        states: dict[str, str] = {}

        def all_ended() -> bool:
            for run_id in sorted(pending):
                state = self.run_state(dag_id, run_id)
                if state in mainjob.TERMINAL_RUN_STATES:
                    states[run_id] = state
                    pending.discard(run_id)
            return not pending

        self.wait_for(all_ended, timeout_s, f"DAG runs {sorted(pending)} of {dag_id} to end")
        return states

    def wait_for(self, predicate: Callable[[], Any], timeout_s: float, what: str) -> Any:
        """Poll ``predicate`` until it returns a true value; fails at once if Airflow exits."""
        return mainjob.wait_for(predicate, timeout_s, what, self.stack)

    def task_states(self, dag_id: str, run_id: str) -> dict[str, str | None]:
        response = self.client.get(
            f"/api/v2/dags/{dag_id}/dagRuns/{quote(run_id, safe='')}/taskInstances"
        )
        response.raise_for_status()
        return {
            ti["task_id"]: ti["state"]
            for ti in response.json()["task_instances"]
            if ti["map_index"] == -1
        }

    def task_log(self, dag_id: str, run_id: str, task_id: str, try_number: int = 1) -> str:
        """The task's log as text, read through
        ``/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/logs/{try_number}``."""
        response = self.client.get(
            f"/api/v2/dags/{dag_id}/dagRuns/{quote(run_id, safe='')}"
            f"/taskInstances/{task_id}/logs/{try_number}",
            params={"full_content": "true"},
            headers={"Accept": "application/json"},
        )
        response.raise_for_status()
        content = response.json()["content"]
        if isinstance(content, str):
            return content
        return "\n".join(_log_line(line) for line in content)

    def set_connection(self, conn_id: str, conn_type: str, extra: Mapping[str, Any]) -> None:
        """Create or replace a connection in Airflow's metadata DB (tasks read it through the
        API)."""
        self.client.delete(f"/api/v2/connections/{conn_id}")
        response = self.client.post(
            "/api/v2/connections",
            json={
                "connection_id": conn_id,
                "conn_type": conn_type,
                "extra": json.dumps(dict(extra)),
            },
        )
        assert response.status_code == 201, response.text

    def stop(self) -> None:
        self.client.close()
        mainjob.stop(self.stack)


def start_stack(
    home: Path, dag_files: Iterable[Path], ray_address: str, timeout_s: float = 300
) -> RestStack:
    """Prepare and start the main job's stack in ``home`` with only ``dag_files`` to parse, the
    admin's password known, and Ray at ``ray_address``; returns once the DAGs are parsed and
    unpaused."""
    dags = home / "dags"
    dags.mkdir(parents=True)
    dag_ids = []
    for path in dag_files:
        shutil.copy(path, dags / path.name)
        dag_ids.append(path.stem)
    port = free_port()
    stack = mainjob.Stack(home=home, dags_folder=dags)
    mainjob.prepare(stack, api_port=port)
    passwords = home / "passwords.json"
    passwords.write_text(json.dumps({"admin": PASSWORD}))
    stack.env.update(
        {
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords),
            "AIRFLOW__API_AUTH__JWT_SECRET": "fault-tests-" + "s" * 64,
            "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{port}",
            "RAY_ADDRESS": ray_address,
        }
    )
    mainjob.start_airflow(stack)
    base = f"http://127.0.0.1:{port}"
    try:
        token = mainjob.wait_for(
            lambda: _token(base), timeout_s, "the api-server to issue a token", stack
        )
        client = httpx.Client(
            base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=30
        )
        rest = RestStack(stack=stack, client=client)
        for dag_id in dag_ids:
            mainjob.wait_for(
                lambda d=dag_id: client.get(f"/api/v2/dags/{d}").status_code == 200,
                timeout_s,
                f"the DAG {dag_id} to be parsed",
                stack,
            )
            client.patch(f"/api/v2/dags/{dag_id}", json={"is_paused": False}).raise_for_status()
    except BaseException:
        mainjob.stop(stack)
        raise
    return rest


def _log_line(line: Any) -> str:
    """One structured log line as text: its event, then each exception's type and message."""
    if not isinstance(line, dict):
        return str(line)
    errors = [f"{e.get('exc_type')}: {e.get('exc_value')}" for e in line.get("error_detail") or []]
    return "\n".join([str(line.get("event", "")), *errors])


def _token(base: str) -> str | None:
    try:
        response = httpx.post(
            f"{base}/auth/token", json={"username": "admin", "password": PASSWORD}, timeout=5
        )
    except httpx.HTTPError:
        return None
    return response.json()["access_token"] if response.status_code == 201 else None
