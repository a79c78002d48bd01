"""OpenLineage on the real stack: two experiment DAGs (the mapped path and ``sweep=True``) run with
``dag.test()``, real Ray and a SQLite trials DB, in a fresh Airflow process configured with
OpenLineage's file transport; Airflow's own listener emits the events, which are read back here.

The runs happen in a child process because the provider's plugin decides whether to listen when
it is first imported (``[openlineage] transport`` set or not), once per process; this pytest
process has imported it without a transport. ``dag.test()`` runs each task through the task
runner, which calls the listener as a worker does (checked below by the events' presence).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from airflow_trials.core.search import grid_search
from airflow_trials.operators.lineage import BEST_FACET, TRAINABLE_FACET, TRIALS_RUN_FACET
from airflow_trials.store import TrialStore
from tests.airflow.conftest import dags_folder
from tests.airflow.test_experiment_dag import experiment_dag
from tests.conftest import REPO, remove_leftovers, start_ray

pytest.importorskip("airflow.providers.openlineage")

RUN_DAGS = """
import importlib.util, sys
for path in sys.argv[1:]:
    spec = importlib.util.spec_from_file_location("lineage_dag", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    print("RUN", module.dag.dag_id, module.dag.test().state, flush=True)
"""


@pytest.fixture(scope="module")
def events(airflow_home, tmp_path_factory):
    """The OpenLineage events of one run of each DAG, by (job name, event type); the trials DB."""
    import ray

    tmp = tmp_path_factory.mktemp("lineage")
    with pytest.MonkeyPatch.context() as mp:
        url = f"sqlite:///{tmp / 'trials.db'}"
        mp.setenv("AIRFLOW_TRIALS_DB_URL", url)
        mp.setenv("AIRFLOW_TRIALS_STORAGE", str(tmp / "storage"))
        start_ray(num_cpus=2, num_gpus=2)
        TrialStore(url, create=True).dispose()
        common = {"stop": {"training_iteration": 2}, "deferrable": True}
        experiment_dag("lineage_mapped", search_space={"scale": grid_search([1.0, 3.0])}, **common)
        experiment_dag(
            "lineage_sweep", search_space={"scale": grid_search([1.0, 2.0])}, sweep=True, **common
        )
        log = tmp / "openlineage.jsonl"
        env = {
            **os.environ,
            "AIRFLOW__OPENLINEAGE__TRANSPORT": json.dumps(
                {"type": "file", "log_file_path": str(log), "append": True}
            ),
            "AIRFLOW__OPENLINEAGE__NAMESPACE": "tests",
            # The listener's default forks the task process, which holds a Ray connection.
            "AIRFLOW__OPENLINEAGE__EXECUTE_IN_THREAD": "True",
            "RAY_ADDRESS": ray.get_runtime_context().gcs_address,
            "PYTHONPATH": str(REPO),
        }
        paths = [os.path.join(dags_folder(), f"lineage_{d}.py") for d in ("mapped", "sweep")]
        done = subprocess.run(
            [sys.executable, "-c", RUN_DAGS, *paths],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=280,
        )
        remove_leftovers()
    runs = [line for line in done.stdout.splitlines() if line.startswith("RUN ")]
    assert runs == ["RUN lineage_mapped success", "RUN lineage_sweep success"], (
        done.stdout[-3000:] + done.stderr[-5000:]
    )
    by_job: dict[tuple[str, str], list[dict]] = {}
    for line in log.read_text().splitlines():
        event = json.loads(line)
        by_job.setdefault((event["job"]["name"], event["eventType"]), []).append(event)
    return by_job, url


def _facets(event):
    return event["job"]["facets"], event["run"]["facets"], event["outputs"]


def test_select_best_emits_the_run_the_trainable_and_the_best_checkpoint(events):
    by_job, url = events
    (event,) = by_job[("lineage_mapped.tune.select_best", "COMPLETE")]
    job, run, outputs = _facets(event)
    store = TrialStore(url)
    try:
        (exp_run,) = store.reader.list_experiment_runs("lineage_mapped")
        (top,) = store.reader.leaderboard(exp_run.id, "score", "max", limit=1)
    finally:
        store.dispose()
    trials_run = {k: v for k, v in job[TRIALS_RUN_FACET].items() if not k.startswith("_")}
    assert trials_run == {
        "experiment": "lineage_mapped",
        "runKey": exp_run.run_key,
        "experimentRunId": exp_run.id,
        "trialsDb": url,
    }
    assert job[TRAINABLE_FACET]["trainable"] == "tests.trainables:counting"
    assert job[TRAINABLE_FACET]["searchSpace"] == exp_run.search_space
    assert exp_run.search_space["scale"]  # the grid as recorded, not an empty placeholder
    best = run[BEST_FACET]
    assert (best["trialId"], best["config"]) == (top.trial_id, {"scale": 3.0})
    assert (best["metrics"], best["modes"]) == ({"score": 6.0}, {"score": "max"})
    # The best checkpoint at its real URI: a local path is namespace "file" + the path.
    assert best["checkpoint"] == top.best_checkpoint
    assert [(o["namespace"], o["name"]) for o in outputs] == [("file", top.best_checkpoint)]
    assert os.path.isdir(top.best_checkpoint)


def test_each_trial_task_emits_its_own_trial(events):
    by_job, url = events
    trials = by_job[("lineage_mapped.tune.trial", "COMPLETE")]
    assert len(trials) == 2
    scales = set()
    for event in trials:
        job, run, outputs = _facets(event)
        assert job[TRIALS_RUN_FACET]["experiment"] == "lineage_mapped"
        assert job[TRIALS_RUN_FACET]["trialsDb"] == url
        assert job[TRAINABLE_FACET]["trainable"] == "tests.trainables:counting"
        best = run[BEST_FACET]
        scales.add(best["config"]["scale"])
        # A trial's metrics are its last reported result: 2 iterations of score = i * scale.
        assert best["metrics"]["score"] == 2 * best["config"]["scale"]
        assert best["metrics"]["training_iteration"] == 2
        assert [(o["namespace"], o["name"]) for o in outputs] == [("file", best["checkpoint"])]
    assert scales == {1.0, 3.0}


def test_the_sweep_task_ends_in_its_worker_and_emits_the_runs_best(events):
    by_job, url = events
    # With OpenLineage on, the finished sweep resumes in the worker (its listener runs there)
    # instead of ending in the triggerer: one COMPLETE event, with the facets.
    (sweep,) = by_job[("lineage_sweep.tune.sweep", "COMPLETE")]
    (select,) = by_job[("lineage_sweep.tune.select_best", "COMPLETE")]
    job, run, outputs = _facets(sweep)
    assert job[TRIALS_RUN_FACET]["experiment"] == "lineage_sweep"
    assert job[TRIALS_RUN_FACET]["runKey"] == select["job"]["facets"][TRIALS_RUN_FACET]["runKey"]
    assert run[BEST_FACET]["config"] == {"scale": 2.0}
    assert run[BEST_FACET]["metrics"] == {"score": 4.0}
    assert outputs == select["outputs"] and len(outputs) == 1
