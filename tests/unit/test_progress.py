"""The progress line of a result, and reading a trial's output in bounded pieces by byte offset."""

from __future__ import annotations

import pytest

from airflow_trials.core.progress import format_progress, format_value
from airflow_trials.storage.trial_output import read_new_output, read_tail


def engine_fields(iteration):
    return {
        "training_iteration": iteration,
        "time_this_iter_s": 0.51234,
        "time_total_s": 3.2,
        "timestamp": 1.7e9,
        "trial_id": "t-3",
        "hostname": "node-1",
        "pid": 4242,
        "node_ip": "10.0.0.1",
        "done": False,
        "iterations_since_restore": iteration,
        "time_since_restore": 3.2,
    }


def test_progress_line_shows_the_trainables_metrics_in_report_order_and_the_checkpoint():
    result = {
        "val_loss": 0.41234567,
        "val_accuracy": 0.81,
        **engine_fields(3),
        "checkpoint": "/storage/exp/t-3/checkpoint_000003",
    }
    assert format_progress("t-3", result) == (
        "Trial t-3 iteration 3: val_loss=0.4123 val_accuracy=0.81 (checkpoint checkpoint_000003)"
    )


def test_progress_line_without_metrics_or_checkpoint():
    assert format_progress("t-1", engine_fields(1)) == "Trial t-1 iteration 1: no metrics"
    assert format_progress("t-1", {"loss": 2}) == "Trial t-1 iteration ?: loss=2"


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (0.000012345, "1.234e-05"),
        (123456.789, "1.235e+05"),
        (7, "7"),
        (True, "True"),
        (None, "None"),
        (float("nan"), "nan"),
        (float("-inf"), "-inf"),
        ("relu", "relu"),
        ("x" * 50, "x" * 29 + "..."),
        ({"b": 1, "a": [1, 2]}, '{"a": [1, 2], "b": 1}'),
    ],
)
def test_values_are_compact(value, text):
    assert format_value(value) == text


def test_a_long_line_is_capped_and_counts_what_it_left_out():
    result = {f"metric_{i:02d}": i / 7 for i in range(40)} | engine_fields(12)
    line = format_progress("t-9", result, max_chars=120)
    assert len(line) <= 120
    assert line.startswith("Trial t-9 iteration 12: metric_00=0 metric_01=0.1429")
    shown = line.count("=")
    assert line.endswith(f" ... {40 - shown} more")


def write(path, text):
    with open(path, "ab") as f:
        f.write(text.encode())


def test_new_output_is_read_from_the_offset_in_whole_lines(tmp_path):
    path = str(tmp_path / "stdout.log")
    assert read_new_output(path, 0).lines == []  # no file yet: no output
    write(path, "one\ntwo\nthr")
    first = read_new_output(path, 0)
    assert first.lines == ["one", "two"] and first.offset == len("one\ntwo\n")
    write(path, "ee\n")
    second = read_new_output(path, first.offset)
    assert second.lines == ["three"] and (second.skipped_bytes, second.skipped_lines) == (0, 0)
    assert read_new_output(path, second.offset).lines == []
    write(path, "unfinished")
    assert read_new_output(path, second.offset).lines == []
    assert read_new_output(path, second.offset, final=True).lines == [
        "unfinished"
    ]  # the writer is done


def test_a_poll_reads_at_most_its_bounds_and_says_what_it_skipped(tmp_path):
    path = str(tmp_path / "stdout.log")
    write(path, "".join(f"line {i:04d}\n" for i in range(1000)))  # 10 bytes a line
    chunk = read_new_output(path, 0, max_lines=5, max_bytes=100)
    # The newest 100 bytes are the last 10 lines; of them, the newest 5 are returned.
    assert chunk.lines == [f"line {i:04d}" for i in range(995, 1000)]
    assert chunk.skipped_bytes == 9900 and chunk.skipped_lines == 5
    assert chunk.offset == 10000
    # Landing inside a line skips to the next whole one.
    inside = read_new_output(path, 0, max_lines=50, max_bytes=95)
    assert inside.lines[0] == "line 0991" and inside.skipped_bytes == 9910


def test_a_replaced_file_is_read_from_its_start_and_the_tail_of_a_finished_one(tmp_path):
    path = str(tmp_path / "stderr.log")
    write(path, "a\nb\nc")
    assert read_new_output(path, 1000).lines == ["a", "b"]
    tail = read_tail(path, max_lines=2)
    assert tail.lines == ["b", "c"] and tail.skipped_lines == 1
