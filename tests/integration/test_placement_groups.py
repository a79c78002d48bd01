"""Trials of several bundles (PlacementGroupFactory) on a real two-node Ray cluster: the actor in
bundle 0 and the trainable's own Ray task in the trial's placement group, SPREAD over two nodes,
and the runner starting a trial only once its bundles fit, refusing bundles no node can hold."""

from __future__ import annotations

import json
import os
import time

import pytest
import ray

from airflow_trials import (
    InsufficientResourcesError,
    PlacementGroupFactory,
    RayTrialExecutor,
    Trial,
    TrialRunner,
    TrialStatus,
)
from tests.conftest import live_placement_groups, live_trial_actors, shutdown_ray

WHERE = "tests.trainables:in_placement_group"


@pytest.fixture(scope="module")
def cluster():
    """Two nodes of 2 CPUs and 1 logical GPU each (no hardware needed; with GPUs on one node only,
    Ray keeps CPU-only bundles off it, and SPREAD would find one node)."""
    from ray.cluster_utils import Cluster

    shutdown_ray()
    cluster = Cluster(
        initialize_head=True,
        connect=True,
        head_node_args={"num_cpus": 2, "num_gpus": 1, "include_dashboard": False},
    )
    cluster.add_node(num_cpus=2, num_gpus=1)
    cluster.wait_for_nodes()
    yield cluster
    ray.shutdown()
    cluster.shutdown()


@pytest.fixture
def out(tmp_path):
    path = tmp_path / "where"
    path.mkdir()
    return str(path)


def wait_until_all_is_free(timeout_s=30.0):
    """Ray's view of what is free lags a removed group by a moment: a SPREAD group asked for then
    sees the node it left full, and goes to the other."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        total, free = ray.cluster_resources(), ray.available_resources()
        if all(free.get(k, 0) == total[k] for k in ("CPU", "GPU")):
            return
        time.sleep(0.1)
    raise AssertionError(f"the cluster has {free} free of {total}")


def run_trials(storage, *trials):
    wait_until_all_is_free()
    runner = TrialRunner(
        "bundles", executor=RayTrialExecutor(storage, refresh_period_s=0.0), wait_timeout_s=30.0
    )
    for trial in trials:
        runner.add_trial(trial)
    runner.run()
    assert [t.status for t in trials] == [TrialStatus.TERMINATED] * len(trials), [
        t.error_msg for t in trials
    ]
    assert live_trial_actors() == [] and live_placement_groups() == []
    return runner


def seen(out, trial):
    with open(os.path.join(out, f"{trial.trial_id}.json")) as f:
        return json.load(f)


def bundle_of(where, group):
    """The bundle of ``group`` that Ray booked the actor's or the task's CPUs and GPUs on (as
    ``CPU_group_<index>_<group>``, beside the group-wide ``CPU_group_<group>``)."""
    indexes = {
        int(name.split("_")[2])
        for name in where["booked"]
        if name.startswith(("CPU_group_", "GPU_group_")) and name.count("_") == 3
    }
    assert len(indexes) == 1, where["booked"]
    return indexes.pop()


@pytest.mark.cluster
def test_the_actor_runs_in_bundle_0_and_its_ray_task_in_the_trial_s_group(cluster, storage, out):
    pgf = PlacementGroupFactory([{"CPU": 1}, {"CPU": 1, "GPU": 1}], strategy="PACK")
    trial = Trial(
        WHERE,
        {"out": out, "task_gpus": 1},
        experiment_name="bundles",
        resources=pgf,
        stopping_criterion={"training_iteration": 2},
    )
    run_trials(storage, trial)
    where = seen(out, trial)
    group = where["actor"]["group"]
    # get_current_placement_group() in the trainable is the trial's group, and so in its task.
    assert group is not None and where["task"]["group"] == group
    assert bundle_of(where["actor"], group) == 0
    assert where["actor"]["resources"]["CPU"] == 1.0 and "GPU" not in where["actor"]["resources"]
    # The task needs the GPU: only bundle 1 has one, so it ran there, on bundle 1's node.
    assert bundle_of(where["task"], group) == 1
    assert where["task"]["resources"]["GPU"] == 1.0
    assert where["actor"]["node"] == where["bundle_nodes"][0]
    assert where["task"]["node"] == where["bundle_nodes"][1]


@pytest.mark.cluster
def test_an_empty_first_bundle_leaves_the_group_to_the_trainable_s_workers(cluster, storage, out):
    """As in Ray Tune: the actor takes nothing, in the group, and the group is the workers'."""
    pgf = PlacementGroupFactory([{}, {"CPU": 2}])
    trial = Trial(WHERE, {"out": out, "task_cpus": 2}, experiment_name="bundles", resources=pgf)
    run_trials(storage, trial)
    where = seen(out, trial)
    assert where["actor"]["group"] == where["task"]["group"] is not None
    assert where["actor"]["resources"] == {} and len(where["bundle_nodes"]) == 1
    assert bundle_of(where["task"], where["task"]["group"]) == 0


@pytest.mark.cluster
@pytest.mark.parametrize("strategy", ["SPREAD", "STRICT_SPREAD"])
def test_spread_puts_the_bundles_on_two_nodes(cluster, storage, out, strategy):
    pgf = PlacementGroupFactory([{"CPU": 1}, {"CPU": 1}], strategy=strategy)
    trial = Trial(WHERE, {"out": out}, experiment_name="bundles", resources=pgf)
    run_trials(storage, trial)
    where = seen(out, trial)
    assert where["task"]["group"] == where["actor"]["group"]
    assert bundle_of(where["task"], where["task"]["group"]) == 1
    nodes = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
    assert set(where["bundle_nodes"]) == nodes and len(where["bundle_nodes"]) == 2
    assert [where["actor"]["node"], where["task"]["node"]] == where["bundle_nodes"]


@pytest.mark.cluster
def test_the_runner_starts_a_trial_once_all_its_bundles_fit(cluster, storage, out):
    """Each trial asks for 1 CPU and the cluster's 2 GPUs, in bundles of one GPU: the CPUs would
    take both trials at once, the GPUs one at a time, so the second starts once the first ended."""
    pgf = PlacementGroupFactory([{"CPU": 1}, {"GPU": 1}, {"GPU": 1}])
    first, second = (
        Trial(
            WHERE,
            {"out": out, "task_cpus": 0, "task_gpus": 1, "iterations": 3, "sleep": 0.3},
            experiment_name="bundles",
            resources=pgf,
        )
        for _ in range(2)
    )
    run_trials(storage, first, second)
    assert second.start_time >= first.end_time
    # And on Ray: the second's trainable began after the first's actor was gone.
    assert seen(out, second)["started"] >= first.end_time
    assert seen(out, first)["actor"]["group"] != seen(out, second)["actor"]["group"]


@pytest.mark.cluster
def test_bundles_no_node_holds_are_refused_until_a_node_that_holds_them_joins(
    cluster, storage, out
):
    """STRICT_PACK's 4 CPUs are the cluster's total, but no node has 4: Ray would wait for good."""
    pgf = PlacementGroupFactory([{"CPU": 2}, {"CPU": 2}], strategy="STRICT_PACK")
    trial = Trial(WHERE, {"out": out, "task_cpus": 2}, experiment_name="bundles", resources=pgf)
    runner = TrialRunner(
        "bundles", executor=RayTrialExecutor(storage, refresh_period_s=0.0), wait_timeout_s=30.0
    )
    with pytest.raises(InsufficientResourcesError) as refused:
        runner.add_trial(trial)
    assert str(refused.value) == (
        f"Trial {trial.trial_id} of experiment bundles needs [2 CPU] + [2 CPU] (STRICT_PACK; "
        "4 CPU, 0 GPU in all), but STRICT_PACK puts all its bundles on one node and no node of "
        "the Ray cluster holds them (nodes: 2 x [2 CPU]); use strategy PACK, lower the bundles, "
        "or add a node that holds them; or pass queue_trials=True on an autoscaling cluster."
    )
    big = cluster.add_node(num_cpus=4)
    cluster.wait_for_nodes()
    try:
        run_trials(storage, trial)
        where = seen(out, trial)
        assert where["actor"]["node"] == where["task"]["node"] == big.node_id
    finally:
        cluster.remove_node(big)
