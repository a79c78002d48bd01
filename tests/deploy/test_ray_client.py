"""Airflow reaching Ray through Ray Client (ray://), as the compose stack does, against a real head.

A `ray start --head` of our own (free ports, its own process group) stands in for the compose
`ray-head` service: its healthchecks pass, the init job's script runs against it, and a trial
task started in one process (which then exits, as a deferred task's process does) is watched to
its end by the trigger in another, all over `ray://`. Teardown leaves no process of that head.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from airflow_trials.ports import free_port
from tests.conftest import REPO, live_placement_groups, live_trial_actors, shutdown_ray
from tests.deploy.compose import services

BIN = os.path.dirname(sys.executable)
NAMESPACE = "deploy_ray_client"
AGENT_PORT_IN_COMPOSE = "52365"


def _free_ports(count: int) -> list[int]:
    ports: set[int] = set()
    while len(ports) < count:
        ports.add(free_port())
    return list(ports)


def _head_env() -> dict[str, str]:
    env = os.environ.copy()
    env["RAY_AUTH_MODE"] = "disabled"
    env["RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S"] = "0"  # no Ray Serve here to drain for, on SIGTERM
    env.pop("RAY_ADDRESS", None)
    return env


def _healthcheck(service: str) -> list[str]:
    """The service's healthcheck command from docker-compose.yml, without the CMD marker."""
    test = services()[service]["healthcheck"]["test"]
    assert test[0] == "CMD", f"{service}'s healthcheck should be an exec-form CMD, got {test[0]}"
    return list(test[1:])


def _head_healthy(gcs_port: int) -> bool:
    """The compose ray-head healthcheck against our head; as in Docker, running past its timeout
    fails."""
    cmd = [arg.replace(":6379", f":{gcs_port}") for arg in _healthcheck("ray-head")]
    cmd[0] = os.path.join(BIN, cmd[0])
    timeout = services()["ray-head"]["healthcheck"]["timeout"]
    assert timeout.endswith("s"), f"ray-head's healthcheck timeout {timeout!r} is not in seconds"
    try:
        done = subprocess.run(
            cmd, env=_head_env(), capture_output=True, timeout=float(timeout[:-1])
        )
    except subprocess.TimeoutExpired:
        return False
    return done.returncode == 0


def _stop_group(proc: subprocess.Popen[bytes]) -> None:
    for sig, wait_s in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            try:
                os.killpg(proc.pid, 0)
            except ProcessLookupError:
                return
            proc.poll()
            time.sleep(0.2)


def _forget_head(gcs_port: int) -> None:
    """Remove Ray's pointer to our head (if it is ours), so no later ray.init() looks for it."""
    pointer = Path(tempfile.gettempdir()) / "ray" / "ray_current_cluster"
    try:
        if pointer.read_text().strip().rsplit(":", 1)[-1] == str(gcs_port):
            pointer.unlink()
    except OSError:
        pass  # no pointer, or another cluster's


@pytest.fixture(scope="module")
def ray_head(tmp_path_factory) -> Iterator[SimpleNamespace]:
    """A Ray head with a Ray Client server, like the compose ray-head, in its own process group."""
    shutdown_ray()  # a driver connected to a local Ray would make the hooks skip ray.init(ray://)
    gcs, client, agent, dashboard = _free_ports(4)
    log_path = tmp_path_factory.mktemp("ray_head") / "head.log"
    cmd = [
        os.path.join(BIN, "ray"),
        "start",
        "--head",
        "--block",
        f"--port={gcs}",
        f"--ray-client-server-port={client}",
        f"--dashboard-agent-listen-port={agent}",
        f"--dashboard-port={dashboard}",
        "--num-cpus=2",
        "--num-gpus=0",
        "--include-dashboard=false",
        "--disable-usage-stats",
    ]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            cmd, env=_head_env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        deadline = time.monotonic() + 120
        while not _head_healthy(gcs):
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(
                    f"The Ray head never passed the compose healthcheck; see {log_path}:\n"
                    + log_path.read_text()[-2000:]
                )
            time.sleep(1)
        yield SimpleNamespace(
            gcs_port=gcs,
            client_port=client,
            agent_port=agent,
            address=f"ray://127.0.0.1:{client}",
            pgid=proc.pid,
        )
    finally:
        shutdown_ray()
        _stop_group(proc)
        _forget_head(gcs)
    with pytest.raises(ProcessLookupError):
        os.killpg(proc.pid, 0)  # nothing of that head is left


def _ray_conn(address: str, storage: str) -> str:
    return json.dumps(
        {
            "conn_type": "ray",
            "host": address,
            "extra": {"namespace": NAMESPACE, "storage_path": storage},
        }
    )


def test_the_compose_worker_healthcheck_sees_a_live_raylet(ray_head):
    cmd = [
        arg.replace(AGENT_PORT_IN_COMPOSE, str(ray_head.agent_port))
        for arg in _healthcheck("ray-worker")
    ]
    assert cmd[0] == "python"
    done = subprocess.run([sys.executable, *cmd[1:]], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_the_head_healthcheck_fails_without_a_client_server():
    (gcs,) = _free_ports(1)
    assert not _head_healthy(gcs)


def test_the_init_script_prepares_both_dbs_the_pool_and_checkpoints_and_reaches_ray(
    ray_head, airflow_home, tmp_path
):
    from airflow.models.pool import Pool

    from airflow_trials.store import TrialStore

    env = _head_env()
    env.update(
        {
            "PATH": os.pathsep.join([BIN, env.get("PATH", "")]),
            "AIRFLOW_CONN_RAY_DEFAULT": _ray_conn(ray_head.address, str(tmp_path / "ckpt")),
            "AIRFLOW_CONN_TRIALS_DEFAULT": json.dumps(
                {"conn_type": "trials_db", "host": str(tmp_path / "trials.db")}
            ),
            "AIRFLOW_TRIALS_STORAGE": str(tmp_path / "ckpt"),
            "TRIALS_GPU_POOL": "deploy_test_gpu",
            "TRIALS_GPU_POOL_GPUS": "2",
            "TRIALS_SLOTS_PER_GPU": "3",
        }
    )
    done = subprocess.run(
        ["bash", os.path.join(REPO, "deploy", "airflow-init.sh")],
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert f"Ray at {ray_head.address}: " in done.stdout and "'CPU': 2.0" in done.stdout
    assert (tmp_path / "ckpt").is_dir()
    store = TrialStore(f"sqlite:///{tmp_path / 'trials.db'}")
    try:
        assert store.reader.list_experiments() == []  # migrated: the tables exist
    finally:
        store.dispose()
    pool = Pool.get_pool("deploy_test_gpu")
    assert pool is not None and pool.slots == 6 and pool.include_deferred


_START_AND_EXIT = """
import json, sys
from airflow.sdk.exceptions import TaskDeferred
from airflow_trials.operators.trial_operator import RunTrialOperator

class TI:
    dag_id, run_id, task_id, map_index, try_number = "deploy", "run1", "trial", -1, 1
    def xcom_push(self, key, value): pass

op = RunTrialOperator(task_id="trial", trainable="tests.trainables:counting",
                      experiment_name="deploy", trial_id="over-client", config={"sleep": 0.2},
                      stopping_criterion={"training_iteration": 4}, resources_per_trial={"cpu": 1},
                      poll_interval_seconds=0.05, deferrable=True)
try:
    op.execute({"ti": TI()})
except TaskDeferred as deferred:
    import ray
    print(json.dumps({"client": ray.util.client.ray.is_connected(),
                      "trigger": deferred.trigger.serialize()}))
    sys.stdout.flush()
    import os
    os._exit(0)  # as a task process that deferred: gone without a clean Ray shutdown
sys.exit("the operator did not defer")
"""


def test_a_trial_started_in_one_process_is_watched_to_its_end_from_another(
    ray_head, tmp_path, monkeypatch
):
    import ray

    from airflow_trials.operators.trial_operator import RunTrialOperator
    from airflow_trials.store import TrialStore
    from airflow_trials.triggers.trial_trigger import TrialTrigger

    storage = tmp_path / "ckpt"
    url = f"sqlite:///{tmp_path / 'trials.db'}"
    TrialStore(url, create=True).dispose()
    monkeypatch.setenv("AIRFLOW_CONN_RAY_DEFAULT", _ray_conn(ray_head.address, str(storage)))
    monkeypatch.setenv("AIRFLOW_TRIALS_DB_URL", url)

    env = _head_env()
    done = subprocess.run(
        [sys.executable, "-c", _START_AND_EXIT],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    started = json.loads(done.stdout.strip().splitlines()[-1])
    assert started["client"] is True  # the task connected through Ray Client, not a local Ray
    classpath, kwargs = started["trigger"]
    assert classpath == "airflow_trials.triggers.trial_trigger.TrialTrigger"

    async def first_event() -> dict:
        async for event in TrialTrigger(**kwargs).run():
            return event.payload
        raise AssertionError("the trigger yielded no event")

    try:
        event = asyncio.run(asyncio.wait_for(first_event(), timeout=120))
        assert ray.util.client.ray.is_connected()  # the trigger, too, went through ray://
        assert event["status"] == "TERMINATED" and event["last_result"]["training_iteration"] == 4

        class TI:
            dag_id, run_id, task_id, map_index, try_number = "deploy", "run1", "trial", -1, 1

            def __init__(self):
                self.xcom = {}

            def xcom_push(self, key, value):
                self.xcom[key] = value

        op = RunTrialOperator(
            task_id="trial",
            trainable="tests.trainables:counting",
            experiment_name="deploy",
            trial_id="over-client",
        )
        state = op.execute_complete({"ti": TI()}, event)
        assert state["status"] == "TERMINATED"
        assert state["best_checkpoint"] == str(
            storage / "deploy" / "over-client" / "checkpoint_000004"
        )
        assert (storage / "deploy" / "over-client" / "checkpoint_000004").is_dir()
        store = TrialStore(url)
        try:
            assert [r["training_iteration"] for r in store.reader.get_results("over-client")] == [
                1,
                2,
                3,
                4,
            ]
        finally:
            store.dispose()
        assert live_trial_actors() == [] and live_placement_groups() == []
    finally:
        shutdown_ray()
