"""TrialTriggers of one event loop share one poller: batched store writes, and each trigger's
faults (a store error, a killed actor) reach it, and only what is its own."""

from __future__ import annotations

import asyncio

import pytest

from airflow_trials.execution.triggerer import poller as poller_module
from airflow_trials.triggers.trial_trigger import TrialTrigger
from tests.conftest import LoopTicker, live_trial_actors

COUNTING = "tests.trainables:counting"


def launch(trials_env, trial_id, stop=5, sleep=0.05):
    """Start a counting trial in a detached actor taking a tenth of a CPU (many fit in 2 CPUs)."""
    from airflow_trials import Trial
    from airflow_trials.execution.driver.actor_client import TrialActorClient

    config = {"sleep": sleep}
    trials_env.store.upsert_trial(
        trial_id, trainable=COUNTING, config=config, resources={"cpu": 0.1}, max_failures=0
    )
    executor = TrialActorClient(trials_env.storage)
    trial = Trial(
        COUNTING,
        config,
        trial_id=trial_id,
        experiment_name="pol",
        resources={"cpu": 0.1},
        stopping_criterion={"training_iteration": stop},
        keep_checkpoints_num=2,
        checkpoint_score_attr="score",
    )
    return executor.launch(trial)


@pytest.fixture
def watches(monkeypatch):
    """Every BatchedTrialPolls the triggers register with a poller."""
    made = []
    original = poller_module.watch_trial

    def recording(*args, **kwargs):
        made.append(original(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(poller_module, "watch_trial", recording)
    return made


async def test_many_triggers_share_one_poller_and_batch_their_writes(trials_env, watches):
    ids = [f"m{i}" for i in range(8)]
    for trial_id in ids:
        launch(trials_env, trial_id, stop=6)
    async with LoopTicker() as ticker:
        events = await asyncio.gather(
            *(
                TrialTrigger("pol", trial_id, poll_interval_seconds=0.1).run().asend(None)
                for trial_id in ids
            )
        )
    assert ticker.ticks > 0
    assert [e.payload["status"] for e in events] == ["TERMINATED"] * 8
    for trial_id in ids:
        assert [r["training_iteration"] for r in trials_env.store.reader.get_results(trial_id)] == [
            1,
            2,
            3,
            4,
            5,
            6,
        ]
        assert trials_env.store.reader.latest_checkpoint(trial_id).iteration == 6
        assert trials_env.store.reader.get_trial(trial_id).started_at is not None
    poller = poller_module.poller_of(asyncio.get_running_loop())
    assert {watch._poller for watch in watches} == {poller} and len(watches) == 8
    assert poller.stats.rows == 8 * 6  # every result written once
    # At most one transaction per tick, only for ticks with answers: never more than polls. (How
    # many answers share a tick depends on the machine's load; bench/triggerer_load.py measures it.)
    assert 0 < poller.stats.transactions <= poller.stats.polls_sent
    assert live_trial_actors() == []


async def test_a_store_error_reaches_every_trigger_of_the_batch(trials_env):
    from airflow_trials.store.models import ResultRow

    ids = ["s0", "s1", "s2"]
    for trial_id in ids:
        launch(trials_env, trial_id, stop=1000)
    # A database the results cannot go to (an error no retry fixes).
    ResultRow.__table__.drop(trials_env.store._engine)
    events = await asyncio.gather(
        *(
            TrialTrigger("pol", trial_id, poll_interval_seconds=0.1).run().asend(None)
            for trial_id in ids
        )
    )
    for event in events:
        assert event.payload["status"] == "ERROR" and event.payload["released"] is True
        assert "could not be written to the trials DB" in event.payload["error"], event.payload
        assert "no such table" in event.payload["error"]
    # Each trigger stopped its trial, so that its task's retry resumes it from its checkpoint.
    assert live_trial_actors() == []


async def test_a_killed_actor_ends_only_its_own_trials_watch(trials_env):
    import ray

    victim = launch(trials_env, "victim", stop=1000)
    for trial_id in ("k1", "k2"):
        launch(trials_env, trial_id, stop=30)
    runs = {
        trial_id: asyncio.ensure_future(
            TrialTrigger("pol", trial_id, poll_interval_seconds=0.1).run().asend(None)
        )
        for trial_id in ("victim", "k1", "k2")
    }
    while not await asyncio.to_thread(trials_env.store.reader.get_results, "victim"):
        await asyncio.sleep(0.1)
    ray.kill(victim, no_restart=True)
    events = {trial_id: (await run).payload for trial_id, run in runs.items()}
    assert events["victim"]["status"] == "ERROR" and events["victim"]["infrastructure"] is False
    assert "its Ray actor died while it ran" in events["victim"]["error"]
    for trial_id in ("k1", "k2"):
        assert events[trial_id]["status"] == "TERMINATED", events[trial_id]
        assert len(trials_env.store.reader.get_results(trial_id)) == 30
    assert live_trial_actors() == []
