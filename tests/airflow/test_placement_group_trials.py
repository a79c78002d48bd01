"""Trials of several bundles on the Airflow path: a trial task takes pool slots for every GPU of its
bundles (dag.test with real Ray), bad bundles are refused when the DAG file is parsed, and
bundles no node can hold are refused by the run's first task, before any trial starts."""

from __future__ import annotations

import json
import os
import re
from types import SimpleNamespace

import pytest

from airflow_trials import InsufficientResourcesError, PlacementGroupFactory, Resources
from tests.airflow.conftest import load_dag_source
from tests.airflow.test_experiment_dag import task_states
from tests.conftest import live_placement_groups, live_trial_actors


def bundles_dag(dag_id, resources, **kwargs):
    """A DAG file whose experiment asks for ``resources`` (source text) per trial."""
    arguments = "".join(f"        {key}={value!r},\n" for key, value in kwargs.items())
    source = (
        "import datetime\n"
        "from airflow.sdk import DAG\n"
        "from airflow_trials import PlacementGroupFactory, RayTrainResources\n"
        "from airflow_trials.experiment import tuning_experiment\n\n"
        f"with DAG({dag_id!r}, schedule=None, start_date=datetime.datetime(2026, 1, 1), "
        "catchup=False) as dag:\n"
        f"    tuning_experiment(\n"
        f"        experiment_name={dag_id!r},\n"
        "        group_id='tune',\n"
        "        trainable='tests.trainables:in_placement_group',\n"
        "        metric='score',\n"
        "        mode='max',\n"
        "        poll_interval_seconds=0.05,\n"
        f"        resources_per_trial={resources},\n"
        f"{arguments}    )\n"
    )
    return load_dag_source(dag_id, source)


def test_a_trial_of_two_bundles_takes_pool_slots_for_every_gpu(trials_env, tmp_path):
    """0.5 + 1 GPUs: 1.5 GPUs at 4 slots per GPU is 6 slots, held while the task is deferred."""
    from airflow_trials.pools import ensure_gpu_pool

    ensure_gpu_pool(2, name="gpu_bundles")  # 8 slots
    out = tmp_path / "where"
    out.mkdir()
    dag = bundles_dag(
        "two_bundles",
        "PlacementGroupFactory([{'CPU': 0.5, 'GPU': 0.5}, {'GPU': 1}])",
        search_space={"out": str(out), "task_cpus": 0, "task_gpus": 1},
        gpu_pool="gpu_bundles",
    )
    trial_task = dag.get_task("tune.trial")
    assert trial_task.partial_kwargs["pool_slots"] == 6
    assert trial_task.partial_kwargs["resources_per_trial"]["bundles"] == [
        {"CPU": 0.5, "GPU": 0.5},
        {"GPU": 1.0},
    ]
    run = dag.test()
    assert run.state == "success", task_states(run)
    (ti,) = [ti for ti in run.get_task_instances() if ti.task_id == "tune.trial"]
    assert (ti.pool, ti.pool_slots) == ("gpu_bundles", 6)
    (trial,) = trials_env.store.reader.list_trials(experiment_name="two_bundles")
    assert trial.status.value == "TERMINATED"
    assert Resources.from_dict(trial.resources) == PlacementGroupFactory(
        [{"CPU": 0.5, "GPU": 0.5}, {"GPU": 1}]
    )
    # On Ray: the trial's group has both bundles, and the trainable's GPU task ran in bundle 1.
    with open(os.path.join(out, f"{trial.trial_id}.json")) as f:
        where = json.load(f)
    assert len(where["bundle_nodes"]) == 2 and where["task"]["group"] == where["actor"]["group"]
    assert any(name.startswith("GPU_group_1_") for name in where["task"]["booked"])
    assert where["actor"]["resources"] == {"CPU": 0.5, "GPU": 0.5}
    assert live_trial_actors() == [] and live_placement_groups() == []


def test_a_ray_train_trial_takes_pool_slots_for_its_workers_gpus(airflow_home):
    """Train V2 books its workers outside the trial's group; RayTrainResources counts them: a
    driver without a GPU and 2 workers of 1 GPU each take 8 slots at 4 slots per GPU."""
    dag = bundles_dag(
        "train_pool",
        "RayTrainResources(driver={'CPU': 0.25}, num_workers=2, "
        "resources_per_worker={'CPU': 1, 'GPU': 1}, placement_strategy='SPREAD')",
        search_space={},
        gpu_pool="gpu",
    )
    trial_task = dag.get_task("tune.trial")
    assert (trial_task.partial_kwargs["pool"], trial_task.partial_kwargs["pool_slots"]) == (
        "gpu",
        8,
    )
    spec = trial_task.partial_kwargs["resources_per_trial"]
    assert spec["ray_train"]["num_workers"] == 2 and spec["gpu"] == 2
    assert Resources.from_dict(spec).placed_bundles() == (Resources(cpu=0.25),)


def test_a_sweep_runs_trials_of_two_bundles_and_reuses_their_group(trials_env, tmp_path):
    """The sweep's driver (TrialRunner on Ray) reads the bundles from the task's kwargs; 1.5 CPUs
    each on 2 CPUs, the trials run one after the other, the second in the first's cached group."""
    out = tmp_path / "where"
    out.mkdir()
    dag = bundles_dag(
        "sweep_bundles",
        "PlacementGroupFactory([{'CPU': 0.5}, {'CPU': 1}])",
        search_space={"out": str(out), "i": {"grid_search": [1, 2]}},
        sweep=True,
    )
    run = dag.test()
    assert run.state == "success", task_states(run)
    trials = trials_env.store.reader.list_trials(experiment_name="sweep_bundles")
    assert sorted(t.status.value for t in trials) == ["TERMINATED", "TERMINATED"]
    groups = set()
    for trial in trials:
        with open(os.path.join(out, f"{trial.trial_id}.json")) as f:
            where = json.load(f)
        assert len(where["bundle_nodes"]) == 2 and where["actor"]["resources"] == {"CPU": 0.5}
        assert any(name.startswith("CPU_group_1_") for name in where["task"]["booked"])
        groups.add(where["actor"]["group"])
    assert len(groups) == 1
    assert live_trial_actors() == [] and live_placement_groups() == []


@pytest.mark.parametrize(
    ("resources", "message"),
    [
        (
            "PlacementGroupFactory([{'CPU': 1}, {'GPU': 1.5}])",
            "PlacementGroupFactory bundle 1 asks for GPU=1.5: a bundle shares one GPU (below 1) "
            "or takes whole GPUs; split it into bundles such as {'GPU': 1} and {'GPU': 0.5}.",
        ),
        (
            "PlacementGroupFactory([])",
            "PlacementGroupFactory needs at least one bundle, got an empty list",
        ),
        (
            "{'bundles': [{'CPU': 1}, {'CPU': -2}]}",
            "Experiment refused: resources_per_trial: PlacementGroupFactory bundle 1 asks for "
            "CPU=-2: amounts must be finite numbers >= 0; write e.g. {'CPU': 1, 'GPU': 1}.",
        ),
        (
            "{'bundles': [{'CPU': 1}], 'strategy': 'SPREAD_OUT'}",
            "Experiment refused: resources_per_trial: PlacementGroupFactory strategy 'SPREAD_OUT' "
            "is not one of PACK, SPREAD, STRICT_PACK, STRICT_SPREAD; write e.g. strategy='PACK'.",
        ),
    ],
)
def test_bad_bundles_are_refused_when_the_dag_file_is_parsed(airflow_home, resources, message):
    with pytest.raises(ValueError, match=re.escape(message)) as refused:
        bundles_dag("refused", resources, search_space={})
    assert "\n" not in str(refused.value)


def test_bundles_no_node_holds_are_refused_before_any_trial_starts(trials_env, capfd):
    """STRICT_SPREAD's two bundles need two nodes; the test cluster is one node of 2 CPUs."""
    dag = bundles_dag(
        "one_node",
        "PlacementGroupFactory([{'CPU': 1}, {'CPU': 1}], strategy='STRICT_SPREAD')",
        search_space={"out": "unused"},
    )
    run = dag.test()
    assert run.state == "failed"
    assert task_states(run)[("tune.suggest_configs", -1)] == "failed"
    assert trials_env.store.reader.list_experiment_runs() == []
    log = capfd.readouterr().out
    assert (
        "needs [1 CPU] + [1 CPU] (STRICT_SPREAD; 2 CPU, 0 GPU in all), but STRICT_SPREAD puts "
        "each of its 2 bundles on a node of its own and no 2 nodes of the Ray cluster hold one "
        "each (nodes: 1 x [2 CPU]); use strategy SPREAD or PACK, fewer bundles, or add nodes"
    ) in log


def test_a_run_s_params_asking_for_bundles_no_node_holds_are_refused_naming_the_field():
    """The cluster's refusal of a shape (from its nodes, not its totals) retold for the params:
    the field whose default the nodes hold is named, with that default as the fix."""
    from airflow.sdk.exceptions import AirflowFailException

    from airflow_trials.experiment.cluster_refusal import refuse_params_beyond_cluster

    def from_params(params):
        bundle = {"CPU": 1, "GPU": params["gpus"]}
        return {"resources_per_trial": {"bundles": [bundle] * 2, "strategy": params["strategy"]}}

    defaults = {"gpus": 1, "strategy": "PACK"}
    params = {"gpus": 1, "strategy": "STRICT_PACK"}
    needed = Resources.from_dict(from_params(params)["resources_per_trial"])
    nodes = [Resources(cpu=4, gpu=1), Resources(cpu=4, gpu=1)]
    error = InsufficientResourcesError("refused", needed, nodes[0] + nodes[1], nodes)
    context = {
        "ti": SimpleNamespace(run_id="manual__1"),
        "params": params,
        "dag": SimpleNamespace(params=SimpleNamespace(dump=lambda: defaults)),
    }
    with pytest.raises(AirflowFailException) as refused:
        refuse_params_beyond_cluster("exp", from_params, Resources(), context, needed, error)
    assert str(refused.value) == (
        "Experiment exp, DAG run manual__1: the run's params are refused: strategy is "
        "'STRICT_PACK', so each trial needs [1 CPU, 1 GPU] + [1 CPU, 1 GPU] (STRICT_PACK; 2 CPU, "
        "2 GPU in all), but STRICT_PACK puts all its bundles on one node and no node of the Ray "
        "cluster holds them (nodes: 2 x [4 CPU, 1 GPU]); use strategy PACK, lower the bundles, or "
        "add a node that holds them. No trial was started and nothing was written; trigger the "
        "DAG again with strategy 'PACK' (the form's default)."
    )
    assert refused.value.__cause__ is error


def test_airflow_md_s_two_bundle_dag_takes_slots_for_1_5_gpus(airflow_home):
    from pathlib import Path

    from tests.conftest import REPO

    text = Path(REPO, "docs", "airflow.md").read_text(encoding="utf-8")
    (block,) = re.findall(
        r"<!-- runs: tests/airflow/test_placement_group_trials.py -->\n```python\n(.*?)```",
        text,
        re.S,
    )
    namespace: dict = {}
    exec(compile(block, "docs/airflow.md", "exec"), namespace)  # noqa: S102 - the doc's own code
    trial = namespace["dag"].get_task("learner_and_worker.trial")
    assert (trial.partial_kwargs["pool"], trial.partial_kwargs["pool_slots"]) == ("gpu", 6)
