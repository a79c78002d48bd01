"""The production shape starts a Ray node again when ``ray start`` gave up on it under load
(``LocalShape.wait_for_ray_node``), and fails at once on any other exit.

The node here is a small program in the node's place that says what ``ray start`` says: the
first ``fail`` starts end as a raylet that did not register in time does, the next one says the
node has started and stays up.
"""

from __future__ import annotations

import shutil
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_trials.shape import local
from airflow_trials.shape.local import LocalShape
from airflow_trials.shape.setup import ShapeError
from airflow_trials.shape.spec import Process

NODE = textwrap.dedent(
    """
    import pathlib, sys, time
    count, fail, message = pathlib.Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    starts = int(count.read_text()) + 1 if count.exists() else 1
    count.write_text(str(starts))
    if starts <= fail:
        print("Exception: " + message, flush=True)
        sys.exit(1)
    print("Ray runtime started.", flush=True)
    time.sleep(600)
    """
)


@pytest.fixture
def shape(tmp_path) -> Iterator[LocalShape]:
    the_shape = LocalShape(tmp_path / "shape", dags_folder=tmp_path)
    yield the_shape
    for name in list(the_shape.procs):
        the_shape.kill(name)
    for temp_dir in the_shape.ray_temp_dirs.values():
        shutil.rmtree(temp_dir, ignore_errors=True)


def _node(shape: LocalShape, tmp_path: Path, fail: int, message: str) -> Path:
    count = tmp_path / "starts"
    shape.processes["ray-worker"] = Process(
        "ray-worker",
        (Path(sys.executable).name, "-c", NODE, str(count), str(fail), message),
        kind="ray",
    )
    shape.start("ray-worker")
    return count


def test_a_node_that_timed_out_starting_is_started_again(shape, tmp_path):
    count = _node(shape, tmp_path, local.RAY_START_TRIES - 1, local.RAY_STARTUP_TIMED_OUT)
    shape.wait_for_ray_node("ray-worker", timeout_s=60)
    assert count.read_text() == str(local.RAY_START_TRIES)
    assert shape.is_running("ray-worker") and "ray-worker" in shape.expected


def test_a_node_that_keeps_timing_out_fails_with_its_log(shape, tmp_path):
    count = _node(shape, tmp_path, local.RAY_START_TRIES, local.RAY_STARTUP_TIMED_OUT)
    with pytest.raises(ShapeError, match="ray-worker .* exited with 1") as raised:
        shape.wait_for_ray_node("ray-worker", timeout_s=60)
    assert local.RAY_STARTUP_TIMED_OUT in str(raised.value)
    assert count.read_text() == str(local.RAY_START_TRIES)


def test_a_node_that_exits_for_another_reason_fails_at_once(shape, tmp_path):
    count = _node(shape, tmp_path, 1, "the GCS address is wrong")
    with pytest.raises(ShapeError, match="the GCS address is wrong"):
        shape.wait_for_ray_node("ray-worker", timeout_s=60)
    assert count.read_text() == "1"
