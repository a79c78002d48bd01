"""README.md's engine examples, run as written: the function and class trainables saved as
``my_pkg/train.py`` and ``my_pkg/model.py``, the "Running an experiment" script in a Python process
of its own (its own local Ray), and the "Reading results" block against the run it recorded.

The only thing a test adds is where things go: a temporary trials DB (``AIRFLOW_TRIALS_DB_URL``),
checkpoint storage (``AIRFLOW_TRIALS_STORAGE``) and working directory.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO


def readme_blocks() -> dict[str, str]:
    """The README's python blocks that this test runs, by the first line that tells them apart."""
    readme = Path(REPO, "README.md").read_text(encoding="utf-8")
    blocks = re.findall(
        r"<!-- runs: tests/integration/test_readme_examples.py -->\n```python\n(.*?)```",
        readme,
        re.S,
    )
    named = {}
    for block in blocks:
        if "def train(config)" in block:
            named["function"] = block
        elif "class MyModel(Trainable)" in block:
            named["class"] = block
        elif "TrialRunner(" in block:
            named["runner"] = block
        elif "ResultGrid.from_db" in block:
            named["results"] = block
    assert sorted(named) == ["class", "function", "results", "runner"], sorted(named)
    return named


def test_the_readme_runs_its_trainables_records_the_run_and_reads_it_back(tmp_path):
    blocks = readme_blocks()
    package = tmp_path / "my_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "train.py").write_text(blocks["function"])
    (package / "model.py").write_text(blocks["class"])
    url = f"sqlite:///{tmp_path / 'trials.db'}"
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW_CONN_", "RAY_ADDRESS"))
    }
    env.update(
        # ray.init() joins a Ray cluster it finds running on the machine (another test's stack);
        # "local" starts the script's own, as on a newcomer's laptop.
        RAY_ADDRESS="local",
        AIRFLOW_TRIALS_DB_URL=url,
        AIRFLOW_TRIALS_STORAGE=str(tmp_path / "results"),
        PYTHONPATH=os.pathsep.join([str(tmp_path), REPO]),
    )
    # The class trainable too, in the same script: the runner's trials with
    # Trial("my_pkg.model:MyModel").
    script = blocks["runner"] + (
        "\nrunner = TrialRunner('my-class-experiment', callbacks=[TrialsDbCallback(metric='loss', "
        "mode='min')])\n"
        "runner.add_trial(Trial('my_pkg.model:MyModel', {'lr': 0.1}, "
        "experiment_name='my-class-experiment',\n"
        "                       resources={'cpu': 1}, stopping_criterion={'training_iteration': "
        "5}))\n"
        "(model_trial,) = runner.run()\n"
        "print('class trial', model_trial.status.value, "
        "model_trial.last_result['training_iteration'])\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    lines = done.stdout.strip().splitlines()
    assert "{'lr': 0.1}" in lines, done.stdout  # what the README's comment says it prints
    assert "class trial TERMINATED 5" in lines, done.stdout

    # "Reading results", against that run: the README names the DAG's experiment and metric.
    reading = (
        blocks["results"]
        .replace('"regression_tuning"', '"my-experiment"')
        .replace('"val_loss"', '"loss"')
    )
    namespace: dict = {}
    os.environ["AIRFLOW_TRIALS_DB_URL"] = url
    try:
        exec(compile(reading, "README.md", "exec"), namespace)  # noqa: S102 - the README's own code
    finally:
        os.environ.pop("AIRFLOW_TRIALS_DB_URL")
    best = namespace["best"]
    assert (
        best.config == {"lr": 0.1} and abs(best.metrics["loss"] - 9 * 0.8**40) < 1e-12
    )  # w = 3 (1 - 0.8^20)
    assert namespace["model"]["epoch"] == 20  # the kept checkpoint that scored best: the last
    assert len(namespace["df"]) == 2 and list(namespace["history"]["training_iteration"]) == list(
        range(1, 21)
    )
