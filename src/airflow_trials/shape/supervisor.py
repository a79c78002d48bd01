"""The shape restarts what dies, as systemd, Kubernetes or Celery's own supervisor does in a
deployment: ``airflow-trials shape supervise`` (a loop in the foreground) and
``airflow-trials shape restart NAME`` (one process, now).

A dead process comes back with its own settings (the same command, environment, ports and, for a
Ray node, temp dir: ``LocalShape.start``), and ``shape.json`` records its new pid, so ``shape
down`` from any shell stops it. A process the shape stopped on purpose (``LocalShape.stop`` or
``kill``, ``shape down``) is not restarted: only what is expected to run is watched.

Example::

    supervisor = Supervisor(shape)
    supervisor.start()            # a thread; what dies comes back within about a second
    ...
    supervisor.stop()
    supervisor.restarts           # [("airflow-worker", 1795900000.0), ...]
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from typing import Any

from airflow_trials.shape.setup import ShapeError

log = logging.getLogger(__name__)

#: Seconds between two restarts of the same process: one that dies at once on every start
#: (a port taken, a bad setting) is not started in a tight loop.
RESTART_BACKOFF_S = 5.0


class Supervisor:
    """Every ``interval_s``, start again each process of ``shape`` that should run and does not.

    In the process that started the shape, what should run is ``shape.expected``; in another
    (``shape supervise`` from a second shell), the processes ``shape.json`` recorded as started.

    :param shape: the :class:`~airflow_trials.shape.local.LocalShape`.
    :param interval_s: how often to look; default 1 s.
    :param on_restart: called with each name restarted (the CLI prints it).
    """

    def __init__(self, shape: Any, interval_s: float = 1.0, on_restart: Any = None) -> None:
        self.shape = shape
        self.interval_s = interval_s
        self.on_restart = on_restart
        self.restarts: list[tuple[str, float]] = []
        self._last_start: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if not shape.expected:  # another command started the shape: adopt what it recorded
            shape.expected.update(n for n in shape.saved_pids() if n in shape.processes)

    def check_once(self) -> list[str]:
        """Start each expected process that is not running; the names started."""
        started = []
        for name in [n for n in self.shape.processes if n in self.shape.expected]:
            if self.shape.is_running(name):
                continue
            now = time.monotonic()
            if now - self._last_start.get(name, -RESTART_BACKOFF_S) < RESTART_BACKOFF_S:
                continue
            self._last_start[name] = now
            log.warning("The shape's %s is not running: starting it again.", name)
            self.shape.kill(name)  # what it left: a Ray node's raylet and workers
            self.shape.expected.add(name)  # watched on, should the start fail
            self.shape.start(name)
            self.restarts.append((name, time.time()))
            started.append(name)
            if self.on_restart is not None:
                self.on_restart(name)
        return started

    def run(self) -> None:
        """Watch until :meth:`stop` (the CLI: until Ctrl-C)."""
        while not self._stop.wait(self.interval_s):
            try:
                self.check_once()
            except ShapeError as e:  # a start that failed: said, and tried again after backoff
                log.error("%s", e)

    def start(self) -> None:
        """Watch in a thread. Meanwhile the shape's waits no longer fail when a process dies
        (``LocalShape.check_alive``): it is this supervisor's to start again."""
        self.shape.supervised = True
        self._thread = threading.Thread(target=self.run, name="shape-supervisor", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=600)
        self.shape.supervised = False


def restart(shape: Any, *names: str, timeout_s: float = 60) -> None:
    """Stop each named process if it runs (SIGTERM to its process group, SIGKILL after
    ``timeout_s``), and start it again with its own settings. Raises ShapeError naming the
    shape's processes for a name it has not."""
    unknown = [n for n in names if n not in shape.processes]
    if unknown:
        raise ShapeError(
            f"No process named {', '.join(unknown)} in the shape in {shape.home}; its processes: "
            f"{', '.join(shape.processes)}."
        )
    for name in names:
        pid = shape.saved_pids().get(name) if name not in shape.procs else shape.pid(name)
        if pid is not None and shape.is_running(name):
            _stop_group(pid, timeout_s)
        shape.kill(name)  # what it left: a Ray node's raylet and workers
        shape.start(name)


def _stop_group(pid: int, timeout_s: float) -> None:
    import os

    import psutil

    try:
        leader = psutil.Process(pid)
        os.killpg(pid, signal.SIGTERM)
    except (psutil.Error, ProcessLookupError, PermissionError):
        return
    _, alive = psutil.wait_procs([leader], timeout=timeout_s)
    if alive:
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            return
        psutil.wait_procs(alive, timeout=30)
