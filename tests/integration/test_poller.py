"""The shared trial poller on a real local Ray and a real SQLite store, without Airflow."""

from __future__ import annotations

import asyncio
import gc
import threading

import pytest

from airflow_trials import InvalidTransitionError, Trial
from airflow_trials.core.fate import Transition
from airflow_trials.execution.driver.actor_client import TrialActorClient
from airflow_trials.execution.triggerer import poller as poller_module
from airflow_trials.execution.triggerer.poller import (
    BatchedTrialPolls,
    TrialPoller,
    poller_of,
    watch_trial,
)
from airflow_trials.store import TrialStore

COUNTING = "tests.trainables:counting"


@pytest.fixture
def store_url(tmp_path):
    url = f"sqlite:///{tmp_path / 'trials.db'}"
    TrialStore(url, create=True).dispose()
    return url


def launch(storage, store_url, trial_id, stop=1000):
    TrialStore(store_url).upsert_trial(
        trial_id, trainable=COUNTING, config={"sleep": 0.05}, resources={"cpu": 0.1}, max_failures=0
    )
    trial = Trial(
        COUNTING,
        {"sleep": 0.05},
        trial_id=trial_id,
        experiment_name="poller",
        resources={"cpu": 0.1},
        stopping_criterion={"training_iteration": stop},
    )
    return TrialActorClient(storage).launch(trial)


class ThreadRecordingActor:
    """An actor handle whose ``poll.remote`` notes the thread that calls it, and its arguments."""

    def __init__(self, actor):
        self.actor, self._actor_id, self.poll, self.threads = actor, actor._actor_id, self, []
        self.calls = []

    def remote(self, *args):
        self.threads.append(threading.current_thread().name)
        self.calls.append(args)
        return self.actor.poll.remote(*args)


async def test_one_trial_refused_by_the_store_fails_only_its_own_poll(
    ray_cluster, storage, store_url
):
    store = TrialStore(store_url)
    good = watch_trial("good", launch(storage, store_url, "good"), store_url, 0.5)
    ended = watch_trial("ended", launch(storage, store_url, "ended"), store_url, 0.5)
    store.record_transition("ended", Transition.STOPPED)  # e.g. a user stopped it meanwhile
    polls = {"good": good.poll(), "ended": ended.poll()}
    await asyncio.gather(*(p.answered for p in polls.values()))
    with pytest.raises(InvalidTransitionError, match="ended"):
        await polls["ended"].recorded
    await polls["good"].recorded
    assert store.reader.get_trial("good").status.value == "RUNNING"
    good.close()
    ended.close()
    store.dispose()


async def test_polls_run_on_the_pollers_thread_and_an_idle_poller_retires(
    ray_cluster, storage, store_url, monkeypatch
):
    monkeypatch.setattr(poller_module, "IDLE_EXIT_SECONDS", 0.0)
    actor = launch(storage, store_url, "t1")
    recording = ThreadRecordingActor(actor)
    watch = watch_trial("t1", recording, store_url, 0.2)
    loop = asyncio.get_running_loop()
    poller = poller_of(loop)
    for _ in range(3):
        poll = watch.poll()
        snapshot = await poll.answered
        await poll.recorded
    assert snapshot.status == "RUNNING" and watch.tracker.seen >= 1
    assert recording.threads and set(recording.threads) == {
        "airflow-trials-poller"
    }  # never the event loop's thread
    assert TrialStore(store_url).reader.get_trial("t1").status.value == "RUNNING"
    watch.close()
    while poller_of(loop) is poller:  # nothing left to watch: its thread stops
        await asyncio.sleep(0.05)
    assert poller_of(loop) is None
    # The next watch starts a new poller.
    again = watch_trial("t1", actor, store_url, 0.2)
    assert poller_of(loop) not in (None, poller)
    again.close()


class HeldStore:
    """A trials store whose batch writes wait until the test lets them go."""

    def __init__(self, url):
        self.store = TrialStore(url)
        self.writing, self.go_on = threading.Event(), threading.Event()

    def record_progress(self, batch, *, judges=None):
        self.writing.set()
        self.go_on.wait(30)
        return self.store.record_progress(batch, judges=judges)

    def dispose(self):
        self.store.dispose()


async def test_answers_reach_their_triggers_before_a_slow_write_ends(
    ray_cluster, storage, store_url
):
    # The answers of a tick are handed to the event loop before the tick's write: a write that
    # retries for long must not look to the trigger like a poll Ray left unanswered.
    loop = asyncio.get_running_loop()
    held = HeldStore(store_url)
    poller = TrialPoller(loop, store_factory=lambda url: held)
    poller.start()
    watches = [
        BatchedTrialPolls(poller, trial_id, launch(storage, store_url, trial_id), store_url, 0.2)
        for trial_id in ("h1",)  # one: two trials may answer in two ticks, the second held
    ]
    for watch in watches:
        poller.command(poller._add, watch)
    polls = [watch.poll() for watch in watches]
    await asyncio.wait_for(asyncio.gather(*(p.answered for p in polls)), 60)
    assert await asyncio.to_thread(held.writing.wait, 30)
    assert not any(p.recorded.done() for p in polls)  # the write is held
    held.go_on.set()
    await asyncio.wait_for(asyncio.gather(*(p.recorded for p in polls)), 30)
    assert TrialStore(store_url).reader.get_trial("h1").status.value == "RUNNING"
    for watch in watches:
        watch.close()


async def test_the_first_poller_of_a_process_freezes_its_start_up_objects(store_url, monkeypatch):
    # Full garbage collections then skip them: each held the event loop ~250 ms at 200 trials.
    monkeypatch.setattr(poller_module, "_FROZEN", False)
    gc.unfreeze()
    assert gc.get_freeze_count() == 0
    watch = watch_trial("frozen", object(), store_url, 0.2)
    try:
        assert gc.get_freeze_count() > 0
    finally:
        watch.close()
        gc.unfreeze()


async def test_a_poller_stretches_its_trials_poll_intervals_to_its_poll_budget():
    # Not started: only its pacing. 10 polls a second in all.
    poller = TrialPoller(asyncio.get_running_loop(), max_polls_per_second=10.0)
    few = [BatchedTrialPolls(poller, f"f{i}", object(), "sqlite://", 2.0) for i in range(20)]
    assert few[0].poll().wait_seconds == 2.0  # 20 trials every 2 s: 10 polls a second
    many = [BatchedTrialPolls(poller, f"m{i}", object(), "sqlite://", 2.0) for i in range(20)]
    assert few[1].poll().wait_seconds == 4.0  # 40 trials: each every 4 s
    for watch in many:
        watch.close()
    many[0].close()  # closing twice counts once
    assert few[2].poll().wait_seconds == 2.0
    slow = BatchedTrialPolls(poller, "slow", object(), "sqlite://", 9.0)
    assert slow.poll().wait_seconds == 9.0  # a longer interval of its own stays


async def test_the_actor_holds_a_poll_for_the_wait_its_poller_gave_it(
    ray_cluster, storage, store_url
):
    poller = TrialPoller(asyncio.get_running_loop(), max_polls_per_second=2.0)
    poller.start()
    recording = ThreadRecordingActor(launch(storage, store_url, "paced"))
    others = [BatchedTrialPolls(poller, f"o{i}", object(), store_url, 0.2) for i in range(2)]
    watch = BatchedTrialPolls(poller, "paced", recording, store_url, 0.2)
    poller.command(poller._add, watch)
    poll = watch.poll()
    assert poll.wait_seconds == 1.5  # 3 trials at 2 polls a second
    await asyncio.wait_for(poll.answered, 60)
    await asyncio.wait_for(poll.recorded, 60)
    since, wait_s, _, _ = recording.calls[0]
    assert (since, wait_s) == (0, 1.5)
    for each in (*others, watch):
        each.close()
