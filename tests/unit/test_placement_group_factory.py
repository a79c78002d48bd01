"""PlacementGroupFactory, a trial of several bundles: Ray Tune's spelling and behaviour, the sum
every reader of a trial's resources sees, plain JSON, and each bad input refused in one line that
names the fix; and the rule of core/placement.py that tells when no node (or no nodes together)
could ever hold the bundles."""

from __future__ import annotations

import json
import pickle
import re

import pytest

import airflow_trials
from airflow_trials import InsufficientResourcesError, PlacementGroupFactory, Resources, Trial
from airflow_trials.core.placement import placement_refusal
from airflow_trials.pools import gpu_pool_slots

FOUR_GPU_WORKERS = [{"CPU": 1}] + [{"CPU": 1, "GPU": 1}] * 4


def test_ray_tune_s_spelling_and_the_sum_of_the_bundles():
    pgf = PlacementGroupFactory(FOUR_GPU_WORKERS, strategy="PACK")
    assert pgf.bundles == [{"CPU": 1.0}] + [{"CPU": 1.0, "GPU": 1.0}] * 4
    assert pgf.strategy == "PACK" and not pgf.head_bundle_is_empty
    assert pgf.required_resources == {"CPU": 5.0, "GPU": 4.0}
    # As a Resources it is the sum: what the cluster's totals, the ledger and the pools count.
    assert isinstance(pgf, Resources) and (pgf.cpu, pgf.gpu) == (5.0, 4.0)
    assert pgf.head == Resources(cpu=1)  # what the trial's actor takes, in bundle 0
    assert PlacementGroupFactory([{"CPU": 1}]).strategy == "PACK"  # Ray Tune's default
    assert "PlacementGroupFactory" in airflow_trials.__all__  # exported, beside Resources


def test_an_empty_head_bundle_leaves_the_actor_nothing_as_in_ray_tune():
    pgf = PlacementGroupFactory([{}, {"CPU": 2}, {"CPU": 2}], strategy="SPREAD")
    assert pgf.head_bundle_is_empty and pgf.head.is_empty()
    assert pgf.bundles == [{"CPU": 2.0}, {"CPU": 2.0}]  # the group's, without the empty head
    assert pgf.cpu == 4.0
    assert Resources.from_dict(pgf.to_dict()) == pgf


def test_bundles_take_ray_s_spelling_or_ours_and_custom_resources():
    pgf = PlacementGroupFactory([{"cpu": 1, "gpu": 0.5, "TPU": 2}, {"CPU": 1, "memory": 2**30}])
    assert pgf.bundles == [{"CPU": 1.0, "GPU": 0.5, "TPU": 2.0}, {"CPU": 1.0, "memory": 2.0**30}]
    assert pgf.custom_resources == {"TPU": 2.0} and pgf.memory == 2**30


def test_it_is_plain_json_and_reads_back_equal_through_a_trial():
    pgf = PlacementGroupFactory([{"CPU": 1, "GPU": 0.5}, {"GPU": 1}], strategy="STRICT_PACK")
    spec = json.loads(json.dumps(pgf.to_dict()))
    assert spec == {
        "cpu": 1.0,
        "gpu": 1.5,
        "memory": 0.0,
        "custom_resources": {},
        "bundles": [{"CPU": 1.0, "GPU": 0.5}, {"GPU": 1.0}],
        "strategy": "STRICT_PACK",
    }
    again = Resources.from_dict(spec)
    assert isinstance(again, PlacementGroupFactory) and again == pgf and hash(again) == hash(pgf)
    assert again.bundles == pgf.bundles and again.strategy == "STRICT_PACK"
    trial = Trial("tests.trainables:counting", resources=pgf)
    state = json.loads(json.dumps(trial.to_json_state()))
    assert Trial.from_json_state(state).resources == pgf
    assert pickle.loads(pickle.dumps(pgf)) == pgf
    assert eval(repr(pgf), {"PlacementGroupFactory": PlacementGroupFactory}) == pgf


def test_equality_is_the_bundles_and_the_strategy():
    two = [{"CPU": 1}, {"CPU": 1}]
    assert PlacementGroupFactory(two) != PlacementGroupFactory(two, strategy="SPREAD")
    assert PlacementGroupFactory(two) != PlacementGroupFactory([{"CPU": 2}])
    assert PlacementGroupFactory(two) != Resources(cpu=2)  # the same sum, another shape
    # One bundle is the same placement group as a plain request, whatever the strategy.
    assert PlacementGroupFactory([{"CPU": 1}], strategy="SPREAD") == Resources(cpu=1)
    assert len({PlacementGroupFactory(two), PlacementGroupFactory(list(two))}) == 1


def test_a_trial_updates_to_bundles_and_back():
    trial = Trial("tests.trainables:counting")
    trial.update_resources(PlacementGroupFactory([{"CPU": 1}, {"CPU": 2}]))
    assert trial.resources.bundles == [{"CPU": 1.0}, {"CPU": 2.0}] and trial.resources.cpu == 3
    trial.update_resources({"bundles": [{"CPU": 1}], "strategy": "SPREAD"})
    assert trial.resources == Resources(cpu=1)
    trial.update_resources({"cpu": 2})
    assert trial.resources.bundles == [{"CPU": 2.0}] and trial.resources.strategy == "PACK"


def test_pool_slots_count_every_gpu_of_every_bundle():
    """A fractional bundle takes its share, as a one-bundle trial does."""
    assert gpu_pool_slots(PlacementGroupFactory(FOUR_GPU_WORKERS).gpu) == 16
    assert gpu_pool_slots(PlacementGroupFactory([{"GPU": 1}, {"GPU": 0.5}]).gpu) == 6
    assert gpu_pool_slots(PlacementGroupFactory([{"CPU": 1}, {"GPU": 0.25}]).gpu) == 1


@pytest.mark.parametrize(
    ("bundles", "strategy", "message"),
    [
        (
            [],
            "PACK",
            "PlacementGroupFactory needs at least one bundle, got an empty list; write e.g. "
            "PlacementGroupFactory([{'CPU': 1}, {'CPU': 1, 'GPU': 1}]) (bundle 0 is the trial's "
            "actor).",
        ),
        (
            {"CPU": 1},
            "PACK",
            "PlacementGroupFactory takes a list of bundles, got the one dict {'CPU': 1}; wrap it "
            "in a list, e.g. PlacementGroupFactory([{'CPU': 1}, {'CPU': 1, 'GPU': 1}]).",
        ),
        (
            [{"CPU": 1}, {"CPU": -1}],
            "PACK",
            "PlacementGroupFactory bundle 1 asks for CPU=-1: amounts must be finite numbers >= 0; "
            "write e.g. {'CPU': 1, 'GPU': 1}.",
        ),
        (
            [{"CPU": 1, "GPU": float("nan")}],
            "PACK",
            "PlacementGroupFactory bundle 0 asks for GPU=nan: amounts must be finite numbers >= 0",
        ),
        (
            [{"CPU": "one"}],
            "PACK",
            "PlacementGroupFactory bundle 0 asks for CPU='one': amounts must be finite numbers",
        ),
        (
            [{"CPU": 1}, {"CPU": 1, "GPU": 1.5}],
            "PACK",
            "PlacementGroupFactory bundle 1 asks for GPU=1.5: a bundle shares one GPU (below 1) "
            "or takes whole GPUs; split it into bundles such as {'GPU': 1} and {'GPU': 0.5}.",
        ),
        (
            [{"CPU": 1}, {}],
            "PACK",
            "PlacementGroupFactory bundle 1 is empty; only bundle 0 (the trial's actor) may be, "
            "so give it resources or drop it.",
        ),
        (
            [{}],
            "PACK",
            "PlacementGroupFactory([{}]) asks for nothing; give bundle 0 resources",
        ),
        (
            [{"CPU": 1}, 2],
            "PACK",
            "PlacementGroupFactory bundle 1 must be a dict of Ray resources such as "
            "{'CPU': 1, 'GPU': 1}, got 2.",
        ),
        (
            [{"CPU": 1}],
            "pack",
            "PlacementGroupFactory strategy 'pack' is not one of PACK, SPREAD, STRICT_PACK, "
            "STRICT_SPREAD; write e.g. strategy='PACK'.",
        ),
    ],
)
def test_each_bad_input_is_refused_in_one_line_naming_the_fix(bundles, strategy, message):
    with pytest.raises(ValueError, match=re.escape(message)) as raised:
        PlacementGroupFactory(bundles, strategy=strategy)
    assert "\n" not in str(raised.value)


def test_a_dict_with_bundles_is_read_and_checked_as_one():
    with pytest.raises(ValueError, match=re.escape("bundle 0 asks for GPU=2.5")):
        Resources.from_dict({"bundles": [{"GPU": 2.5}]})
    with pytest.raises(ValueError, match="give .'cpu': 3. as their sums, but the bundles add up"):
        Resources.from_dict({"bundles": [{"CPU": 1}, {"CPU": 1}], "cpu": 3})
    with pytest.raises(
        ValueError, match=r"take only bundles, strategy and their sums, got \['x'\]"
    ):
        Resources.from_dict({"bundles": [{"CPU": 1}], "x": 1})


def test_a_pgf_is_not_one_ray_bundle():
    with pytest.raises(TypeError, match="read its bundles"):
        PlacementGroupFactory([{"CPU": 1}, {"CPU": 1}]).to_ray_bundle()


def test_a_plain_request_is_one_bundle():
    one = Resources(cpu=1, gpu=0.5)
    assert one.bundles == [{"CPU": 1.0, "GPU": 0.5}] and one.head == one
    assert one.strategy == "PACK" and not one.head_bundle_is_empty
    assert Resources(cpu=0).bundles == []  # nothing asked: no placement group


# -- could the cluster's nodes ever hold them? -----------------------------------------------------

TWO_GPU_NODES = [Resources(cpu=2, gpu=2), Resources(cpu=2, gpu=2)]


@pytest.mark.parametrize(
    ("request_", "refusal"),
    [
        (Resources(cpu=1, gpu=2), None),
        (
            Resources(cpu=1, gpu=4),  # the cluster's totals hold it, no node does
            "no node of the Ray cluster holds it (nodes: 2 x [2 CPU, 2 GPU]); lower it or add a "
            "node that does",
        ),
        (PlacementGroupFactory([{"CPU": 1, "GPU": 2}] * 2, "PACK"), None),
        (PlacementGroupFactory([{"CPU": 1, "GPU": 2}] * 2, "SPREAD"), None),
        (PlacementGroupFactory([{"CPU": 1, "GPU": 2}] * 2, "STRICT_SPREAD"), None),
        (PlacementGroupFactory([{"CPU": 1, "GPU": 1}] * 2, "STRICT_PACK"), None),
        (
            PlacementGroupFactory([{"CPU": 1, "GPU": 2}] * 2, "STRICT_PACK"),
            "STRICT_PACK puts all its bundles on one node and no node of the Ray cluster holds "
            "them (nodes: 2 x [2 CPU, 2 GPU]); use strategy PACK, lower the bundles, or add a node "
            "that holds them",
        ),
        (
            PlacementGroupFactory([{"CPU": 1}] * 3, "STRICT_SPREAD"),
            "STRICT_SPREAD puts each of its 3 bundles on a node of its own and no 3 nodes of the "
            "Ray cluster hold one each (nodes: 2 x [2 CPU]); use strategy SPREAD or PACK, fewer "
            "bundles, or add nodes",
        ),
        (
            PlacementGroupFactory([{"CPU": 1}, {"GPU": 4}], "PACK"),
            "no node of the Ray cluster holds its bundle 1 (4 GPU) (nodes: 2 x [2 CPU, 2 GPU]); "
            "lower or split that bundle, or add a node that holds it",
        ),
        (
            PlacementGroupFactory([{}, {"GPU": 4}], "PACK"),  # one bundle, the actor's is empty
            "no node of the Ray cluster holds it (nodes: 2 x [2 GPU])",
        ),
        (
            # Each fits a node and the sum (4 CPUs) the cluster's, but 1.5 + 1.5 + 1 do not go
            # into two nodes of 2.
            PlacementGroupFactory([{"CPU": 1.5}, {"CPU": 1.5}, {"CPU": 1}], "SPREAD"),
            "its bundles fit on the Ray cluster's nodes one by one but not all together "
            "(nodes: 2 x [2 CPU]); lower the bundles or add a node",
        ),
    ],
)
def test_which_shapes_the_nodes_can_hold(request_, refusal):
    if refusal is None:
        assert placement_refusal(request_, TWO_GPU_NODES) is None
    else:
        assert placement_refusal(request_, TWO_GPU_NODES).startswith(refusal)


def test_strict_spread_needs_a_node_that_holds_each_bundle():
    """Three nodes for three bundles is not enough when only one node holds the GPU bundles."""
    nodes = [Resources(cpu=4, gpu=2), Resources(cpu=4), Resources(cpu=4)]
    gpu_twice = PlacementGroupFactory([{"GPU": 1}, {"GPU": 1}, {"CPU": 1}], "STRICT_SPREAD")
    assert "no 3 nodes of the Ray cluster hold one each" in placement_refusal(gpu_twice, nodes)
    gpu_once = PlacementGroupFactory([{"CPU": 1}, {"GPU": 2}, {"CPU": 1}], "STRICT_SPREAD")
    assert placement_refusal(gpu_once, nodes) is None


def test_a_search_that_runs_out_of_budget_refuses_nothing(monkeypatch):
    """Ray waits for room rather than refuse: a refusal here must be sure."""
    from airflow_trials.core import placement

    tight = PlacementGroupFactory([{"CPU": 1.5}, {"CPU": 1.5}, {"CPU": 1}], "PACK")
    nodes = [Resources(cpu=2), Resources(cpu=2)]
    assert placement_refusal(tight, nodes) is not None
    monkeypatch.setattr(placement, "SEARCH_BUDGET", 1)
    assert placement_refusal(tight, nodes) is None
    monkeypatch.setattr(placement, "SEARCH_BUDGET", 2_000)
    many = PlacementGroupFactory([{"CPU": 1}] * 200, "PACK")
    assert placement_refusal(many, [Resources(cpu=2)] * 100) is None  # exactly full: found
    assert placement_refusal(Resources(cpu=1), []) == (
        "no node of the Ray cluster holds it (it has no node); lower it or add a node that does"
    )


def test_the_nodes_travel_with_the_refusal_through_a_pickle():
    """The sweep's driver raises it inside Ray; suggest_configs retells it from its nodes."""
    error = InsufficientResourcesError(
        "no node", needed=Resources(gpu=4), total=Resources(gpu=4), nodes=TWO_GPU_NODES
    )
    copy = pickle.loads(pickle.dumps(error))
    assert copy.nodes == tuple(TWO_GPU_NODES) and copy.needed == Resources(gpu=4)


def test_engine_md_s_example_runs_as_written():
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "engine.md").read_text()
    (block,) = re.findall(
        r"<!-- runs: tests/unit/test_placement_group_factory.py -->\n```python\n(.*?)```",
        text,
        re.S,
    )
    namespace: dict = {}
    exec(compile(block, "docs/engine.md", "exec"), namespace)  # noqa: S102 - the doc's own code
    assert namespace["trial"].resources == namespace["pgf"]
