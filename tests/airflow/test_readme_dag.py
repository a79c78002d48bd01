"""The DAG in README.md, copied as a user would, reaches its leaderboard."""

from __future__ import annotations

import importlib.util
import os
import re

from tests.airflow.conftest import dags_folder
from tests.conftest import REPO


def readme_dag_source() -> str:
    readme = open(os.path.join(REPO, "README.md"), encoding="utf-8").read()
    blocks = re.findall(r"```python\n(.*?)```", readme, flags=re.S)
    (block,) = [b for b in blocks if "tuning_experiment(" in b]
    return block


def test_the_readme_dag_runs_to_its_leaderboard(trials_env):
    path = os.path.join(dags_folder(), "readme_dag.py")
    with open(path, "w") as f:
        f.write(readme_dag_source())
    spec = importlib.util.spec_from_file_location("readme_dag", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    run = module.dag.test()
    assert run.state == "success"
    store = trials_env.store
    (exp_run,) = store.list_experiment_runs("regression_tuning")
    board = store.leaderboard(exp_run.id, "val_loss", "min")
    assert len(board) == 4 and all(r.status.value == "TERMINATED" for r in board)
    values = [r.best_value for r in board]
    assert values == sorted(values) and values[0] < 0.69
    assert all(r.best_checkpoint and r.latest_checkpoint for r in board)
