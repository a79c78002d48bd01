"""The production shape on one machine, without docker: ``airflow-trials shape up``.

:class:`LocalShape` starts what :mod:`airflow_trials.shape.spec` describes, each part a process
of its own (in a process group of its own) that can be stopped, killed or started again alone:
Redis and an S3-API server (moto's server mode, standing in for S3), then the three Ray nodes,
then Airflow's api-server, scheduler, dag-processor, two triggerers and two Celery workers.
PostgreSQL is the machine's server: the shape creates its own two databases there (Airflow's
metadata DB and the trials DB), named after its home directory.

Everything it started is written to ``<home>/shape.json``, so ``airflow-trials shape down``, from
another shell, stops exactly those processes. ``ray stop`` is never used: it would kill every Ray
cluster on the machine.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import hashlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from airflow_trials.shape import setup, spec, triggerers
from airflow_trials.shape.setup import ShapeError, log_says, log_tail, port_open, write_private
from airflow_trials.shape.spec import Addresses, Process

T = TypeVar("T")

DEFAULT_POSTGRES_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
ADMIN_PASSWORD = "shape-admin"
BACKING = ("redis", "s3")
STATE_FILE = "shape.json"
PASSWORDS_FILE = "passwords.json"
# ``ray start`` gives a node's raylet 30 s to register with the GCS, then exits with this; on a
# loaded machine the node is started again, up to this many times in all.
RAY_STARTUP_TIMED_OUT = "timed out during startup"
RAY_START_TRIES = 3


class LocalShape:
    """The production shape as local processes, under ``home``.

    :param home: the shape's directory: Airflow home, logs, ``shape.json``.
    :param dags_folder: the DAGs Airflow runs; default the one ``shape.json`` names (what
        ``shape up --dags-folder`` gave), else ``dags``.
    :param postgres_url: a PostgreSQL server URL (any database on it); the shape creates its two
        databases there.
    :param ray_cpus: logical CPUs of each Ray worker node; default 4.
    :param env: more environment for every process (e.g. ``PYTHONPATH`` for the trainables).
    """

    def __init__(
        self,
        home: Path,
        *,
        dags_folder: Path | None = None,
        postgres_url: str = DEFAULT_POSTGRES_URL,
        ray_cpus: int = 4,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.home = Path(home).resolve()
        state = self._read_state()
        self.dags_folder = Path(dags_folder or (state or {}).get("dags_folder") or "dags").resolve()
        self.postgres_url = postgres_url
        self.ray_cpus = ray_cpus
        self.extra_env = dict(env or {})
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.expected: set[str] = set()  # started and not stopped: must be running
        self.starts: dict[str, int] = {}
        # Each LocalShape (each `shape up`) logs to files of its own: a worker's "ready." from an
        # earlier one must not end a wait early.
        self.session = time.strftime("%Y%m%dT%H%M%S")
        # Each triggerer's job id in Airflow's metadata DB (its triggers' ``triggerer_id``).
        self.triggerer_jobs: dict[str, int] = {}
        self.supervised = False  # a Supervisor watches: what dies is its to start again
        if state:
            self.addresses = Addresses(**state["addresses"])
            self.ray_temp_dirs: dict[str, str] = state["ray_temp_dirs"]
        else:
            self.addresses = self._new_addresses()
            self.ray_temp_dirs = {}  # made when a node first starts
        self.processes = {
            p.name: p for p in self._backing() + spec.processes(self.addresses, ray_cpus=ray_cpus)
        }

    # -- layout ---------------------------------------------------------------------------------
    @property
    def airflow_home(self) -> Path:
        return self.home / "airflow"

    @property
    def logs(self) -> Path:
        return self.home / "logs"

    def log_path(self, name: str) -> Path:
        """The log of the process's current start: ``logs/<name>-<session>-<start>.log``."""
        return self.logs / f"{name}-{self.session}-{self.starts.get(name, 0)}.log"

    @property
    def database_names(self) -> tuple[str, str]:
        """Airflow's metadata DB and the trials DB: named after the home, so two shapes on one
        server keep apart and a shape started again finds its own."""
        tag = hashlib.sha1(str(self.home).encode()).hexdigest()[:8]
        return f"shape_{tag}_airflow", f"shape_{tag}_trials"

    def _database_url(self, name: str) -> str:
        base, _, _ = self.postgres_url.rpartition("/")
        return f"{base}/{name}"

    def _new_addresses(self) -> Addresses:
        airflow_db, trials_db = self.database_names
        return spec.new_addresses(self._database_url(airflow_db), self._database_url(trials_db))

    def _backing(self) -> list[Process]:
        return spec.backing_processes(self.addresses, self.home)

    # -- state ----------------------------------------------------------------------------------
    def _read_state(self) -> dict[str, Any] | None:
        path = self.home / STATE_FILE
        return json.loads(path.read_text()) if path.exists() else None

    def _write_state(self) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        # Processes another command started (``shape restart``) keep their pids while they live.
        saved = {n: pid for n, pid in self.saved_pids().items() if n not in self.procs}
        state = {
            "addresses": dataclasses.asdict(self.addresses),
            "ray_temp_dirs": self.ray_temp_dirs,
            "dags_folder": str(self.dags_folder),
            "pids": {
                **{n: pid for n, pid in saved.items() if setup.pid_alive(pid)},
                **{n: proc.pid for n, proc in self.procs.items() if _alive(proc)},
            },
        }
        write_private(self.home / STATE_FILE, json.dumps(state, indent=1))

    def _write_passwords(self) -> None:
        write_private(self.home / PASSWORDS_FILE, json.dumps({"admin": ADMIN_PASSWORD}))

    # -- environment ----------------------------------------------------------------------------
    def env_for(self, process: Process) -> dict[str, str]:
        """The environment of ``process``: the machine's, the venv's commands first, the shape's
        settings and the process's own."""
        base = {
            **os.environ,
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
            "PYTHONUNBUFFERED": "1",
            "RAY_AUTH_MODE": "disabled",
            # On SIGTERM a Ray node drains for 30 s before it stops; this shape serves nothing
            # that needs it, and trials cut short resume from their checkpoints.
            "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0",
            **self.extra_env,
        }
        if process.kind == "ray":
            return {**base, **spec.ray_node_settings(self.addresses), **process.env}
        if process.kind == "backing":
            return base
        return {**base, **self.airflow_env(), **process.env}

    def airflow_env(self) -> dict[str, str]:
        api = self.addresses.api_url
        return {
            **spec.airflow_settings(self.addresses),
            "AIRFLOW_HOME": str(self.airflow_home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(self.dags_folder),
            "AIRFLOW__CORE__PARALLELISM": "32",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(self.home / PASSWORDS_FILE),
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__PORT": str(self.addresses.api_port),
            "AIRFLOW__API__BASE_URL": api,
            "AIRFLOW__API__WORKERS": "1",
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "2",
            "RAY_ADDRESS": self.addresses.ray_address,
        }

    def client_env(self) -> dict[str, str]:
        """What a shell needs to use this shape: ``airflow`` and ``airflow-trials`` commands,
        a Ray driver, and s3fs (``airflow-trials shape env`` prints it)."""
        env = self.airflow_env()
        keep = (
            "AIRFLOW_HOME",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_ASYNC",
            "AIRFLOW__CORE__DAGS_FOLDER",
            "AIRFLOW_TRIALS_DB_URL",
            "AIRFLOW_TRIALS_STORAGE",
            "RAY_ADDRESS",
            "AIRFLOW__API__BASE_URL",
        )
        return {
            **{k: env[k] for k in keep},
            **spec.s3_settings(self.addresses),
            "RAY_AUTH_MODE": "disabled",
        }

    # -- processes ------------------------------------------------------------------------------
    def start(self, *names: str) -> None:
        """Start processes by name (each gets a new log file)."""
        for name in names:
            if self.is_running(name):
                raise ShapeError(f"{name} is running already (pid {self.procs[name].pid}).")
            process = self.processes[name]
            self.starts[name] = self.starts.get(name, 0) + 1
            argv = [setup.command(process.argv[0]), *process.argv[1:]]
            if process.kind == "ray":
                if name not in self.ray_temp_dirs:
                    # Ray's socket paths must stay short: under /tmp, not the home.
                    self.ray_temp_dirs[name] = tempfile.mkdtemp(
                        prefix=f"rs{name[-4:]}-", dir="/tmp"
                    )
                argv.append(f"--temp-dir={self.ray_temp_dirs[name]}")
            path = self.log_path(name)
            path.parent.mkdir(parents=True, exist_ok=True)
            started = datetime.datetime.now(datetime.UTC)
            with open(path, "ab") as log:
                self.procs[name] = subprocess.Popen(
                    argv,
                    env=self.env_for(process),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    cwd=str(self.home),
                    start_new_session=True,
                )
            self.expected.add(name)
            if name in spec.TRIGGERERS:  # they start one at a time, so each job is told apart
                self.triggerer_jobs[name] = self.wait_for(
                    partial(triggerers.new_job, self, started), 300, f"{name}'s job"
                )
        self._write_state()

    def is_running(self, name: str) -> bool:
        """Whether the process runs: started here, or by another command (its saved pid)."""
        proc = self.procs.get(name)
        if proc is not None and _alive(proc):
            return True
        pid = self.saved_pids().get(name)  # another command may have started it again
        return pid is not None and (proc is None or pid != proc.pid) and setup.pid_alive(pid)

    def saved_pids(self) -> dict[str, int]:
        """Each process's pid as ``shape.json`` last recorded it (by any command)."""
        return dict((self._read_state() or {}).get("pids") or {})

    def pid(self, name: str) -> int:
        return self.procs[name].pid

    def group(self, name: str) -> list[Any]:
        """Every live process of ``name``: its process group's, and for a Ray node every process
        naming its temp dir (Ray's workers sit in process groups of their own)."""
        import psutil

        found: dict[int, Any] = {}
        proc = self.procs.get(name)
        if proc is not None:
            with contextlib.suppress(psutil.NoSuchProcess):
                root = psutil.Process(proc.pid)
                for p in [root, *root.children(recursive=True)]:
                    found[p.pid] = p
        marker = self.ray_temp_dirs.get(name)
        if marker:
            for p in psutil.process_iter(["cmdline"]):
                with contextlib.suppress(psutil.Error):
                    if any(marker in part for part in p.info["cmdline"] or ()):
                        found.setdefault(p.pid, p)
        return list(found.values())

    def signal(self, name: str, sig: signal.Signals) -> None:
        """Send ``sig`` to the process's whole process group."""
        proc = self.procs.get(name)
        if proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)

    def kill(self, name: str) -> None:
        """SIGKILL the process and everything it started, as a lost machine."""
        import psutil

        self.expected.discard(name)
        self.signal(name, signal.SIGKILL)
        group = self.group(name)
        for p in group:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()
        psutil.wait_procs(group, timeout=30)
        if name in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.procs[name].wait(timeout=30)
        if self.home.exists():
            self._write_state()

    def stop(self, *names: str, timeout_s: float = 60) -> None:
        """SIGTERM processes, as Ctrl-C does, then SIGKILL what is left after ``timeout_s``."""
        for name in names:
            self.expected.discard(name)
            self.signal(name, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for name in names:
            proc = self.procs.get(name)
            if proc is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=max(1.0, deadline - time.monotonic()))
            self.kill(name)

    def check_alive(self) -> None:
        """Raise, with its log, if a process that should run has exited (unless supervised)."""
        for name in sorted(self.expected) if not self.supervised else ():
            if not self.is_running(name):
                proc = self.procs.get(name)
                how = f"(pid {proc.pid}) exited with {proc.returncode}" if proc else "is not up"
                raise ShapeError(
                    f"The shape's {name} {how}; its log {self.log_path(name)} ends:\n"
                    f"{log_tail(self.log_path(name))}"
                )

    def wait_for(self, predicate: Callable[[], T | None], timeout_s: float, what: str) -> T:
        """Poll ``predicate`` until it is truthy; fail at once when a process died. The deadline
        only bounds a hang."""
        deadline = time.monotonic() + timeout_s
        while True:
            self.check_alive()
            value = predicate()
            if value:
                return value
            if time.monotonic() > deadline:
                raise ShapeError(f"Timed out after {timeout_s:.0f} s waiting for {what}.")
            time.sleep(0.5)

    # -- up and down ----------------------------------------------------------------------------
    def up(self, timeout_s: float = 300) -> None:
        """Start the whole shape and wait until every part answers."""
        for folder in (self.airflow_home, self.logs):
            folder.mkdir(parents=True, exist_ok=True)
        self._write_passwords()
        self._write_state()
        self.create_databases()
        self.start(*BACKING)
        ports = self.addresses.local_ports
        self.wait_for(lambda: port_open(ports["redis"]), timeout_s, "Redis")
        self.wait_for(lambda: port_open(ports["s3"]), timeout_s, "the S3 endpoint")
        self.create_bucket()
        self.migrate()
        self.start_ray(timeout_s)
        self.start_airflow(timeout_s)

    def start_ray(self, timeout_s: float = 300) -> None:
        """The head, then the two worker nodes once the head has started."""
        self.start("ray-head")
        self.wait_for_ray_node("ray-head", timeout_s)
        self.start("ray-worker", "ray-gpu-worker")
        for node in ("ray-worker", "ray-gpu-worker"):
            self.wait_for_ray_node(node, timeout_s)

    def wait_for_ray_node(self, node: str, timeout_s: float = 300) -> None:
        """Wait until the node has started (:meth:`ray_node_started`). A node whose ``ray start``
        gave up because its raylet did not register in time (on a loaded machine) is started
        again, up to ``RAY_START_TRIES`` times in all: any other exit fails at once."""
        for tries in itertools.count(1):
            try:
                self.wait_for(partial(self.ray_node_started, node), timeout_s, f"Ray node {node}")
                return
            except ShapeError:
                retry = [name for name in spec.RAY_NODES if self._timed_out_starting(name)]
                if tries >= RAY_START_TRIES or not retry:
                    raise
                for name in retry:
                    self.kill(name)
                    self.start(name)

    def _timed_out_starting(self, node: str) -> bool:
        proc = self.procs.get(node)
        return (
            node in self.expected
            and proc is not None
            and proc.poll() is not None
            and RAY_STARTUP_TIMED_OUT in log_tail(self.log_path(node), 60)
        )

    def ray_node_started(self, node: str) -> bool:
        """Whether ``ray start`` says the node has started: its raylet registered with the GCS.
        Its port answers earlier, and ``ray start`` gives the raylet only 30 s to register: what
        starts next (Airflow's components) waits for this, or on 2 cores it can starve the raylet
        past that limit."""
        return log_says(self.log_path(node), "Ray runtime started.")

    def start_airflow(self, timeout_s: float = 300) -> None:
        """Airflow's components; the triggerers once the api-server answers (they register
        through it), one after the other."""
        names = [p.name for p in self.processes.values() if p.kind == "airflow"]
        self.start(*(name for name in names if name not in spec.TRIGGERERS))
        self.wait_for(lambda: port_open(self.addresses.api_port), timeout_s, "Airflow's api-server")
        for name in spec.TRIGGERERS:
            self.start(name)
        self.wait_until_serving(timeout_s)

    def wait_until_serving(self, timeout_s: float = 300) -> None:
        """The api-server answers, both triggerers heartbeat and both Celery workers are up."""
        self.wait_for(lambda: port_open(self.addresses.api_port), timeout_s, "Airflow's api-server")
        self.wait_for(
            lambda: triggerers.live(self) >= len(spec.TRIGGERERS), timeout_s, "both triggerers"
        )
        for worker in spec.WORKERS:
            self.wait_for(partial(self.worker_ready, worker), timeout_s, f"Celery worker {worker}")

    def worker_ready(self, worker: str) -> bool:
        """Whether the Celery worker's current log says it is ready for tasks."""
        return log_says(self.log_path(worker), "ready.")

    def down(self, *, drop_databases: bool = False, timeout_s: float = 30) -> None:
        """Stop everything the shape started (also from another process, by the saved pids):
        SIGTERM to every process group, SIGKILL to what is left after ``timeout_s``, and every
        process of a Ray node. ``drop_databases`` also drops its two databases."""
        import psutil

        pids = {**self.saved_pids(), **{name: proc.pid for name, proc in self.procs.items()}}
        self.expected.clear()
        for name in reversed(list(self.processes)):
            if name in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pids[name], signal.SIGTERM)
        leaders = []
        for pid in pids.values():
            with contextlib.suppress(psutil.NoSuchProcess):
                leaders.append(psutil.Process(pid))
        _, alive = psutil.wait_procs(leaders, timeout=timeout_s)
        for proc in alive:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
        for name in spec.RAY_NODES:  # Ray's workers sit in process groups of their own
            self.kill(name)
        for proc in self.procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=30)
        self.procs.clear()
        if drop_databases:
            self.drop_databases()
            for path in self.ray_temp_dirs.values():
                shutil.rmtree(path, ignore_errors=True)
            (self.home / STATE_FILE).unlink(missing_ok=True)
        else:
            self._write_state()

    # -- setup ----------------------------------------------------------------------------------
    def metadata_query(self, sql: str, **params: Any) -> list[tuple[Any, ...]]:
        """Read Airflow's metadata DB (the launcher's own check; tasks never touch it)."""
        return setup.metadata_query(self.addresses.metadata_db_url, sql, **params)

    def create_databases(self) -> None:
        setup.create_databases(self.postgres_url, self.database_names)

    def drop_databases(self) -> None:
        setup.drop_databases(self.postgres_url, self.database_names)

    def create_bucket(self) -> None:
        setup.create_bucket(self.addresses)

    def migrate(self) -> None:
        setup.migrate(
            self.env_for(self.processes["airflow-scheduler"]), self.addresses.trials_db_url
        )

    def status(self) -> dict[str, bool]:
        """Each process's name and whether it runs."""
        return {name: self.is_running(name) for name in self.processes}


def _alive(proc: subprocess.Popen[bytes]) -> bool:
    """Whether a process this shape started runs. Its pid as well as its Popen: a SIGKILLed
    multi-threaded process (Redis) shows as a zombie while its other threads still exit, and
    ``poll()`` answers None until they have."""
    return proc.poll() is None and setup.pid_alive(proc.pid)
