"""The main job's LocalExecutor workers import what a task process needs before they fork it
(``mainjob_tasks.TASK_PRELOAD``, Python's forkserver preload): the forkserver skips a module it
cannot import without a word, so a renamed module would silently bring back each task's own
imports."""

from __future__ import annotations

import http.server
import subprocess
import sys
import threading
from pathlib import Path

from airflow_trials import mainjob_tasks
from tests.conftest import REPO


def test_a_task_process_after_the_preload_imports_none_of_ours_to_parse_the_example_dag():
    # Each preloaded module imports (the forkserver would skip one that does not), they end
    # frozen out of the garbage collector's way, and what a forked task process still imports
    # as it parses the main job's DAG file is nothing of airflow_trials, Ray or SQLAlchemy
    # (Airflow's own timetables, say, are small).
    script = f"""
import gc, importlib, runpy, sys
from airflow_trials import mainjob_tasks
for module in mainjob_tasks.TASK_PRELOAD:
    importlib.import_module(module)
assert gc.get_freeze_count() > 100_000, gc.get_freeze_count()
before = set(sys.modules)
runpy.run_path({str(Path(REPO) / "dags" / "example_regression_tuning.py")!r})
print(",".join(sorted(set(sys.modules) - before)))
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=True
    )
    imported = done.stdout.strip().splitlines()[-1].split(",")
    ours = [m for m in imported if m.split(".")[0] in ("airflow_trials", "ray", "sqlalchemy")]
    assert imported and ours == []


class _Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - http.server's name
        self.send_response(200 if self.path == "/execution/health" else 404)
        self.end_headers()

    def log_message(self, *args):
        pass


def test_the_execution_api_answers_once_its_health_check_does():
    server = http.server.HTTPServer(("127.0.0.1", 0), _Health)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_port}/execution/"
        assert mainjob_tasks.execution_api_answers(url, timeout_s=10)
        assert not mainjob_tasks.execution_api_answers(url + "elsewhere/", timeout_s=10)
    finally:
        server.shutdown()
        server.server_close()
    # Nothing listens there any more: not ready, no error.
    assert not mainjob_tasks.execution_api_answers(url, timeout_s=10)
