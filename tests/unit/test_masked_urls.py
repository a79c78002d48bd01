"""Passwords never printed: ``safe_url`` masks the password of a URL's user info and of its query
string (libpq's ``?password=``), for a trials DB URL and an MLflow tracking URI alike; a sweep's
spec, which travels to Ray pickled and which Ray prints when it cannot pickle it, shows its DB URL
masked."""

from __future__ import annotations

import pytest

from airflow_trials.execution.driver.sweep_driver import SweepSpec
from airflow_trials.store.engine import mask_passwords, safe_url


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql+psycopg://trials:s3cret@db:5432/trials", "trials:***@db:5432/trials"),
        ("postgresql+psycopg://trials@db/trials?password=s3cret", "?password=***"),
        (
            "postgresql+psycopg://trials@db/trials?sslmode=require&sslpassword=s3cret",
            "sslpassword=***",
        ),
        ("https://alice:s3cret@mlflow.example.com", "https://alice:***@mlflow.example.com"),
        ("https://mlflow.example.com/?token=s3cret", "token=***"),
        ("databricks://profile:s3cret@workspace", "databricks://profile:***@workspace"),
    ],
)
def test_the_password_is_masked_wherever_the_url_holds_it(url, shown):
    masked = safe_url(url)
    assert "s3cret" not in masked and shown in masked, masked


@pytest.mark.parametrize(
    "url",
    [
        "sqlite:////tmp/trials.db",
        "postgresql+psycopg://trials@db:5432/trials?sslmode=require",
        "http://127.0.0.1:5000",
        "databricks",
        "file:///tmp/mlruns",
    ],
)
def test_a_url_without_a_password_is_shown_as_given(url):
    assert safe_url(url) == url


def test_a_client_library_s_message_has_every_url_in_it_masked():
    message = (
        "API request to https://alice:s3cret@mlflow:5000/api/2.0/x failed; "
        "retried http://bob:s3cret2@other/api?token=s3cret3&x=1 too"
    )
    masked = mask_passwords(message)
    assert "s3cret" not in masked
    assert "https://alice:***@mlflow:5000/api/2.0/x failed" in masked
    assert "http://bob:***@other/api?token=***&x=1 too" in masked


def test_a_sweep_spec_shows_its_db_url_masked():
    spec = SweepSpec(
        experiment_name="exp",
        run_key="run1",
        experiment_run_id=1,
        trainable="tests.trainables:quadratic",
        trials=[("t-0", {"x": 1})],
        metric="loss",
        mode="min",
        db_url="postgresql+psycopg://trials:s3cret@db/trials?sslpassword=s3cret2",
        storage_path=None,
        namespace="ns",
    )
    shown = repr(spec)
    assert "s3cret" not in shown and "trials:***@db/trials" in shown, shown
    # The driver still gets the URL it opens.
    assert spec.db_url.startswith("postgresql+psycopg://trials:s3cret@")
