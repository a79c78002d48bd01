"""The runnable Python blocks of docs/airflow.md, docs/guide.md and docs/store.md, run as written
(a test only says where the trials DB is). tests/unit/test_doc_examples.py checks that every
block in the docs is run here or elsewhere, or is marked as a fragment of a tested file."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

from tests.airflow.conftest import dags_folder
from tests.conftest import REPO


def doc_blocks(name: str) -> list[str]:
    """The python blocks of ``docs/<name>`` that a test runs."""
    text = Path(REPO, "docs", name).read_text(encoding="utf-8")
    return re.findall(
        r"<!-- runs: tests/airflow/test_doc_examples.py -->\n```python\n(.*?)```", text, re.S
    )


def test_airflow_md_s_experiment_dag_parses_with_the_retries_it_promises(trials_env):
    (block,) = doc_blocks("airflow.md")
    namespace: dict = {}
    exec(compile(block, "docs/airflow.md", "exec"), namespace)  # noqa: S102 - the doc's own code
    dag = namespace["dag"]
    assert dag.dag_id == "mnist_tuning"
    assert sorted(dag.task_dict) == [
        "mnist_tuning.select_best",
        "mnist_tuning.suggest_configs",
        "mnist_tuning.trial",
    ]
    trial = dag.task_dict["mnist_tuning.trial"]
    assert trial.retries == 2 + 3  # the block's comment: max_failures=2 gives 2 + 3 retries
    assert trial.pool == "gpu"


def test_guide_md_s_publishing_task_loads_the_best_checkpoint_from_select_best(trials_env):
    (block,) = doc_blocks("guide.md")
    path = Path(dags_folder(), "guide_publish_best.py")  # a DAG file, as a user saves it
    path.write_text(block)
    spec = importlib.util.spec_from_file_location("guide_publish_best", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    run = module.dag.test()
    assert run.state == "success"
    states = {ti.task_id: ti.state for ti in run.get_task_instances()}
    assert states["publish"] == "success", states
    store = trials_env.store
    (exp_run,) = store.reader.list_experiment_runs("publish_best")
    assert len(store.reader.list_trials(experiment_run_id=exp_run.id)) == 2


def test_store_md_s_example_writes_and_ranks_a_trial(tmp_path):
    (block,) = doc_blocks("store.md")
    url = f"sqlite:///{tmp_path / 'trials.db'}"
    code = block.replace('"postgresql+psycopg://trials:secret@db/trials"', repr(url))
    assert code != block, "store.md's example no longer names the URL this test replaces"
    namespace: dict = {}
    exec(compile(code, "docs/store.md", "exec"), namespace)  # noqa: S102 - the doc's own code
    store = namespace["store"]
    (row,) = store.reader.leaderboard(namespace["run"], "loss", "min", limit=10)
    assert (row.trial_id, row.best_value, row.best_iteration) == ("mnist-0", 0.4, 1)
    assert row.best_checkpoint == "s3://bucket/mnist/mnist-0/checkpoint_1"
    store.dispose()
