"""The DAG in README.md, copied as a user would, reaches its leaderboard."""

from __future__ import annotations

import importlib.util
import os
import re

from tests.airflow.conftest import dags_folder
from tests.conftest import REPO


def readme_dag_blocks() -> list[str]:
    readme = open(os.path.join(REPO, "README.md"), encoding="utf-8").read()
    blocks = re.findall(r"```python\n(.*?)```", readme, flags=re.S)
    return [b for b in blocks if "tuning_experiment(" in b]


def readme_dag_source() -> str:
    """The first DAG, the one a user copies whole (imports included)."""
    return readme_dag_blocks()[0]


def test_the_readme_sweep_dag_is_one_task_for_more_trials_than_a_mapped_task_may_have(
    trials_env,
):
    from airflow_trials.operators.sweep_operator import RunSweepOperator

    first, sweep = readme_dag_blocks()[:2]  # (the two-objective DAG: test_several_metrics.py)
    imports = "\n".join(
        line for line in first.splitlines() if line.startswith(("import ", "from "))
    )
    namespace: dict = {}
    exec(compile(f"{imports}\n{sweep}", "README.md", "exec"), namespace)  # noqa: S102 - the README's own code
    dag = namespace["sweep_dag"]
    assert sorted(dag.task_dict) == [
        "big_sweep.select_best",
        "big_sweep.suggest_configs",
        "big_sweep.sweep",
    ]
    assert isinstance(dag.task_dict["big_sweep.sweep"], RunSweepOperator)


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
    (exp_run,) = store.reader.list_experiment_runs("regression_tuning")
    board = store.reader.leaderboard(exp_run.id, "val_loss", "min")
    assert len(board) == 6 and all(r.status.value == "TERMINATED" for r in board)
    values = [r.best_value for r in board]
    assert values == sorted(values) and values[0] < 0.69
    assert all(r.best_checkpoint and r.latest_checkpoint for r in board)
    # OptunaSearch chose every config (no two alike); ASHA judged every trial at its first rung,
    # and each trial it stopped ended there with the reason recorded.
    trials = store.reader.list_trials(experiment_run_id=exp_run.id)
    assert len({(t.config["lr"], t.config["l2"]) for t in trials}) == 6
    for t in trials:
        iterations = [r["training_iteration"] for r in store.reader.get_results(t.trial_id)]
        assert 2.0 in {r.milestone for r in store.reader.trial_rungs(t.trial_id)}
        if (
            t.stop_reason
            and t.stop_reason.startswith("stopped by ASHA at training_iteration=")
            and "max_t" not in t.stop_reason
        ):
            milestone = int(t.stop_reason.split("=")[1].split(" ")[0])
            assert iterations == list(range(1, milestone + 1)), (t.stop_reason, iterations)
        else:
            assert iterations == list(range(1, 11)), (t.stop_reason, iterations)
