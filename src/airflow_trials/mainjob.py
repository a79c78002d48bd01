"""The main job: a real Airflow stack (scheduler, dag-processor, triggerer, api-server) and a local
Ray head on embedded defaults, running the bundled example experiment with trials in parallel.

Everything it starts it stops again, also on Ctrl-C. ``airflow-trials run`` is its CLI.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow_trials.mainjob_tasks import execution_api_answers, task_start_settings
from airflow_trials.ports import free_port

if TYPE_CHECKING:
    from airflow_trials.execution.driver.drain import DrainReport

EXAMPLE_DAG_ID = "example_regression_tuning"
TERMINAL_RUN_STATES = ("success", "failed")


@dataclass
class Stack:
    """Where the embedded deployment lives and what the main job started (so it can stop it).

    :param home: state directory; ``airflow/`` (Airflow home, SQLite DB), ``trials.db``,
        ``storage/``.
    :param dags_folder: the DAGs Airflow runs (this repository's ``dags/``).
    :param experiment_name: the experiment the job runs (its DAG id): on a Ray cluster the job
        did not start, the stop drains and removes only this experiment's trials.
    """

    home: Path
    dags_folder: Path
    experiment_name: str = EXAMPLE_DAG_ID
    ray_address: str | None = None
    started_ray: bool = False
    airflow: subprocess.Popen[bytes] | None = None
    ray: subprocess.Popen[bytes] | None = None
    log_path: Path | None = None
    env: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Absolute: Airflow runs in the home (cwd), and the trials DB URL it is given, and the one
        # results_command prints, must name the same file from any directory.
        self.home = Path(self.home).absolute()

    @property
    def airflow_home(self) -> Path:
        return self.home / "airflow"

    @property
    def trials_db_url(self) -> str:
        return f"sqlite:///{self.home / 'trials.db'}"

    @property
    def storage(self) -> Path:
        return self.home / "storage"


def _bin(name: str) -> str:
    return str(Path(sys.executable).with_name(name))


def default_parallelism() -> int:
    """Task processes at once: two per core. A trial task only launches its trial and defers
    (deferred tasks take no executor slot), so more would only contend for the CPUs and delay
    the first trials' start; on 2 cores, 16 at once started the first trial 3 s later."""
    return max(4, 2 * (os.cpu_count() or 1))


class Interrupts:
    """Ctrl-C and SIGTERM for the main job, never acted on inside a database call.

    Python raises KeyboardInterrupt at whatever bytecode the main thread is at. Inside
    SQLAlchemy's connection pool or sqlite3, between a lock's acquire and its release, that leaves
    the lock held, and the cleanup that then returns the connection waits on it for ever: the job
    hangs instead of stopping (seen under load, with Ctrl-C during a progress read). So the handler
    raises at once only outside :meth:`deferred` sections; inside one it records the signal, and
    the section raises KeyboardInterrupt as it ends.
    """

    def __init__(self) -> None:
        self.requested = threading.Event()
        self._depth = 0

    def install(self) -> None:
        """Handle SIGINT and SIGTERM (a service manager's stop) in this, the main, thread."""
        signal.signal(signal.SIGINT, self._handle)
        signal.signal(signal.SIGTERM, self._handle)

    @staticmethod
    def ignore() -> None:
        """Ignore both from now on: the job is stopping what it started, which must not be cut
        short."""
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)

    def _handle(self, signum: int, frame: Any) -> None:
        self.requested.set()
        if self._depth == 0:
            raise KeyboardInterrupt

    @contextmanager
    def deferred(self) -> Iterator[None]:
        """A section a signal does not interrupt; it raises KeyboardInterrupt at its end instead."""
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
        if self._depth == 0 and self.requested.is_set():
            raise KeyboardInterrupt


INTERRUPTS = Interrupts()


def prepare(stack: Stack, *, parallelism: int | None = None, api_port: int = 8080) -> None:
    """Airflow home with SQLite and LocalExecutor, the trials DB migrated, the GPU pool created."""
    parallelism = parallelism or default_parallelism()
    stack.airflow_home.mkdir(parents=True, exist_ok=True)
    stack.storage.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env.update(
        {
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
            "AIRFLOW_HOME": str(stack.airflow_home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(stack.dags_folder),
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__PARALLELISM": str(parallelism),
            **task_start_settings(),
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__PORT": str(api_port),
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{api_port}/execution/",
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
            "AIRFLOW_TRIALS_DB_URL": stack.trials_db_url,
            "AIRFLOW_TRIALS_STORAGE": str(stack.storage),
            "RAY_AUTH_MODE": env.get("RAY_AUTH_MODE", "disabled"),
            "PYTHONUNBUFFERED": "1",
        }
    )
    stack.env = env
    _run([_bin("airflow"), "db", "migrate"], env, "migrate Airflow's metadata DB")
    from airflow_trials.store import migrate

    migrate(stack.trials_db_url)
    _run(
        [
            _bin("airflow"),
            "pools",
            "set",
            "gpu",
            str(_gpus()),
            "GPUs for airflow_trials (4 slots per GPU)",
            "--include-deferred",
        ],
        env,
        "create the GPU pool",
    )


def _gpus() -> int:
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10)
        return 4 * len([line for line in out.stdout.splitlines() if line.startswith("GPU")])
    except (OSError, subprocess.SubprocessError):
        return 0


def _run(cmd: list[str], env: dict[str, str], what: str) -> str:
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise RuntimeError(
            f"Could not {what} ({' '.join(cmd[:3])} exited {done.returncode}): {' | '.join(tail)}"
        )
    return done.stdout


def start_ray(
    stack: Stack, num_cpus: int | None = None, timeout_s: float = 120, attempts: int = 3
) -> str:
    """Use RAY_ADDRESS when set, else start a local Ray head of our own (stopped at the end).

    The head runs with ``--block`` in its own process group, so stopping it ends exactly its
    processes: other Ray clusters on the machine are left alone (``ray stop`` would kill them).
    Its ports are free ones picked here; another process can take one before the head binds it,
    so a head that exits at start is started again on other ports (``attempts`` times).
    """
    address = os.environ.get("RAY_ADDRESS")
    for attempt in range(1, attempts + 1):
        if address:
            break
        head, port = _start_ray_head(stack, num_cpus)
        deadline = time.monotonic() + timeout_s
        while not _port_open(port):
            if head.poll() is not None or time.monotonic() > deadline:
                _stop_group(head)  # its GCS and raylet, whatever of them started
                if attempt == attempts or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"The local Ray head did not start; see {stack.home / 'ray.log'}."
                    )
                break
            time.sleep(0.5)
        else:
            address = f"127.0.0.1:{port}"
    assert address is not None
    stack.ray_address = address
    stack.env["RAY_ADDRESS"] = address
    return address


def _start_ray_head(stack: Stack, num_cpus: int | None) -> tuple[subprocess.Popen[bytes], int]:
    """Start ``ray start --head`` on free ports; the process and its GCS port."""
    port = free_port()
    cmd = [
        _bin("ray"),
        "start",
        "--head",
        "--block",
        "--port",
        str(port),
        "--node-ip-address",
        "127.0.0.1",
        "--include-dashboard=false",
        "--disable-usage-stats",
        # Ports that default to fixed numbers would collide with other clusters on the machine.
        "--ray-client-server-port",
        str(free_port()),
        "--dashboard-agent-listen-port",
        str(free_port()),
    ]
    if num_cpus:
        cmd += ["--num-cpus", str(num_cpus)]
    log = open(stack.home / "ray.log", "ab")  # noqa: SIM115 - kept open for the child's lifetime
    # On SIGTERM a Ray node drains for 30 s before it stops, for Ray Serve's proxies. This private
    # head serves none, and trials cut short resume from their checkpoints on the next start.
    env = {"RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0", **stack.env}
    head = subprocess.Popen(
        cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    stack.ray, stack.started_ray = head, True
    return head, port


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def start_airflow(stack: Stack) -> None:
    """``airflow standalone``: api-server, scheduler, dag-processor and triggerer, in one process
    group."""
    stack.log_path = stack.home / "airflow.log"
    log = open(stack.log_path, "ab")  # noqa: SIM115 - kept open for the child's lifetime
    stack.airflow = subprocess.Popen(
        [_bin("airflow"), "standalone"],
        env=stack.env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        cwd=str(stack.home),
    )


def wait_for(predicate: Callable[[], Any], timeout_s: float, what: str, stack: Stack) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if stack.airflow is not None and stack.airflow.poll() is not None:
            raise RuntimeError(f"Airflow exited while waiting for {what}; see {stack.log_path}.")
        value = predicate()
        if value:
            return value
        time.sleep(1.0)
    raise TimeoutError(
        f"Timed out after {timeout_s:.0f} s waiting for {what}; see {stack.log_path}."
    )


def _airflow_db(stack: Stack, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    """Read Airflow's SQLite metadata DB (the main job is an admin tool, not task code)."""
    import sqlite3

    path = stack.airflow_home / "airflow.db"
    if not path.exists():
        return []
    with (
        INTERRUPTS.deferred(),
        sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30) as connection,
    ):
        try:
            return connection.execute(sql, args).fetchall()
        except sqlite3.OperationalError:
            return []  # tables not there yet, or locked past the timeout: ask again later


def trigger(stack: Stack, dag_id: str) -> str:
    """Unpause and trigger ``dag_id`` once the dag-processor has parsed it and the api-server's
    execution API answers (:func:`~airflow_trials.mainjob_tasks.execution_api_answers`); returns
    the run_id."""
    wait_for(
        lambda: _airflow_db(stack, "SELECT 1 FROM dag WHERE dag_id = ?", dag_id),
        300,
        f"the DAG {dag_id} to be parsed",
        stack,
    )
    url = stack.env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"]
    wait_for(lambda: execution_api_answers(url), 300, f"Airflow's execution API at {url}", stack)
    run_id = f"main_job__{time.strftime('%Y-%m-%dT%H-%M-%S')}"
    _run([_bin("airflow"), "dags", "unpause", dag_id], stack.env, f"unpause {dag_id}")
    _run(
        [_bin("airflow"), "dags", "trigger", dag_id, "--run-id", run_id],
        stack.env,
        f"trigger {dag_id}",
    )
    return run_id


def interrupted_run(stack: Stack, dag_id: str) -> str | None:
    """The newest run of ``dag_id`` this job triggered that never finished (the job was stopped
    with Ctrl-C, say), so that the next job resumes it rather than starting over."""
    rows = _airflow_db(
        stack,
        "SELECT run_id FROM dag_run WHERE dag_id = ? AND run_id LIKE 'main_job__%' "
        "AND state IN ('queued', 'running') ORDER BY id DESC LIMIT 1",
        dag_id,
    )
    return str(rows[0][0]) if rows else None


def dag_run_state(stack: Stack, dag_id: str, run_id: str) -> str | None:
    rows = _airflow_db(
        stack, "SELECT state FROM dag_run WHERE dag_id = ? AND run_id = ?", dag_id, run_id
    )
    return str(rows[0][0]) if rows else None


def stop(stack: Stack, drain_timeout_s: float | None = None) -> DrainReport | None:
    """Stop Airflow and the Ray head this job started (each its whole process group), after
    the running trials drained: checkpointed and paused (:func:`drain`). Returns the drain's
    report, None when there was nothing to drain."""
    from airflow_trials.execution.driver.drain import drain_failed

    try:
        report = drain(stack, drain_timeout_s)
    except Exception as e:  # noqa: BLE001 - the stop goes on; each trial resumes from storage
        print(drain_failed(e), file=sys.stderr)
        report = None
    if stack.airflow is not None:
        _stop_group(stack.airflow)
    # On a cluster this job did not start, its trials' actors are removed once Airflow stopped:
    # no trigger sees them killed (a failure of the trial); the next job finds them gone (a
    # loss to infrastructure, which spends no max_failures) and resumes them.
    if stack.ray_address and not stack.started_ray:
        _terminate_trial_actors(stack)
    if stack.ray is not None:
        _stop_group(stack.ray)
    if stack.started_ray:
        _forget_ray_head(stack.ray_address)
    return report


def drain(stack: Stack, timeout_s: float | None = None) -> DrainReport | None:
    """Ask this job's running trials to checkpoint and pause, and wait for it, at most
    ``timeout_s`` (default ``[airflow_trials] drain_timeout_seconds``; 0: no drain): what
    they reported is then durable in their storage, and their resume re-runs none of it
    (``execution/driver/drain.py``). None when no Ray of this job runs."""
    from airflow_trials.execution.driver.drain import drain_cluster

    head_gone = stack.ray is not None and stack.ray.poll() is not None
    if not stack.ray_address or head_gone:
        return None
    # On a head this job started, every trial is this job's; on another cluster, only its own.
    prefix = "trial." if stack.started_ray else f"trial.{stack.experiment_name}."
    return drain_cluster(stack.ray_address, timeout_s, prefix)


def _forget_ray_head(address: str | None) -> None:
    """Remove Ray's pointer to the head we stopped, so a later ``ray.init()`` does not look for
    it."""
    import tempfile

    pointer = Path(tempfile.gettempdir()) / "ray" / "ray_current_cluster"
    try:
        # Ray may write the node's IP there rather than 127.0.0.1: compare the port.
        if address and pointer.read_text().strip().rsplit(":", 1)[-1] == address.rsplit(":", 1)[-1]:
            pointer.unlink()
    except OSError:
        pass  # no pointer, or another cluster's: nothing of ours to remove


def _stop_group(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
    try:  # whatever the group still holds: executor workers, task supervisors, Ray workers
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    if proc.poll() is None:
        proc.wait(timeout=10)


def _terminate_trial_actors(stack: Stack) -> None:
    """On a cluster we did not start, remove only what this job's trials left behind."""
    import ray

    from airflow_trials.execution.driver.actor_client import TrialActorClient

    ray.init(address=stack.ray_address, log_to_driver=False)
    try:
        executor = TrialActorClient(str(stack.storage))
        experiment_name = stack.experiment_name
        prefix = f"trial.{experiment_name}."
        for entry in ray.util.list_named_actors(all_namespaces=True):
            if entry["name"].startswith(prefix):
                executor.terminate(experiment_name, entry["name"][len(prefix) :])
    finally:
        ray.shutdown()


STATE_ENV = "AIRFLOW_TRIALS_STATE"


def default_home() -> Path:
    """The main job's state directory: ``$AIRFLOW_TRIALS_STATE``, else ``./.state``."""
    return Path(os.environ.get(STATE_ENV, Path.cwd() / ".state"))


def state_trials_dbs() -> list[Path]:
    """The trials DBs of main jobs' state seen from here, that exist: ``$AIRFLOW_TRIALS_STATE``'s
    and ``./.state``'s ``trials.db`` (absolute, each once). What ``airflow-trials`` names when the
    trials DB it found does not exist."""
    homes = [Path(os.environ[STATE_ENV])] if os.environ.get(STATE_ENV) else []
    found: list[Path] = []
    for home in [*homes, Path.cwd() / ".state"]:
        path = (home / "trials.db").absolute()
        if path.is_file() and path not in found:
            found.append(path)
    return found


def cli_executable() -> list[str]:
    """How to call ``airflow-trials`` of this installation: the console script beside this
    Python (``.venv/bin/airflow-trials``), relative to the current directory when inside it;
    ``python -m airflow_trials.cli`` when there is none."""
    script = Path(sys.executable).with_name("airflow-trials")
    if not script.is_file():
        return [sys.executable, "-m", "airflow_trials.cli"]
    script = script.absolute()
    try:
        relative = str(script.relative_to(Path.cwd().absolute()))
    except ValueError:
        return [str(script)]
    return [relative if os.sep in relative else os.path.join(".", relative)]


def results_command(trials_db_url: str, experiment: str, run_key: str) -> str:
    """The shell line that reads a run's results from the trials DB the job kept, e.g.
    ``.venv/bin/airflow-trials --db-url sqlite:////abs/.state/trials.db leaderboard
    example_regression_tuning --run main_job__2026-11-29T04-43-00``: the CLI's global
    ``--db-url``, then ``leaderboard EXPERIMENT --run RUN_KEY``. The main job prints it as it ends;
    the other read commands (``trials``, ``history``, ``plot``) take the same ``--db-url``."""
    return shlex.join(
        [*cli_executable(), "--db-url", trials_db_url, "leaderboard", experiment, "--run", run_key]
    )


def clean(home: Path) -> None:
    if home.exists():
        shutil.rmtree(home)
