"""scripts/test.sh runs the whole suite in pytest-xdist workers, a unit (a module, or the fault
cases on the shared stack) to one worker (tests/conftest.py, tests/work_units.py). A module
spread over workers would start its module-scoped fixtures (a Ray shape, an api-server, a whole
stack) once per worker: that is what ``--dist loadgroup`` did under pytest 9."""

from __future__ import annotations

import re
import subprocess
import sys

from tests.conftest import REPO

MODULES = (
    "tests/unit/test_storage.py",
    "tests/unit/test_task_log.py",
    "tests/cli/test_history_cmd.py",
)


def test_each_module_runs_on_one_worker():
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-n",
            "2",
            "--dist",
            "loadscope",
            "--no-loadscope-reorder",
            "-v",
            *MODULES,
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    workers: dict[str, set[str]] = {}
    for worker, module in re.findall(r"^\[(gw\d+)\].*? PASSED (\S+?)::", run.stdout, re.M):
        workers.setdefault(module, set()).add(worker)
    assert sorted(workers) == sorted(MODULES), run.stdout[-3000:]
    assert all(len(found) == 1 for found in workers.values()), workers
