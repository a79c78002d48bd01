"""Every name the package exports (``airflow_trials.__all__``) resolves, the lazy ones (whose
modules import Ray: the runner, the executor, Ray Train's report callback) included, in a fresh
process, as a user's ``from airflow_trials import X`` does."""

from __future__ import annotations

import subprocess
import sys

import airflow_trials


def test_every_exported_name_resolves_in_a_fresh_process():
    script = (
        "import airflow_trials\n"
        "names = airflow_trials.__all__\n"
        "missing = [n for n in names if getattr(airflow_trials, n, None) is None]\n"
        "print(missing)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]", done.stdout


def test_the_lazy_names_are_exported_and_ray_train_s_callback_is_one_of_them():
    lazy = set(airflow_trials._LAZY)
    assert lazy <= set(airflow_trials.__all__), lazy - set(airflow_trials.__all__)
    assert "TrialReportCallback" in lazy
    from airflow_trials import TrialReportCallback
    from airflow_trials.execution.worker.ray_train import TrialReportCallback as defined

    assert TrialReportCallback is defined
