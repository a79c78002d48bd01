"""What the trial and sweep watches share: SweepEnd's plain-value event and the RayOutage clock;
and that each watch reaches Ray only through what its trigger hands it (the actor client, the
driver's finder)."""

from __future__ import annotations

import asyncio
import logging

import pytest

from airflow_trials.core.end import SweepEnd, SweepStatus
from airflow_trials.core.scheduler import Decision
from airflow_trials.core.stop_kind import StopKind
from airflow_trials.execution.triggerer.outage import (
    POLL_GRACE_SECONDS,
    RayOutage,
    RayOutageTimeout,
)
from airflow_trials.execution.triggerer.sweep_watch import SweepWatch
from airflow_trials.execution.triggerer.trial_watch import TrialWatch, TrialWatchSpec
from airflow_trials.schedulers.trial_judge import Verdict


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


class RecordingClient:
    """An actor client that records what a watch asks of it."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple]] = []

    def attach(self, *args):
        self.calls.append(("attach", args))

    def decide(self, *args):
        self.calls.append(("decide", args))

    def release_checkpoints(self, *args):
        self.calls.append(("release_checkpoints", args))

    def release(self, *args):
        self.calls.append(("release", args))


def test_a_trial_watch_tells_and_frees_its_actor_through_the_actor_client():
    client, connects = RecordingClient(), []

    def connect(*args):
        connects.append(args)
        return client

    spec = TrialWatchSpec("exp", "t1", "ray_default", "trials_default")
    watch = TrialWatch(spec, connect, store=None, log=logging.getLogger("watch"))
    asyncio.run(watch.release())  # before it attached: it connects for the release
    assert connects == [()] and client.calls == [("release", ("exp", "t1", None, None))]
    watch.client, watch.actor = client, "the actor"
    watch._tell(Verdict(3, Decision.STOP, "below the rung", StopKind.MAX_T))
    assert client.calls[-1] == (
        "decide",
        ("the actor", 3, "STOP", "below the rung", StopKind.MAX_T.value, POLL_GRACE_SECONDS),
    )


def test_a_sweep_watch_finds_its_driver_through_the_trigger_s_callable():
    class Reader:
        def run_trial_states(self, experiment_run_id):
            assert experiment_run_id == 7
            return []

    class Store:
        reader = Reader()

    async def open_store():
        return Store()

    finds = []
    watch = SweepWatch(
        "exp",
        "run1",
        7,
        2,
        find=lambda: finds.append(1),  # no driver lives
        open_store=open_store,
        log=logging.getLogger("sweep"),
        poll_interval_seconds=0.01,
        progress_interval_seconds=1.0,
        ray_outage_timeout_seconds=1.0,
    )
    end = asyncio.run(watch.until_end())
    assert finds == [1]
    assert end.status is SweepStatus.LOST and "2 of 2 trials unfinished" in (end.error or "")
