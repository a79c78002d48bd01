"""RayTrainResources: a Ray Train trial's driver bundle (the trial's own group) and the workers
Train V2 reserves itself, counted in the trial's sums (pool slots, admission) and sizing Train's
ScalingConfig from one declaration."""

from __future__ import annotations

import json

import pytest

from airflow_trials import PlacementGroupFactory, RayTrainResources, Resources
from airflow_trials.pools import gpu_pool_slots

EIGHT_GPUS = RayTrainResources(
    driver={"CPU": 1},
    num_workers=8,
    resources_per_worker={"CPU": 2, "GPU": 1},
    placement_strategy="SPREAD",
)


def test_the_sums_count_the_driver_and_every_worker_and_the_group_holds_the_driver_only():
    assert (EIGHT_GPUS.cpu, EIGHT_GPUS.gpu) == (17, 8)
    assert EIGHT_GPUS.placed_bundles() == (Resources(cpu=1),)
    assert EIGHT_GPUS.bundles == [{"CPU": 1.0}]
    assert EIGHT_GPUS.strategy == "PACK"  # of the trial's own one-bundle group
    assert EIGHT_GPUS.placement_strategy == "SPREAD"  # of Train's workers
    assert EIGHT_GPUS.summary_string() == (
        "driver [1 CPU] + Ray Train 8 x [2 CPU, 1 GPU] (SPREAD; 17 CPU, 8 GPU in all)"
    )


def test_pool_slots_count_every_worker_s_gpu():
    assert gpu_pool_slots(EIGHT_GPUS.gpu) == 32
    half = RayTrainResources(num_workers=2, resources_per_worker={"CPU": 1, "GPU": 0.25})
    assert gpu_pool_slots(half.gpu) == 2


def test_it_travels_as_json_and_reads_back_as_itself():
    spec = json.loads(json.dumps(EIGHT_GPUS.to_dict()))
    back = Resources.from_dict(spec)
    assert isinstance(back, RayTrainResources) and back == EIGHT_GPUS
    assert hash(back) == hash(EIGHT_GPUS)
    assert back.num_workers == 8 and back.resources_per_worker == {"CPU": 2.0, "GPU": 1.0}
    # The same amounts as bundles of the trial's own group are another request.
    assert EIGHT_GPUS != PlacementGroupFactory(
        [{"CPU": 1}] + [{"CPU": 2, "GPU": 1}] * 8, strategy="SPREAD"
    )


def test_scaling_settings_are_train_s_for_the_same_workers():
    from ray.train import ScalingConfig

    scaling = ScalingConfig(**EIGHT_GPUS.scaling_settings())
    assert (scaling.num_workers, scaling.use_gpu, scaling.placement_strategy) == (8, True, "SPREAD")
    assert scaling.resources_per_worker == {"CPU": 2.0, "GPU": 1.0}
    cpu_only = RayTrainResources(driver={"CPU": 0.25}, num_workers=2).scaling_settings()
    assert (cpu_only["num_workers"], cpu_only["use_gpu"]) == (2, False)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"num_workers": 0},
            "RayTrainResources num_workers must be a whole number >= 1, got 0; write e.g. "
            "num_workers=2.",
        ),
        (
            {"driver": {}},
            "RayTrainResources driver {} asks for nothing: the trial's actor (Train's driver) "
            "needs a bundle of its own; write e.g. driver={'CPU': 0.25}.",
        ),
        (
            {"resources_per_worker": {"GPU": 1.5}},
            "RayTrainResources resources_per_worker asks for GPU=1.5: a bundle shares one GPU "
            "(below 1) or takes whole GPUs; split it into bundles such as {'GPU': 1} and "
            "{'GPU': 0.5}.",
        ),
        (
            {"placement_strategy": "spread"},
            "RayTrainResources placement_strategy 'spread' is not one of PACK, SPREAD, "
            "STRICT_PACK, STRICT_SPREAD; write e.g. placement_strategy='SPREAD'.",
        ),
        (
            {"resources_per_worker": {"CPU": -1}},
            "RayTrainResources resources_per_worker asks for CPU=-1: amounts must be finite "
            "numbers >= 0; write e.g. {'CPU': 1, 'GPU': 1}.",
        ),
    ],
)
def test_bad_input_is_refused_in_one_line_naming_the_fix(kwargs, message):
    with pytest.raises(ValueError) as raised:
        RayTrainResources(**kwargs)
    assert str(raised.value) == message


def test_an_unknown_key_in_its_json_is_refused():
    spec = EIGHT_GPUS.to_dict()
    spec["ray_train"]["workers"] = 3
    with pytest.raises(ValueError, match=r"got \['workers'\]; drop them"):
        Resources.from_dict(spec)
