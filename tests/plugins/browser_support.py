"""What the browser tests share: a real ``airflow api-server`` over a trials DB, and a headless
Chromium driven over the Chrome DevTools Protocol.

``start_api_server(url, directory)`` serves the dashboard from the trials DB at ``url``, and
``launch_chromium(directory)`` yields a :class:`Browser`. Test modules wrap them in fixtures of the
scope they need: a module that seeds one DB for all its tests starts one server.
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest

from airflow_trials.ports import free_port

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None,
    reason="Debian's chromium package is not installed: apt-get install -y chromium (.ci/run "
    "installs it).",
)


def wait_for(
    predicate: Any,
    timeout_s: float,
    what: str,
    proc: subprocess.Popen | None = None,
    log: Path | None = None,
) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            tail = log.read_text()[-3000:] if log else ""
            raise AssertionError(f"{what}: the process exited with {proc.returncode}\n{tail}")
        value = predicate()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"Timed out after {timeout_s:.0f} s waiting for {what}")


def stop_process(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, 15)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait(timeout=10)


@contextlib.contextmanager
def start_api_server(
    url: str, directory: Path, more_users: Sequence[str] = ()
) -> Iterator[tuple[str, str]]:
    """``airflow api-server`` on a free port, reading the trials DB at ``url`` through the
    ``trials_default`` connection; yields (base URL, an admin's token). The session's AIRFLOW_HOME
    must be migrated first (depend on the ``airflow_home`` fixture). The server's log is
    ``directory/api-server.log``. ``more_users``: admins besides ``admin``, each with the password
    ``<name>-pw`` (:func:`token_for`)."""
    tmp_path = directory
    port = free_port()
    passwords = tmp_path / "passwords.json"
    users = ["admin", *more_users]
    passwords.write_text(json.dumps({user: f"{user}-pw" for user in users}))
    env = {
        **os.environ,
        # The trials_default connection wins over AIRFLOW_TRIALS_DB_URL, which points nowhere here.
        "AIRFLOW_CONN_TRIALS_DEFAULT": json.dumps(
            {"conn_type": "trials_db", "extra": {"url": url}}
        ),
        "AIRFLOW_TRIALS_DB_URL": f"sqlite:///{tmp_path / 'not-this.db'}",
        "AIRFLOW__CORE__AUTH_MANAGER": (
            "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager"
        ),
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": ",".join(f"{u}:admin" for u in users),
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords),
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "False",
        "AIRFLOW__API_AUTH__JWT_SECRET": "browser-test-" + "s" * 64,
        "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{port}",
    }
    log = tmp_path / "api-server.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [
                str(Path(sys.executable).with_name("airflow")),
                "api-server",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--workers",
                "1",
                "--apps",
                "core",
            ],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    base = f"http://127.0.0.1:{port}"
    try:

        def healthy() -> bool:
            try:
                return httpx.get(f"{base}/api/v2/monitor/health", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(healthy, 240, "the api-server to answer", proc, log)
        yield base, token_for(base, "admin")
    finally:
        stop_process(proc)


def token_for(base: str, user: str) -> str:
    """A token of one of :func:`start_api_server`'s users."""
    response = httpx.post(
        f"{base}/auth/token", json={"username": user, "password": f"{user}-pw"}, timeout=10
    )
    assert response.status_code == 201, response.text
    return response.json()["access_token"]


class Browser:
    """Headless Chromium over the DevTools Protocol: navigate, evaluate, screenshot.

    :param ws: a websocket connected to one of Chromium's pages.
    """

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.ids = itertools.count(1)
        self.events: list[dict[str, Any]] = []
        for domain in ("Page", "Network", "Runtime"):
            self.call(f"{domain}.enable")

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        call_id = next(self.ids)
        self.ws.send(json.dumps({"id": call_id, "method": method, "params": params}))
        while True:
            message = json.loads(self.ws.recv(timeout=60))
            if message.get("id") == call_id:
                if "error" in message:
                    raise AssertionError(f"{method} failed: {message['error']}")
                return message.get("result", {})
            self.events.append(message)

    def open(self, url: str) -> None:
        self.events.clear()
        self.call("Page.navigate", url=url)
        deadline = time.monotonic() + 60
        while not any(e.get("method") == "Page.loadEventFired" for e in self.events):
            if time.monotonic() > deadline:
                raise AssertionError(f"{url} did not finish loading in 60 s")
            self.events.append(json.loads(self.ws.recv(timeout=60)))

    def eval(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return result["result"].get("value")

    def save(self, directory: Path, name: str) -> Path:
        """The page's DOM as <name>.html and a full-page screenshot as <name>.png."""
        (directory / f"{name}.html").write_text(self.eval("document.documentElement.outerHTML"))
        png = base64.b64decode(
            self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)["data"]
        )
        path = directory / f"{name}.png"
        path.write_bytes(png)
        return path


@contextlib.contextmanager
def launch_chromium(directory: Path) -> Iterator[Browser]:
    """Headless Chromium with its profile under ``directory``; yields a :class:`Browser` on its
    first page."""
    pytest.importorskip(
        "websockets", reason="websockets (an Airflow dependency) drives Chromium's DevTools"
    )
    from websockets.sync.client import connect

    profile = directory / "chromium-profile"
    profile.mkdir()
    proc = subprocess.Popen(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--remote-debugging-port=0",
            f"--user-data-dir={profile}",
            "--window-size=1400,1800",
            "about:blank",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        port_file = profile / "DevToolsActivePort"
        port = wait_for(
            lambda: port_file.exists() and port_file.read_text().split("\n")[0],
            60,
            "Chromium's DevTools port",
            proc,
        )
        pages = wait_for(
            lambda: [
                t
                for t in httpx.get(f"http://127.0.0.1:{port}/json/list", timeout=5).json()
                if t["type"] == "page"
            ],
            30,
            "a Chromium page",
            proc,
        )
        with connect(pages[0]["webSocketDebuggerUrl"], max_size=None) as ws:
            yield Browser(ws)
    finally:
        stop_process(proc)
