from __future__ import annotations

import pytest

from airflow_trials import Resources


def test_numerical_error_never_goes_negative():
    resource = Resources(cpu=0.99, gpu=0.99, custom_resources={"a": 0.99})
    small = Resources(cpu=0.33, gpu=0.33, custom_resources={"a": 0.33})
    for _ in range(3):
        resource = Resources.subtract(resource, small)
    assert resource.is_nonnegative()
    assert resource == Resources(cpu=0, gpu=0)


def test_fractional_sums_are_exact():
    total = Resources(cpu=0)
    for _ in range(10):
        total = total + Resources(cpu=0.1, gpu=0.1)
    assert total == Resources(cpu=1, gpu=1)
    assert total.cpu == 1.0 and total.gpu == 1.0


def test_json_round_trip_with_custom_resources():
    original = Resources(1, 0.5, 2 * 2**30, custom_resources={"a": 1, "b": 2.5})
    assert Resources.from_json(original.to_json()) == original
    assert Resources.from_dict(original.to_dict()) == original


def test_from_dict_accepts_ray_spelling_and_custom_keys():
    assert Resources.from_dict({"CPU": 2, "GPU": 1, "TPU": 4}) == Resources(
        cpu=2, gpu=1, custom_resources={"TPU": 4}
    )


def test_fits_in_and_shortfall():
    cluster = Resources(cpu=4, gpu=1, custom_resources={"a": 2})
    assert Resources(cpu=1, gpu=0.5).fits_in(cluster)
    assert not Resources(cpu=1, gpu=2).fits_in(cluster)
    assert Resources(cpu=1, gpu=2, custom_resources={"b": 1}).shortfall(cluster) == {
        "gpu": 1.0,
        "b": 1.0,
    }


def test_from_ray_drops_bookkeeping_keys():
    ray_view = {
        "CPU": 2.0,
        "GPU": 2.0,
        "memory": 100.0,
        "object_store_memory": 5.0,
        "node:10.0.0.1": 1.0,
        "node:__internal_head__": 1.0,
        "CPU_group_abc": 1.0,
        "a": 3.0,
    }
    assert Resources.from_ray(ray_view) == Resources(
        cpu=2, gpu=2, memory=100, custom_resources={"a": 3}
    )


def test_ray_bundle_leaves_out_zeros():
    assert Resources(cpu=1, gpu=0, custom_resources={"a": 0.5}).to_ray_bundle() == {
        "CPU": 1.0,
        "a": 0.5,
    }


@pytest.mark.parametrize("bad", [{"cpu": "two"}, {"cpu": True}, {"custom_resources": {"CPU": 1}}])
def test_bad_values_are_refused_with_the_name(bad):
    with pytest.raises(ValueError, match="cpu|CPU"):
        Resources.from_dict(bad)


def test_equal_resources_hash_equal():
    assert len({Resources(cpu=0.5), Resources(cpu=0.50000001), Resources(cpu=1)}) == 2


def test_fractional_gpus_above_one_are_refused():
    with pytest.raises(ValueError, match="gpu=1.5 is invalid"):
        Resources(gpu=1.5)
    assert Resources(gpu=0.25).gpu == 0.25 and Resources(gpu=2).gpu == 2


def test_what_is_free_may_be_a_fraction_above_one_gpu():
    """Two GPUs with half of one taken leave 1.5 free: an amount, not a trial's request."""
    free = Resources(cpu=4, gpu=2) - Resources(cpu=0.5, gpu=0.5)
    assert (free.cpu, free.gpu) == (3.5, 1.5)
    assert Resources(cpu=0.5, gpu=0.5).fits_in(free)
    assert (free + Resources(cpu=0.5, gpu=0.5)) == Resources(cpu=4, gpu=2)
