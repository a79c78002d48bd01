"""Ports for the servers that the main job and the local production shape start.

A port that ``bind(("127.0.0.1", 0))`` hands out comes from the kernel's ephemeral range, the
range every outgoing connection also takes its local port from. Between the probe's close and
the server's own bind, any connection on the machine may take that port, and the server then
fails to start ("address already in use"; seen in CI with three busy test processes). So
:func:`free_port` picks a port that is free *below* the ephemeral range and above Ray's worker
ports (10002 to 19999 by default), where no outgoing connection and no Ray worker lands.

Two processes of ours could still pick the same free port before either binds it. So each port
handed out is also reserved for :data:`RESERVED_S` seconds by a file in a directory that every
process on the machine shares (checked and written under a lock, so only one process wins a
port), the way ``portpicker``'s port server keeps its clients apart.
"""

from __future__ import annotations

import fcntl
import os
import random
import socket
import tempfile
import time
from pathlib import Path

#: Where the kernel's ephemeral range is configured (Linux); elsewhere, the IANA default applies.
_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
#: Above Ray's default worker ports (``--max-worker-port`` 19999) and the usual service ports.
LOWEST = 20000
_IANA_EPHEMERAL_START = 49152
_ATTEMPTS = 200
#: How long a handed-out port stays reserved for the process that asked: time to start its server.
RESERVED_S = 900.0
#: Not the module ``random``: a process that seeds it (a test, a searcher) would otherwise hand out
#: the same ports as another process seeded alike.
_RANDOM = random.SystemRandom()


def reservations() -> Path:
    """The machine-wide directory of reserved ports (one empty file per port)."""
    return Path(tempfile.gettempdir()) / f"airflow_trials_ports_{os.getuid()}"


def ephemeral_start() -> int:
    """The first port of the kernel's ephemeral range."""
    try:
        return int(_EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return _IANA_EPHEMERAL_START


def _bindable(port: int, host: str) -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True


def _reserve(port: int) -> bool:
    """Whether this process won ``port``: no process reserved it in the last RESERVED_S. The
    check and the reservation happen under the directory's lock, so two processes never both win."""
    directory = reservations()
    directory.mkdir(exist_ok=True)
    path = directory / str(port)
    with open(directory / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        try:
            if time.time() - path.stat().st_mtime < RESERVED_S:
                return False
        except FileNotFoundError:
            pass
        path.touch()  # a new reservation, or an old one renewed (touch sets the mtime)
    return True


def free_port(host: str = "127.0.0.1") -> int:
    """A port that is free on ``host`` now, that no outgoing connection will take, and that no
    other caller of this function on the machine gets within RESERVED_S: random within [20000,
    the ephemeral range's start). Falls back to the kernel's choice where that window is empty or
    taken (a machine whose ephemeral range starts low)."""
    top = ephemeral_start()
    if top - LOWEST >= 100:
        for _ in range(_ATTEMPTS):
            port = _RANDOM.randrange(LOWEST, top)
            if _bindable(port, host) and _reserve(port):
                return port
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
