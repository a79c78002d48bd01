"""What the trial and sweep watches share: SweepEnd's plain-value event and the RayOutage clock."""

from __future__ import annotations

import asyncio
import logging

import pytest

from airflow_trials.core.end import SweepEnd, SweepStatus
from airflow_trials.execution.triggerer.outage import RayOutage, RayOutageTimeout


def test_a_finished_driver_s_progress_is_a_finished_end_and_its_error_an_error_end():
    progress = {"finished": True, "error": None, "total": 2, "terminated": 2}
    end = SweepEnd.from_snapshot("run1", progress)
    assert end.status is SweepStatus.FINISHED and end.finished and end.progress == progress
    failed = SweepEnd.from_snapshot("run1", {**progress, "error": "ValueError: boom"})
    assert failed.status is SweepStatus.ERROR and not failed.finished
    assert failed.error == "ValueError: boom"


@pytest.mark.parametrize("status", list(SweepStatus))
def test_a_sweep_end_travels_as_plain_values(status):
    progress = {"total": 3} if status is not SweepStatus.LOST else None
    end = SweepEnd("run1", status, progress, "why" if status is not SweepStatus.FINISHED else None)
    payload = end.to_event()
    assert payload == {
        "status": status.value,
        "run_key": "run1",
        "progress": progress,
        "error": end.error,
    }
    assert type(payload["status"]) is str
    assert SweepEnd.from_event(payload) == end


def test_a_lost_sweep_names_its_run_and_experiment():
    end = SweepEnd.lost("mnist", "manual__1", "is gone; the task's next try resumes it.")
    assert end.status is SweepStatus.LOST and end.progress is None
    assert end.error == (
        "The sweep driver of run manual__1 of experiment mnist is gone; the "
        "task's next try resumes it."
    )
    with pytest.raises(ValueError, match="'stopped'"):
        SweepEnd.from_event({"status": "stopped", "run_key": "r", "progress": None, "error": None})


async def test_ray_outage_waits_while_ray_is_silent_and_gives_up_past_its_timeout(caplog):
    caplog.set_level(logging.WARNING)
    outage = RayOutage(
        "Trial t-1",
        timeout_seconds=0.3,
        poll_interval_seconds=0.1,
        log=logging.getLogger("test.outage"),
    )
    await outage.wait(ConnectionError("GCS down"))  # waits 0.5 s: the least wait between tries
    assert "Trial t-1: Ray does not answer (ConnectionError: GCS down)" in caplog.text
    silent = r"Ray did not answer for \d+ s \(TimeoutError: slow\)"
    with pytest.raises(RayOutageTimeout, match=silent):
        await outage.wait(TimeoutError("slow"))
    outage.answered()  # Ray answered: a new outage starts its own clock
    await asyncio.wait_for(outage.wait(TimeoutError("slow")), timeout=5)
