"""The sweep's DB URL, password and all, goes to its driver actor on a real Ray. Ray prints every
field of an argument it cannot pickle, so a spec that does not pickle is refused before Ray sees
it, with an error that names the field and not the password."""

from __future__ import annotations

import threading
import time

import pytest

from airflow_trials.execution.driver.sweep_client import start_or_attach_driver
from airflow_trials.execution.driver.sweep_driver import SweepSpec

PASSWORD = "s3cret-pw"
URL = f"postgresql+psycopg://trials:{PASSWORD}@db.invalid/trials?sslpassword={PASSWORD}"


def _spec(search_alg=None) -> SweepSpec:
    return SweepSpec(
        experiment_name="masked",
        run_key="run1",
        experiment_run_id=1,
        trainable="tests.trainables:quadratic",
        trials=[("masked-0", {"x": 1})],
        metric="loss",
        mode="min",
        db_url=URL,
        storage_path=None,
        namespace="airflow_trials_tests",
        search_alg=search_alg,
    )


@pytest.mark.usefixtures("ray_cluster")
def test_a_spec_ray_cannot_pickle_is_refused_without_printing_the_password():
    with pytest.raises(TypeError, match="search_alg cannot be pickled") as refused:
        start_or_attach_driver(_spec(search_alg=threading.Lock()))
    for error in (refused.value, refused.value.__cause__):
        assert PASSWORD not in str(error), str(error)


@pytest.mark.usefixtures("ray_cluster")
@pytest.mark.parametrize("started", [True, False])
def test_a_driver_that_never_answers_its_claim_is_named_and_only_removed_if_this_try_started_it(
    started,
):
    """A driver Ray cannot place (it asks for a resource no node has) never answers: the claim
    fails naming it, Ray's state of it and the fix; the try that started it removes it, a try
    that re-attached leaves it to the try that owns it."""
    import ray

    from airflow_trials.execution.driver.sweep_client import claim_driver, find_driver
    from airflow_trials.execution.driver.sweep_driver import SweepDriver

    spec = _spec()
    driver = (
        ray.remote(SweepDriver)
        .options(
            resources={"no_node_has_this": 1},
            name=spec.name,
            namespace=spec.namespace,
            lifetime="detached",
        )
        .remote(spec)
    )
    try:
        with pytest.raises(RuntimeError) as failed:
            claim_driver(driver, spec, try_number=2, started=started, timeout_s=1)
        message = str(failed.value)
        assert "sweep.masked.run1" in message and "try 2" in message
        assert "PENDING_CREATION" in message or "DEPENDENCIES_UNREADY" in message, message
        assert PASSWORD not in message
        assert ("It was removed" in message) is started
        if started:  # ray.kill reaches the GCS asynchronously
            deadline = time.monotonic() + 60
            while find_driver(spec.experiment_name, spec.run_key, spec.namespace) is not None:
                assert time.monotonic() < deadline, "the driver this try started was not removed"
                time.sleep(0.1)
        else:
            assert find_driver(spec.experiment_name, spec.run_key, spec.namespace) is not None
    finally:
        ray.kill(driver, no_restart=True)
