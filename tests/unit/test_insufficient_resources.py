"""InsufficientResourcesError carries what the trial needs and what the cluster has, through a
pickle too (Ray ships it from a sweep's driver), so a caller that knows more can retell it."""

from __future__ import annotations

import pickle

from airflow_trials.core.resources import InsufficientResourcesError, Resources


def test_the_error_keeps_its_resources_through_a_pickle():
    error = InsufficientResourcesError(
        "Trial t-1 needs 1 GPU", needed=Resources(cpu=1, gpu=1), total=Resources(cpu=2)
    )
    copy = pickle.loads(pickle.dumps(error))
    assert str(copy) == "Trial t-1 needs 1 GPU"
    assert copy.needed == Resources(cpu=1, gpu=1) and copy.total == Resources(cpu=2)
    assert copy.needed.shortfall(copy.total) == {"gpu": 1.0}
    assert InsufficientResourcesError("no totals").total is None
