"""FaultStack: a local Ray head and the real Airflow components, each its own process that a test
can stop, kill or freeze alone, driven through Airflow's public REST API.

Everything here is started and ended by PID or process group. ``ray stop`` is never used: it would
kill every Ray cluster on the machine, other people's included.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote

import httpx
import psutil

from airflow_trials import mainjob
from airflow_trials.mainjob_tasks import execution_api_answers
from airflow_trials.ports import free_port
from tests.conftest import REPO

T = TypeVar("T")

AIRFLOW_COMPONENTS = ("api-server", "scheduler", "dag-processor", "triggerer")
TERMINAL_RUN_STATES = ("success", "failed")
ADMIN_PASSWORD = "fault-stack-admin"
#: How long the triggerer's event loop may go without turning before a fault test fails: Airflow
#: warns past 0.2 s; importing Ray when the first trigger loads takes about 1 s here.
LOOP_BLOCK_LIMIT_S = 10.0
_LOOP_BLOCKED = re.compile(r"async thread was blocked for ([0-9.]+) seconds")
NAMESPACE = "airflow_trials"


def _bin(name: str) -> str:
    return str(Path(sys.executable).with_name(name))


# The main job's helper: whether something listens on a port of 127.0.0.1.
port_open = mainjob._port_open


def base_env() -> dict[str, str]:
    """This process's environment, plus what every process of a stack needs: the venv's commands,
    the repository on PYTHONPATH (Ray workers import ``tests.faults.trainables``), no Ray auth."""
    return {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONPATH": os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")])),
        "PYTHONUNBUFFERED": "1",
        "RAY_AUTH_MODE": "disabled",
    }


def wait_for(
    predicate: Callable[[], T],
    timeout_s: float,
    what: str,
    *,
    guard: Callable[[], None] | None = None,
    interval_s: float = 0.5,
) -> T:
    """Poll ``predicate`` until it returns something truthy, and return that.

    ``guard`` is called on every round and raises when waiting has become pointless (a component
    died). Deadlines are generous on purpose: they only bound a hang, they never judge speed.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        if guard is not None:
            guard()
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"Timed out after {timeout_s:.0f} s waiting for {what}.")
        time.sleep(interval_s)


def _spawn(
    argv: list[str], env: Mapping[str, str], log_path: Path, cwd: Path
) -> subprocess.Popen[bytes]:
    """Start ``argv`` in a process group of its own, so it and its children can be signalled
    alone."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            argv,
            env=dict(env),
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=str(cwd),
            start_new_session=True,
        )


def _kill_all(processes: Iterable[psutil.Process], timeout_s: float = 30) -> None:
    processes = list(processes)
    for proc in processes:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(processes, timeout=timeout_s)


def actor_dead(actor: Any) -> bool:
    """Whether Ray reports the actor dead (a kill lands a moment after it is sent)."""
    import ray

    try:
        ray.get(actor.__ray_ready__.remote(), timeout=10)
    except ray.exceptions.RayActorError:
        return True
    except ray.exceptions.GetTimeoutError:
        return False
    return False


def log_tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return f"(no log at {path})"


class RayHead:
    """A local Ray head of its own: ``ray start --head --block`` on a free port, with a private
    temp dir (so Ray's "current cluster" pointer of other clusters on the machine is untouched).

    ``kill()`` SIGKILLs exactly the processes of this head (the ``ray start`` process, its
    children, the workers its raylet started, and anything else naming its temp dir); ``start()``
    again brings up a new head on the same port. The test process connects as a driver
    (:meth:`connect`) to read Ray's state, and disconnects before the head is killed, since a
    driver whose GCS vanishes is aborted by Ray.

    :param env: environment of the head (its workers inherit it: PYTHONPATH must reach the
        trainables).
    :param num_cpus: logical CPUs of the head; default 4.
    """

    def __init__(self, env: Mapping[str, str], num_cpus: int = 4) -> None:
        self.env = dict(env)
        self.num_cpus = num_cpus
        self.port = free_port()
        # Ray's socket paths must stay short: not under pytest's deep tmp_path.
        self.temp_dir = Path(tempfile.mkdtemp(prefix="rayf", dir="/tmp"))
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.temp_dir / f"ray-start-{self.starts}.log"

    def start(self, timeout_s: float = 180) -> None:
        self.starts += 1
        argv = [
            _bin("ray"),
            "start",
            "--head",
            "--block",
            "--port",
            str(self.port),
            "--node-ip-address",
            "127.0.0.1",
            "--num-cpus",
            str(self.num_cpus),
            "--include-dashboard=false",
            "--disable-usage-stats",
            "--temp-dir",
            str(self.temp_dir),
            # Ports that default to fixed numbers would collide with other clusters on the machine.
            "--ray-client-server-port",
            str(free_port()),
            "--dashboard-port",
            str(free_port()),
            "--dashboard-agent-listen-port",
            str(free_port()),
        ]
        self.proc = _spawn(argv, self.env, self.log_path, self.temp_dir)
        wait_for(
            lambda: port_open(self.port),
            timeout_s,
            f"the Ray head on port {self.port}",
            guard=self.check_alive,
        )
        self.connect()

    def check_alive(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            raise AssertionError(
                f"The Ray head on port {self.port} is not running:\n{log_tail(self.log_path)}"
            )

    def connect(self) -> None:
        """Connect the test process to this head (waits until its node is up)."""
        import ray

        if not ray.is_initialized():
            ray.init(address=self.address, namespace=NAMESPACE, log_to_driver=False)

    @staticmethod
    def disconnect() -> None:
        import ray

        if ray.is_initialized():
            ray.shutdown()

    def processes(self) -> list[psutil.Process]:
        """Every live process of this head: the ``ray start`` process and its descendants (Ray's
        workers sit in process groups of their own), and any process naming this head's temp dir."""
        found: dict[int, psutil.Process] = {}
        if self.proc is not None:
            try:
                root = psutil.Process(self.proc.pid)
                for proc in [root, *root.children(recursive=True)]:
                    found[proc.pid] = proc
            except psutil.NoSuchProcess:
                pass
        marker = str(self.temp_dir)
        for proc in psutil.process_iter(["cmdline"]):
            if any(marker in part for part in proc.info["cmdline"] or ()):
                found.setdefault(proc.pid, proc)
        return list(found.values())

    def kill(self) -> None:
        """SIGKILL every process of this head, as a crashed or powered-off head node."""
        self.disconnect()
        _kill_all(self.processes())
        if self.proc is not None:
            self.proc.wait(timeout=30)

    def close(self) -> None:
        self.kill()
        shutil.rmtree(self.temp_dir, ignore_errors=True)


class FaultStack:
    """The real Airflow components (api-server, scheduler, dag-processor, triggerer), each a
    separate process in a process group of its own, in a temporary AIRFLOW_HOME (SQLite metadata
    DB, LocalExecutor), running the DAG files written to its DAGs folder against ``ray``.

    Each component can be started, stopped (SIGTERM, as Ctrl-C), killed (SIGKILL), frozen (SIGSTOP)
    and thawed on its own. While a component is meant to run, :meth:`wait_for` fails at once when
    it exits, with its log's tail, rather than waiting out its deadline.

    Tasks and triggers reach Ray through ``RAY_ADDRESS``, the trials DB through
    ``AIRFLOW_TRIALS_DB_URL`` and checkpoints through the ``ray_default`` connection's
    ``storage_path`` extra (an ``AIRFLOW_CONN_RAY_DEFAULT`` environment connection).

    :param home: the stack's directory (Airflow home, DAGs, checkpoints, component logs).
    :param ray: the Ray head tasks and triggers use.
    :param trials_db_url: the trials DB (its schema must exist).
    :param airflow_db: a migrated Airflow metadata DB to copy; default None (migrate a new one).
    :param parallelism: ``[core] parallelism``; default 4.
    :param settings: more environment settings (``AIRFLOW__SECTION__KEY`` and the like); default
        none.
    """

    def __init__(
        self,
        home: Path,
        ray: RayHead,
        trials_db_url: str,
        *,
        airflow_db: Path | None = None,
        parallelism: int = 4,
        settings: Mapping[str, str] | None = None,
    ) -> None:
        self.home = home
        self.ray = ray
        self.trials_db_url = trials_db_url
        self.api_port = free_port()
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.expected: set[str] = set()  # started and not stopped: must be running
        self.starts: dict[str, int] = dict.fromkeys(AIRFLOW_COMPONENTS, 0)
        # When each start ("triggerer-2") was told to stop (epoch seconds): what it logs while it
        # shuts down (Airflow's watchdog counting a stopping runner's silence) is no stall.
        self.stopping_since: dict[str, float] = {}
        self.storage = home / "storage"
        self.dags_folder = home / "dags"
        for folder in (self.airflow_home, self.storage, self.dags_folder, self.logs):
            folder.mkdir(parents=True, exist_ok=True)
        passwords = home / "passwords.json"
        passwords.write_text(json.dumps({"admin": ADMIN_PASSWORD}))
        self.env = {
            **base_env(),
            "AIRFLOW_HOME": str(self.airflow_home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(self.dags_folder),
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__PARALLELISM": str(parallelism),
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.base_url}/execution/",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords),
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__PORT": str(self.api_port),
            "AIRFLOW__API__BASE_URL": self.base_url,
            "AIRFLOW__API__WORKERS": "1",
            "AIRFLOW__API_AUTH__JWT_SECRET": "fault-stack-" + "j" * 64,
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "2",
            # Log servers default to fixed ports, which other stacks on the machine may hold.
            "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port()),
            "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(free_port()),
            "AIRFLOW__TRIGGERER__TRIGGERER_HEALTH_CHECK_THRESHOLD": "15",
            "AIRFLOW_CONN_RAY_DEFAULT": json.dumps(
                {
                    "conn_type": "ray",
                    "extra": {"namespace": NAMESPACE, "storage_path": str(self.storage)},
                }
            ),
            "AIRFLOW_TRIALS_DB_URL": trials_db_url,
            "RAY_ADDRESS": ray.address,
            **(settings or {}),
        }
        if airflow_db is not None:
            shutil.copy(airflow_db, self.airflow_home / "airflow.db")
        else:
            migrate_airflow_db(self.airflow_home)
        self._client: httpx.Client | None = None

    # -- layout
    # -------------------------------------------------------------------------------------
    @property
    def airflow_home(self) -> Path:
        return self.home / "airflow"

    @property
    def logs(self) -> Path:
        return self.home / "logs"

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    def log_path(self, name: str) -> Path:
        return self.logs / f"{name}-{self.starts[name]}.log"

    def write_dag(self, file_name: str, source: str) -> Path:
        path = self.dags_folder / file_name
        path.write_text(source)
        return path

    # -- processes
    # ----------------------------------------------------------------------------------
    def start(self, *names: str, timeout_s: float = 180) -> None:
        """Start components (all four by default); each gets a new log file.

        The api-server first, and the others once it answers its health check, as the
        docker-compose stack orders them (``depends_on: condition: service_healthy``): the
        triggerer's supervisor asks the api-server for its triggers' connections and waits
        (retrying) while it starts, reading nothing from its runner meanwhile, so a triggerer
        started beside a slow api-server logs "appears deadlocked" though no trigger blocked."""
        wanted = names or AIRFLOW_COMPONENTS
        for name in sorted(wanted, key=lambda n: n != "api-server"):
            if self.is_running(name):
                raise AssertionError(f"{name} is running already (pid {self.pid(name)}).")
            self.starts[name] += 1
            argv = [_bin("airflow"), name]
            if name == "api-server":
                argv += ["--port", str(self.api_port), "--host", "127.0.0.1"]
            self.procs[name] = _spawn(argv, self.env, self.log_path(name), self.home)
            self.expected.add(name)
            if name == "api-server":
                self.wait_for(self._api_server_healthy, timeout_s, "the api-server's health check")
                # Its execution API sets itself up on its first request (15 to 50 s on a loaded
                # 2-core machine) and holds every task's start meanwhile: a run triggered before
                # then could fail its first task once that task's client ran out of retries. The
                # main job waits for it the same way before it triggers a run.
                self.wait_for(
                    lambda: execution_api_answers(f"{self.base_url}/execution/", timeout_s),
                    timeout_s,
                    "the execution API's health check",
                )

    def _api_server_healthy(self) -> bool:
        try:
            response = httpx.get(f"{self.base_url}/api/v2/monitor/health", timeout=5)
        except httpx.HTTPError:
            return False
        return response.status_code == 200

    def pid(self, name: str) -> int:
        return self.procs[name].pid

    def is_running(self, name: str) -> bool:
        proc = self.procs.get(name)
        return proc is not None and proc.poll() is None

    def signal(self, name: str, sig: signal.Signals) -> None:
        """Send ``sig`` to the component's whole process group (its workers and task processes
        too)."""
        try:
            os.killpg(self.pid(name), sig)
        except ProcessLookupError:
            pass

    def stop(self, *names: str, timeout_s: float = 120) -> dict[str, int | None]:
        """SIGTERM components (all by default) at once, as Ctrl-C does, and wait for them to exit;
        returns each one's exit code (None: it had to be SIGKILLed after ``timeout_s``)."""
        names = names or tuple(n for n in AIRFLOW_COMPONENTS if n in self.procs)
        for name in names:
            self.expected.discard(name)
            self.stopping_since.setdefault(f"{name}-{self.starts[name]}", time.time())
            self.signal(name, signal.SIGTERM)
        codes: dict[str, int | None] = {}
        deadline = time.monotonic() + timeout_s
        for name in names:
            try:
                codes[name] = self.procs[name].wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                codes[name] = None
            self.kill(name)  # what the group still holds (executor workers, task processes)
        return codes

    def kill(self, name: str) -> None:
        """SIGKILL the component's process group, as the OOM killer or a lost machine would."""
        self.expected.discard(name)
        self.stopping_since.setdefault(f"{name}-{self.starts[name]}", time.time())
        self.signal(name, signal.SIGKILL)
        self.procs[name].wait(timeout=60)

    def freeze(self, pids: Iterable[int]) -> None:
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)

    def check_alive(self) -> None:
        """Raise, with its log, if a component that was started (and not stopped) has exited."""
        for name in sorted(self.expected):
            proc = self.procs[name]
            if proc.poll() is not None:
                raise AssertionError(
                    f"Airflow's {name} (pid {proc.pid}) exited with {proc.returncode} while it "
                    "should "
                    f"run; its log ends:\n{log_tail(self.log_path(name))}"
                )
        self.ray.check_alive()

    def assert_triggerer_responsive(self, since: float = 0.0) -> None:
        """No triggerer's event loop stalled after ``since`` (epoch seconds) while it ran.

        The runner's own watchdog (Airflow's ``block_watchdog``) logs "async thread was blocked
        for N seconds" when the loop that runs the triggers did not turn for N seconds: a trigger
        that blocks it stalls every deferred task of the deployment, so over
        ``LOOP_BLOCK_LIMIT_S`` fails. It is the direct measure, and the only one asserted.

        The supervisor's "appears deadlocked" (no message from the runner for 30 s) is not a
        measure of the triggers: the supervisor counts from the last message it read to the end
        of its own loop's turn, which also writes trigger events to Airflow's metadata DB (SQLite
        here, shared with the scheduler) and waits on the api-server. CI saw it once at 39 s,
        on a node running two stacks on two cores, with no block of the runner's loop logged
        beside it. Such lines are shown with a failure, as context. A triggerer told to stop is
        left out from then on: its runner stops answering as it shuts down, and how long that
        takes is test_stack_restart.py's subject."""
        stalls, silences = [], []
        for start in range(1, self.starts["triggerer"] + 1):
            until = self.stopping_since.get(f"triggerer-{start}", math.inf)
            for line in (
                (self.logs / f"triggerer-{start}.log").read_text(errors="replace").splitlines()
            ):
                blocked = _LOOP_BLOCKED.search(line)
                stalled = blocked is not None and float(blocked.group(1)) > LOOP_BLOCK_LIMIT_S
                silent = "appears deadlocked" in line
                if (stalled or silent) and since <= _logged_at(line) < until:
                    (stalls if stalled else silences).append(f"triggerer-{start}.log: {line}")
        assert not stalls, (
            "The triggerer's event loop stalled:\n"
            + "\n".join(stalls)
            + ("\nIts supervisor meanwhile:\n" + "\n".join(silences) if silences else "")
        )

    def wait_for(
        self, predicate: Callable[[], T], timeout_s: float, what: str, interval_s: float = 0.5
    ) -> T:
        """:func:`wait_for` that fails at once when a component or the Ray head died."""
        return wait_for(predicate, timeout_s, what, guard=self.check_alive, interval_s=interval_s)

    def close(self) -> None:
        """SIGKILL every component's process group: a test's stack has nothing to save, and a
        graceful stop costs seconds per component (the cases that stop them gracefully test
        that)."""
        if self._client is not None:
            self._client.close()
        for name in list(self.procs):
            self.expected.discard(name)
            self.signal(name, signal.SIGKILL)
            self.procs[name].wait(timeout=60)

    # -- the REST API
    # --------------------------------------------------------------------------------
    #: The admin's password on this stack's api-server.
    admin_password = ADMIN_PASSWORD

    def _token(self) -> str | None:
        try:
            response = httpx.post(
                f"{self.base_url}/auth/token",
                json={"username": "admin", "password": self.admin_password},
                timeout=10,
            )
        except httpx.HTTPError:
            return None
        return response.json()["access_token"] if response.status_code == 201 else None

    @property
    def client(self) -> httpx.Client:
        """A client of the api-server with the admin's JWT from ``/auth/token``."""
        if self._client is None:
            token = self.wait_for(self._token, 300, "the api-server to issue a token")
            self._client = httpx.Client(
                base_url=self.base_url, timeout=60, headers={"Authorization": f"Bearer {token}"}
            )
        return self._client

    def api(self, method: str, path: str, **kwargs: Any) -> Any:
        """Call ``/api/v2{path}``; returns the JSON body, raising on an error status."""
        response = self.client.request(method, f"/api/v2{path}", **kwargs)
        if response.status_code >= 400:
            raise AssertionError(
                f"{method} /api/v2{path} answered {response.status_code}: {response.text}"
            )
        return response.json()

    def _get_or_none(self, path: str) -> Any:
        try:
            response = self.client.get(f"/api/v2{path}")
        except httpx.HTTPError:
            return None  # the api-server is restarting
        return response.json() if response.status_code == 200 else None

    def wait_for_dag(self, dag_id: str, timeout_s: float = 300) -> None:
        self.wait_for(
            lambda: self._get_or_none(f"/dags/{dag_id}"), timeout_s, f"DAG {dag_id} to be parsed"
        )

    def trigger(self, dag_id: str, run_id: str | None = None) -> str:
        """Trigger a run of ``dag_id`` once it is parsed; returns its run id."""
        self.wait_for_dag(dag_id)
        body = {"dag_run_id": run_id or f"fault__{time.strftime('%H-%M-%S')}", "logical_date": None}
        return str(self.api("POST", f"/dags/{dag_id}/dagRuns", json=body)["dag_run_id"])

    def dag_run(self, dag_id: str, run_id: str) -> dict[str, Any]:
        return dict(self.api("GET", f"/dags/{dag_id}/dagRuns/{quote(run_id, safe='')}"))

    def wait_for_run(self, dag_id: str, run_id: str, timeout_s: float = 600) -> str:
        """Wait until the run has ended; returns its state."""
        path = f"/dags/{dag_id}/dagRuns/{quote(run_id, safe='')}"

        def ended() -> str | None:
            run = self._get_or_none(path)
            return run["state"] if run and run["state"] in TERMINAL_RUN_STATES else None

        return self.wait_for(ended, timeout_s, f"run {run_id} of {dag_id} to end")

    def task_instances(
        self, dag_id: str, run_id: str, task_id: str | None = None
    ) -> list[dict[str, Any]]:
        """The run's task instances (mapped ones one per map index), optionally of one task."""
        body = self.api(
            "GET",
            f"/dags/{dag_id}/dagRuns/{quote(run_id, safe='')}/taskInstances",
            params={"limit": 100},
        )
        tis = body["task_instances"]
        return [ti for ti in tis if task_id is None or ti["task_id"] == task_id]

    def tries(
        self, dag_id: str, run_id: str, task_id: str, map_index: int = -1
    ) -> list[dict[str, Any]]:
        """Every try of a task instance, oldest first (each with its ``try_number`` and
        ``state``)."""
        body = self.api(
            "GET",
            f"/dags/{dag_id}/dagRuns/{quote(run_id, safe='')}/taskInstances/"
            f"{task_id}/{map_index}/tries",
        )
        return sorted(body["task_instances"], key=lambda t: t["try_number"])

    def clear(self, dag_id: str, run_id: str, task_id: str, map_index: int) -> list[dict[str, Any]]:
        """Clear one task instance, whatever its state, as the UI's Clear button does."""
        body = {
            "dry_run": False,
            "dag_run_id": run_id,
            "task_ids": [[task_id, map_index]],
            "only_failed": False,
            "reset_dag_runs": True,
        }
        return list(
            self.api("POST", f"/dags/{dag_id}/clearTaskInstances", json=body)["task_instances"]
        )

    def xcom(self, dag_id: str, run_id: str, task_id: str, key: str, map_index: int = -1) -> Any:
        """A task instance's XCom value under ``key``, as Airflow's DB holds it (through the REST
        API)."""
        body = self.api(
            "GET",
            f"/dags/{dag_id}/dagRuns/{quote(run_id, safe='')}/taskInstances/{task_id}/"
            f"xcomEntries/{key}",
            params={"map_index": map_index},
        )
        return body["value"]

    def task_log(
        self, dag_id: str, run_id: str, task_id: str, try_number: int, map_index: int = -1
    ) -> str:
        """One try's log as plain text (the task process's lines and the trigger's), through the
        REST API; a try that Airflow dropped from the task's history (the API answers 404) is read
        from its log files, which stay on disk."""
        response = self.client.get(
            f"/api/v2/dags/{dag_id}/dagRuns/{quote(run_id, safe='')}"
            f"/taskInstances/{task_id}/logs/{try_number}",
            params={"full_content": "true", "map_index": map_index},
            headers={"Accept": "application/json"},
        )
        if response.status_code == 404:
            folder = (
                self.airflow_home
                / "logs"
                / f"dag_id={dag_id}"
                / f"run_id={run_id}"
                / f"task_id={task_id}"
                / (f"map_index={map_index}" if map_index >= 0 else "")
            )
            return "\n".join(
                path.read_text() for path in sorted(folder.glob(f"attempt={try_number}.log*"))
            )
        if response.status_code >= 400:
            raise AssertionError(
                f"Reading the log of {task_id} try {try_number} answered "
                f"{response.status_code}: {response.text}"
            )
        content = response.json()["content"]
        if isinstance(content, str):
            return content
        return "\n".join(
            json.dumps(line) if isinstance(line, dict) else str(line) for line in content
        )

    # -- task processes
    # ------------------------------------------------------------------------------
    def task_processes(self, ti_id: str) -> list[psutil.Process]:
        """The processes running a task instance under the LocalExecutor: its task process
        (``airflow worker -- <ti id>``), whose parent is the worker supervising it."""
        found = []
        for proc in psutil.process_iter(["cmdline"]):
            # setproctitle pads the command line with empty arguments.
            if " ".join(filter(None, proc.info["cmdline"] or ())) == f"airflow worker -- {ti_id}":
                found.append(proc)
        return found


def _logged_at(line: str) -> float:
    """The time of a component's log line (``2026-11-23T11:00:29.248367Z [error ] ...``); a line
    without one counts as the latest."""
    try:
        return datetime.datetime.fromisoformat(
            line.split(" ", 1)[0].replace("Z", "+00:00")
        ).timestamp()
    except ValueError:
        return float("inf")


def migrate_airflow_db(airflow_home: Path) -> Path:
    """Create a SQLite Airflow metadata DB in ``airflow_home``; returns its path."""
    env = {**base_env(), "AIRFLOW_HOME": str(airflow_home), "AIRFLOW__CORE__LOAD_EXAMPLES": "False"}
    done = subprocess.run(
        [_bin("airflow"), "db", "migrate"], env=env, capture_output=True, text=True, timeout=600
    )
    if done.returncode != 0:
        raise AssertionError(
            f"airflow db migrate failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
        )
    return airflow_home / "airflow.db"
