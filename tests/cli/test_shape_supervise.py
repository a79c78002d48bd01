"""The shape restarts what dies (``shape/supervisor.py``): real processes of the shape (its Redis
and its S3 stand-in, which need no PostgreSQL) SIGKILLed and started again with their own
settings, by the supervisor and by ``airflow-trials shape restart``; ``shape env`` names the DAGs
folder ``shape up`` was given. The whole shape is supervised in tests/faults."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from airflow_trials.cli import app
from airflow_trials.shape.local import LocalShape
from airflow_trials.shape.setup import pid_alive, port_open
from airflow_trials.shape.supervisor import Supervisor

runner = CliRunner()


@pytest.fixture
def backing(tmp_path):
    """A shape with only Redis and the S3 stand-in running, its DAGs folder not ``dags``."""
    dags = tmp_path / "my_dags"
    dags.mkdir()
    shape = LocalShape(tmp_path / "shape", dags_folder=dags)
    shape.logs.mkdir(parents=True)
    shape.start("redis", "s3")
    ports = shape.addresses.local_ports
    shape.wait_for(lambda: port_open(ports["redis"]) and port_open(ports["s3"]), 300, "both")
    yield shape
    shape.down()


def _killed(pid: int) -> None:
    """SIGKILL the process group and return once its leader is a zombie or gone (a child of
    this process that nobody waited for stays a zombie)."""
    import psutil

    os.killpg(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while True:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                break
        except psutil.NoSuchProcess:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
        assert time.monotonic() < deadline, f"pid {pid} outlived SIGKILL"
        time.sleep(0.05)
    assert not pid_alive(pid)


def test_the_supervisor_starts_a_killed_process_again_with_its_own_settings(backing):
    shape = backing
    redis_pid, s3_pid = shape.pid("redis"), shape.pid("s3")
    supervisor = Supervisor(shape)
    assert supervisor.check_once() == []  # all run: nothing to do

    _killed(redis_pid)
    assert not shape.is_running("redis")
    restarted = supervisor.check_once()
    assert restarted == ["redis"], (
        restarted,
        shape.saved_pids(),
        sorted(shape.expected),
        {n: (p.pid, p.poll()) for n, p in shape.procs.items()},
    )

    assert shape.pid("redis") != redis_pid and shape.pid("s3") == s3_pid
    port = shape.addresses.local_ports["redis"]
    shape.wait_for(lambda: port_open(port), 300, "Redis on its own port again")
    assert shape.saved_pids() == {"redis": shape.pid("redis"), "s3": s3_pid}
    assert [name for name, _ in supervisor.restarts] == ["redis"]
    # Stopped on purpose, a process is not started again.
    shape.stop("s3")
    assert supervisor.check_once() == [] and not shape.is_running("s3")


def test_shape_restart_from_another_shell_keeps_the_other_pids(backing):
    shape = backing
    home = str(shape.home)
    redis_pid, s3_pid = shape.pid("redis"), shape.pid("s3")

    result = runner.invoke(app, ["shape", "restart", "s3", "--home", home])
    assert result.exit_code == 0, result.output
    assert "Restarted s3" in result.output
    assert not pid_alive(s3_pid)
    saved = LocalShape(shape.home).saved_pids()
    assert saved["redis"] == redis_pid and saved["s3"] != s3_pid and pid_alive(saved["s3"])
    shape.wait_for(lambda: port_open(shape.addresses.local_ports["s3"]), 300, "the S3 stand-in")

    # Dead, then restarted by a supervisor that another command runs.
    _killed(saved["s3"])
    other = LocalShape(shape.home)
    assert Supervisor(other).check_once() == ["s3"]
    assert LocalShape(shape.home).saved_pids()["redis"] == redis_pid

    result = runner.invoke(app, ["shape", "restart", "nope", "--home", home])
    assert result.exit_code == 1
    assert "No process named nope" in result.output and "redis" in result.output

    down = runner.invoke(app, ["shape", "down", "--home", home, "--drain-timeout-s", "0"])
    assert down.exit_code == 0, down.output
    assert not any(pid_alive(pid) for pid in LocalShape(shape.home).saved_pids().values())
    assert not pid_alive(redis_pid)


def test_shape_env_names_the_dags_folder_shape_up_was_given(backing):
    result = runner.invoke(app, ["shape", "env", "--home", str(backing.home)])
    assert result.exit_code == 0, result.output
    folder = Path(backing.dags_folder)
    assert folder.name == "my_dags"
    assert f"export AIRFLOW__CORE__DAGS_FOLDER={folder}" in result.output
