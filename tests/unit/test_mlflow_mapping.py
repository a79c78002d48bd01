"""What a run becomes in MLflow, without MLflow: keys, params, metric points and their batches,
the export's settings as tuning_experiment checks them, and checkpoints on a URL's storage."""

from __future__ import annotations

import os

import pytest

from airflow_trials.export.checkpoint_staging import checkpoint_bytes, local_checkpoint
from airflow_trials.export.mlflow_mapping import (
    MAX_PARAM_VALUE_LENGTH,
    MlflowExport,
    metric_batches,
    metric_points,
    mlflow_key,
    param_values,
    run_status,
)


@pytest.mark.parametrize(
    ("name", "key"),
    [
        ("lr", "lr"),
        ("model/layers", "model/layers"),
        ("loss@val", "loss_val"),
        ("a//b", "a__b"),
        ("/abs", "_abs"),
        ("..", "_."),
        ("ünï", "ünï"),
    ],
)
def test_a_name_becomes_a_key_mlflow_accepts(name, key):
    assert mlflow_key(name) == key


def test_a_config_becomes_flat_params_as_text():
    config = {"lr": 0.01, "model": {"layers": 4, "act": "relu"}, "sizes": [1, 2], "on": True}
    assert param_values(config) == {
        "lr": "0.01",
        "model/layers": "4",
        "model/act": "relu",
        "sizes": "[1, 2]",
        "on": "True",
    }
    long = param_values({"blob": "x" * (MAX_PARAM_VALUE_LENGTH + 10)})["blob"]
    assert len(long) == MAX_PARAM_VALUE_LENGTH and long.endswith("...")


def test_metric_points_are_the_numbers_after_the_watermark_at_their_step():
    results = [
        {"training_iteration": 1, "timestamp": 10.5, "loss": 0.9, "done": False},
        {"training_iteration": 2, "timestamp": 11.0, "loss": 0.5, "extra": {"acc": 0.7}},
        {"training_iteration": 3, "timestamp": 12.0, "loss": None, "note": "nan was here"},
    ]
    assert metric_points(results, 0) == [
        ("loss", 0.9, 10500, 1),
        ("loss", 0.5, 11000, 2),
        ("extra/acc", 0.7, 11000, 2),
    ]
    assert metric_points(results, 1) == [("loss", 0.5, 11000, 2), ("extra/acc", 0.7, 11000, 2)]
    assert metric_points(results, 3) == []


def test_metric_batches_carry_the_last_step_they_hold_whole():
    points = [("m", 0.0, 0, step) for step in (1, 1, 2, 2, 2, 3)]
    batches = metric_batches(points, size=3)
    assert [([p[3] for p in batch], mark) for batch, mark in batches] == [
        ([1, 1, 2], 1),  # step 2 goes on into the next batch
        ([2, 2, 3], 3),
    ]
    assert metric_batches(points[:2], size=3) == [(points[:2], 1)]
    # A step split from the first point on: no step is whole before the next batch.
    assert metric_batches(points[2:5], size=2)[0][1] is None


@pytest.mark.parametrize(
    ("status", "mlflow_status"),
    [("TERMINATED", "FINISHED"), ("ERROR", "FAILED"), ("RUNNING", None), ("SUCCESS", "FINISHED")],
)
def test_statuses_map_to_mlflow_run_statuses(status, mlflow_status):
    assert run_status(status) == mlflow_status


def test_the_export_settings_take_a_uri_or_themselves_and_refuse_the_rest():
    assert MlflowExport.of(None, "e") is None
    assert MlflowExport.of("http://m:5000", "e") == MlflowExport(tracking_uri="http://m:5000")
    given = MlflowExport(checkpoints="all", max_artifact_bytes=0)
    assert MlflowExport.of(given, "e") is given
    with pytest.raises(ValueError, match=r"Experiment e: mlflow_export=5 is neither a tracking"):
        MlflowExport.of(5, "e")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"Experiment e: mlflow_export: tracking_uri=' ' is not"):
        MlflowExport.of(" ", "e")
    with pytest.raises(ValueError, match=r"checkpoints='best-only' is not one of \['best', 'all'"):
        MlflowExport(checkpoints="best-only")
    with pytest.raises(ValueError, match=r"max_artifact_bytes=-1 is not a size in bytes"):
        MlflowExport(max_artifact_bytes=-1)


def test_a_checkpoint_on_a_url_is_sized_and_copied_local(tmp_path):
    import fsspec

    fs = fsspec.filesystem("memory")
    fs.pipe("/ckpts/t1/checkpoint_000003/model.bin", b"x" * 300)
    fs.pipe("/ckpts/t1/checkpoint_000003/sub/meta.json", b"{}")
    url = "memory://ckpts/t1/checkpoint_000003"
    assert checkpoint_bytes(url) == 302
    with local_checkpoint(url) as local:
        copied = sorted(
            os.path.relpath(os.path.join(folder, name), local)
            for folder, _, names in os.walk(local)
            for name in names
        )
        assert copied == ["model.bin", os.path.join("sub", "meta.json")]
    assert not os.path.exists(local)  # the copy is gone with the block
    with pytest.raises(FileNotFoundError):
        checkpoint_bytes("memory://ckpts/t1/checkpoint_000009")
    with pytest.raises(FileNotFoundError):
        checkpoint_bytes(str(tmp_path / "gone"))
