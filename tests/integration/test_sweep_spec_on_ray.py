"""The sweep's DB URL, password and all, goes to its driver actor on a real Ray. Ray prints every
field of an argument it cannot pickle, so a spec that does not pickle is refused before Ray sees
it, with an error that names the field and not the password."""

from __future__ import annotations

import threading

import pytest

from airflow_trials.execution.driver.sweep_driver import SweepSpec, start_or_attach_driver

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
