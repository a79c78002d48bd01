"""TaskLogEcho: each result's progress line and each output line logged once, a poll's lines of
one kind in one log event."""

from __future__ import annotations

from typing import Any

from airflow_trials.core.update import TrialUpdate
from airflow_trials.execution.triggerer.task_log import MAX_PROGRESS_LINES_PER_POLL, TaskLogEcho


class Recorder:
    def __init__(self) -> None:
        self.events: list[str] = []

    def info(self, message: str, *args: Any) -> None:
        self.events.append(message % args)

    warning = info


def result(i: int) -> dict[str, Any]:
    return {"training_iteration": i, "loss": 1.0 / i}


def snapshot(results: list[dict[str, Any]], total: int, lines: tuple[str, ...] = ()) -> TrialUpdate:
    output = {"stdout": {"lines": list(lines), "path": "/n/stdout.log"}} if lines else {}
    return TrialUpdate("t", results=results, num_results=total, output=output)


def test_a_polls_results_are_one_event_with_a_line_each_and_none_is_logged_twice():
    log = Recorder()
    echo = TaskLogEcho(log, "t-1")
    echo.report(snapshot([result(1), result(2), result(3)], 3, lines=("epoch 1", "epoch 2")))
    assert log.events == [
        "[trial stdout] epoch 1\n[trial stdout] epoch 2",
        "Trial t-1 iteration 1: loss=1\nTrial t-1 iteration 2: loss=0.5\n"
        "Trial t-1 iteration 3: loss=0.3333",
    ]
    # The next poll's window overlaps the last one's: only iteration 4 is new.
    echo.report(snapshot([result(2), result(3), result(4)], 4))
    assert log.events[2:] == ["Trial t-1 iteration 4: loss=0.25"]
    echo.report(snapshot([result(3), result(4)], 4))  # nothing new: nothing logged
    assert len(log.events) == 3


def test_a_poll_with_more_results_than_the_cap_says_so_and_logs_the_newest():
    log = Recorder()
    n = MAX_PROGRESS_LINES_PER_POLL + 5
    TaskLogEcho(log, "t-2").report(snapshot([result(i) for i in range(1, n + 1)], n))
    notice, progress = log.events
    assert notice.startswith(
        f"Trial t-2: {n} new results; the newest {MAX_PROGRESS_LINES_PER_POLL}"
    )
    lines = progress.splitlines()
    assert len(lines) == MAX_PROGRESS_LINES_PER_POLL
    assert lines[0].startswith("Trial t-2 iteration 6:") and lines[-1].startswith(
        f"Trial t-2 iteration {n}:"
    )
