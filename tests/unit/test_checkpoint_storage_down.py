"""An object store that does not answer when a trial saves a checkpoint: the error names the
endpoint and the checkpoint, and the trial ends as lost to infrastructure (its task resumes it
from its last saved checkpoint without spending one of its max_failures), not as a failure.

The store here is an S3 endpoint on a port where nothing listens, with botocore told to try once,
so its retry budget is spent at once; tests/faults/test_production_shape.py freezes a real S3-API
server for 20 s, within the budget, and the saves go on.
"""

from __future__ import annotations

import pytest

from airflow_trials.exceptions import CheckpointStorageError
from airflow_trials.ports import free_port
from airflow_trials.storage.trial_storage import TrialStorage
from airflow_trials.store import TrialStore
from tests.unit.test_checkpoint_release import (
    _start,
    _trial,
    _until,
    assert_resumed_without_a_failure,
)

pytest.importorskip("s3fs", reason="the s3 extra (s3fs) is a dev dependency")


@pytest.fixture
def store(tmp_path):
    trials_db = TrialStore(f"sqlite:///{tmp_path / 'trials.db'}", create=True)
    yield trials_db
    trials_db.dispose()


@pytest.fixture
def unanswered_s3(monkeypatch) -> str:
    """An s3:// storage whose endpoint refuses connections; botocore tries once."""
    import s3fs

    port = free_port()  # nothing listens there
    endpoint = f"http://127.0.0.1:{port}"
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "k")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    s3fs.S3FileSystem.clear_instance_cache()  # none made for another endpoint may be reused
    yield endpoint
    s3fs.S3FileSystem.clear_instance_cache()


def test_a_save_the_store_does_not_take_names_the_endpoint_and_the_checkpoint(
    unanswered_s3, monkeypatch, tmp_path
):
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where the dict is staged
    storage = TrialStorage("s3://airflow-trials/checkpoints")
    with pytest.raises(CheckpointStorageError) as raised:
        storage.persist_checkpoint("unit", "t1", 3, {"i": 3}, {})
    message = str(raised.value)
    assert unanswered_s3 in message
    assert "s3://airflow-trials/checkpoints/unit/t1/checkpoint_000003" in message
    assert "Not a failure of the trial" in message
    # Each retry stages the dict again: the failed save's local copy is gone.
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("airflow_trials_")] == []


def test_a_trial_whose_checkpoint_the_store_does_not_take_ends_as_infrastructure(
    unanswered_s3, store
):
    actor = _start(
        "s3://airflow-trials/checkpoints", store, _trial("t1", keep=1, until=5), {"scale": 1.0}
    )
    ended = _until(actor, lambda s: s.status != "RUNNING")
    assert ended.error is not None
    assert unanswered_s3 in ended.error and "checkpoint_000001" in ended.error
    assert_resumed_without_a_failure(ended, "t1")
