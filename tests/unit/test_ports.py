"""Ports for the servers the main job and the shape start: never from the ephemeral range."""

from __future__ import annotations

import os
import random
import socket
import subprocess
import sys

import pytest

from airflow_trials import ports


@pytest.fixture(autouse=True)
def own_reservations(monkeypatch, tmp_path):
    """Each test reserves in a directory of its own, not the machine's."""
    monkeypatch.setattr(ports, "reservations", lambda: tmp_path)


def test_a_port_is_free_and_below_the_ephemeral_range():
    start = ports.ephemeral_start()
    for _ in range(50):
        port = ports.free_port()
        assert ports.LOWEST <= port < start
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))  # free: a server can take it


def test_a_bound_port_is_never_handed_out(monkeypatch):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        taken = held.getsockname()[1]
        monkeypatch.setattr(ports, "LOWEST", taken)
        monkeypatch.setattr(ports, "ephemeral_start", lambda: taken + 100)
        handed = {ports.free_port() for _ in range(60)}
    assert taken not in handed
    assert all(taken < port < taken + 100 for port in handed)


def test_a_seeded_random_module_does_not_repeat_ports(monkeypatch):
    # Two processes that seed ``random`` alike must not get the same ports (reservations aside).
    monkeypatch.setattr(ports, "_reserve", lambda port: True)
    draws = []
    for _ in range(5):
        random.seed(0)
        draws.append(ports.free_port())
    assert len(set(draws)) > 1


def test_no_window_below_the_ephemeral_range_falls_back_to_the_kernel(monkeypatch):
    monkeypatch.setattr(ports, "ephemeral_start", lambda: ports.LOWEST + 10)
    port = ports.free_port()
    assert port > 0
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


def test_the_ephemeral_range_is_read_from_the_kernel(tmp_path, monkeypatch):
    table = tmp_path / "ip_local_port_range"
    table.write_text("40000\t60999\n")
    monkeypatch.setattr(ports, "_EPHEMERAL_RANGE", table)
    assert ports.ephemeral_start() == 40000
    monkeypatch.setattr(ports, "_EPHEMERAL_RANGE", tmp_path / "missing")
    assert ports.ephemeral_start() == 49152


def test_a_port_reserved_by_another_process_is_not_handed_out(monkeypatch, tmp_path):
    monkeypatch.setattr(ports, "LOWEST", 30000)
    monkeypatch.setattr(ports, "ephemeral_start", lambda: 30100)
    code = (
        "import sys; from airflow_trials import ports; "
        f"ports.reservations = lambda: __import__('pathlib').Path({str(tmp_path)!r}); "
        "ports.LOWEST, ports.ephemeral_start = 30000, lambda: 30100; "
        "print(' '.join(str(ports.free_port()) for _ in range(50)))"
    )
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    theirs = {int(port) for port in other.stdout.split()}
    ours = {ports.free_port() for _ in range(40)}
    assert len(theirs) == 50 and len(ours) == 40  # no port twice, in either process
    assert not theirs & ours


def test_an_old_reservation_lapses(monkeypatch, tmp_path):
    monkeypatch.setattr(ports, "LOWEST", 30000)
    monkeypatch.setattr(ports, "ephemeral_start", lambda: 30100)
    for port in range(30000, 30100):
        (tmp_path / str(port)).touch()
        os.utime(tmp_path / str(port), (0, 0))  # reserved in 1970
    assert 30000 <= ports.free_port() < 30100
