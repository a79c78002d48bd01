"""A Ray node that disappears mid-trial: the trial goes back to PENDING without counting a
failure."""

from __future__ import annotations

import pytest
import ray

from airflow_trials import (
    InsufficientResourcesError,
    RayTrialExecutor,
    Trial,
    TrialRunner,
    TrialStatus,
)
from tests.conftest import shutdown_ray


@pytest.fixture
def cluster():
    from ray.cluster_utils import Cluster

    shutdown_ray()
    cluster = Cluster(
        initialize_head=True,
        connect=True,
        head_node_args={"num_cpus": 1, "include_dashboard": False},
    )
    yield cluster
    ray.shutdown()
    cluster.shutdown()


def counting_trial(experiment, resources):
    """5 iterations of the counting trainable, with no failure to spend: a node loss must not
    need one."""
    return Trial(
        "tests.trainables:counting",
        {"sleep": 0.2},
        experiment_name=experiment,
        resources=resources,
        max_failures=0,
        stopping_criterion={"training_iteration": 5},
    )


def lose_its_node_at_iteration_2(cluster, runner, trial, node):
    """Run ``trial`` to its second result, remove ``node`` (its actor's) and step the runner until
    it sees the loss: the trial is PENDING, lost with its node, not through its own code, so it
    does not spend one of its max_failures."""
    runner.add_trial(trial)
    while trial.last_result.get("training_iteration", 0) < 2:
        runner.step()
    assert trial.status == TrialStatus.RUNNING
    cluster.remove_node(node)
    for _ in range(60):
        runner.step()
        if trial.status != TrialStatus.RUNNING:
            break
    assert trial.status == TrialStatus.PENDING
    assert trial.num_failures == 0
    assert "lost with its node" in trial.error_msg


@pytest.mark.cluster
def test_removed_node_requeues_its_trial_which_resumes_from_its_checkpoint(cluster, storage):
    worker = cluster.add_node(num_cpus=1, resources={"worker_node": 1})
    cluster.wait_for_nodes()
    executor = RayTrialExecutor(storage, refresh_period_s=0.0, reuse_placement_groups=True)
    runner = TrialRunner("nodes", executor=executor, wait_timeout_s=5.0)
    trial = counting_trial("nodes", {"cpu": 1, "custom_resources": {"worker_node": 1}})
    lose_its_node_at_iteration_2(cluster, runner, trial, worker)

    # No node offers worker_node any more: the runner says so instead of hanging.
    with pytest.raises(InsufficientResourcesError, match="worker_node"):
        runner.step()

    cluster.add_node(num_cpus=1, resources={"worker_node": 1})
    cluster.wait_for_nodes()
    runner.run()
    assert trial.status == TrialStatus.TERMINATED
    iterations = [r["training_iteration"] for _, r in runner.results(trial.trial_id)]
    assert iterations == [1, 2, 3, 4, 5]


@pytest.mark.cluster
def test_a_spread_trial_that_loses_its_actor_s_node_restarts_whole_when_its_bundles_fit_again(
    cluster, storage
):
    """A trial of two bundles spread over two nodes (issue 51): the node of bundle 0, where its
    actor runs, dies mid-training. The trial goes back to PENDING without spending a failure; its
    old placement group (bundle 1 still booked on the head) must not hold the head's CPU, or the
    new group could never be placed there; once a node for bundle 0 joins, the whole trial starts
    again from its last checkpoint, and its stored iterations have no gap and no repeat."""
    from airflow_trials import PlacementGroupFactory
    from tests.conftest import live_placement_groups

    worker = cluster.add_node(num_cpus=1, resources={"worker_node": 1})
    cluster.wait_for_nodes()
    executor = RayTrialExecutor(storage, refresh_period_s=0.0)
    runner = TrialRunner("spread", executor=executor, wait_timeout_s=5.0)
    bundles = PlacementGroupFactory(
        [{"CPU": 1, "worker_node": 1}, {"CPU": 1}], strategy="STRICT_SPREAD"
    )
    trial = counting_trial("spread", bundles)
    lose_its_node_at_iteration_2(cluster, runner, trial, worker)

    cluster.add_node(num_cpus=1, resources={"worker_node": 1})
    cluster.wait_for_nodes()
    runner.run()
    assert trial.status == TrialStatus.TERMINATED, trial.error_msg
    iterations = [r["training_iteration"] for _, r in runner.results(trial.trial_id)]
    assert iterations == [1, 2, 3, 4, 5]
    assert live_placement_groups() == []
