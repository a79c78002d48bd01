"""The trigger's contract (serialize, non-blocking run, cancellation) and GPU pool arithmetic."""

from __future__ import annotations

import asyncio
import time

import pytest

from airflow_trials.core.fate import Transition
from airflow_trials.pools import gpu_pool_slots
from airflow_trials.triggers.trial_trigger import TrialStatusTrigger, TrialTrigger
from tests.conftest import LoopTicker
from tests.factories import update_trial


@pytest.mark.parametrize(("gpu", "slots"), [(0.25, 1), (0.5, 2), (1, 4), (2, 8), (0.3, 2), (0, 1)])
def test_pool_slots_are_ceil_of_gpu_times_slots_per_gpu(gpu, slots):
    assert gpu_pool_slots(gpu, slots_per_gpu=4) == slots


def test_pool_slots_with_other_granularity():
    assert gpu_pool_slots(0.3, slots_per_gpu=10) == 3
    assert gpu_pool_slots(0.25, slots_per_gpu=1) == 1
    with pytest.raises(ValueError, match="slots_per_gpu"):
        gpu_pool_slots(1, slots_per_gpu=0)


def test_trial_trigger_serializes_its_init_arguments():
    trigger = TrialTrigger("exp", "t1", "my_ray", "my_db", 0.5)
    assert trigger.serialize() == (
        "airflow_trials.triggers.trial_trigger.TrialTrigger",
        {
            "experiment_name": "exp",
            "trial_id": "t1",
            "ray_conn_id": "my_ray",
            "trials_conn_id": "my_db",
            "poll_interval_seconds": 0.5,
            "ray_outage_timeout_seconds": 120.0,
            "ray_cluster_id": None,
            "scheduler": None,
            "bracket": 0,
            "experiment_run_id": None,
        },
    )
    classpath, kwargs = trigger.serialize()
    assert TrialTrigger(**kwargs).serialize() == (classpath, kwargs)
    # A trigger deferred before schedulers existed (its kwargs lack the new fields) still loads.
    old = {
        k: v for k, v in kwargs.items() if k not in ("scheduler", "bracket", "experiment_run_id")
    }
    assert TrialTrigger(**old).serialize() == (classpath, kwargs)
    asha = {
        "metric": "loss",
        "mode": "min",
        "time_attr": "training_iteration",
        "max_t": 9,
        "grace_period": 1,
        "reduction_factor": 3,
        "brackets": 1,
        "stop_last_trials": True,
    }
    with_asha = TrialTrigger("exp", "t1", scheduler=asha, bracket=0, experiment_run_id=7)
    assert TrialTrigger(**with_asha.serialize()[1]).serialize() == with_asha.serialize()
    with pytest.raises(ValueError, match="needs experiment_run_id"):
        TrialTrigger("exp", "t1", scheduler=asha)


def test_status_trigger_serializes_its_init_arguments():
    trigger = TrialStatusTrigger(
        "exp", run_key="manual__1", trials_conn_id="db", poll_interval_seconds=5
    )
    assert trigger.serialize() == (
        "airflow_trials.triggers.trial_trigger.TrialStatusTrigger",
        {
            "experiment_name": "exp",
            "trial_id": None,
            "run_key": "manual__1",
            "trials_conn_id": "db",
            "poll_interval_seconds": 5,
        },
    )


def _launch(trials_env, trial_id, config, stop=5):
    from airflow_trials import Trial
    from airflow_trials.execution.driver.actor_client import TrialActorClient

    trials_env.store.upsert_trial(
        trial_id, trainable="tests.trainables:counting", config=config, resources={}, max_failures=0
    )
    executor = TrialActorClient(trials_env.storage)
    trial = Trial(
        "tests.trainables:counting",
        config,
        trial_id=trial_id,
        experiment_name="trig",
        stopping_criterion={"training_iteration": stop},
        keep_checkpoints_num=2,
        checkpoint_score_attr="score",
    )
    executor.launch(trial)
    return executor


async def test_run_never_blocks_the_event_loop_and_records_results(trials_env):
    _launch(trials_env, "nb", {"sleep": 0.1})
    trigger = TrialTrigger("trig", "nb", poll_interval_seconds=0.05)
    async with LoopTicker() as ticker:
        started = time.monotonic()
        event = await trigger.run().asend(None)
        elapsed = time.monotonic() - started
    # The loop kept ticking while the trial trained (5 iterations of 0.1 s): a run() that blocked
    # it until the end would let it tick once at most. (No rate is asserted: load slows ticks.)
    assert ticker.ticks >= 3, (ticker.ticks, elapsed)
    assert (
        event.payload["status"] == "TERMINATED"
        and event.payload["last_result"]["training_iteration"] == 5
    )
    assert [r["training_iteration"] for r in trials_env.store.reader.get_results("nb")] == [
        1,
        2,
        3,
        4,
        5,
    ]
    kept = trials_env.store.reader.latest_checkpoint("nb")
    assert kept.iteration == 5 and kept.score == 5.0
    # The trigger freed the trial's resources itself (a queued trial need not wait for a worker)...
    from tests.conftest import live_placement_groups, live_trial_actors

    assert live_trial_actors() == [] and live_placement_groups() == []
    assert trials_env.store.reader.get_trial("nb").status.value == "TERMINATED"
    # ...so the same trigger run again (a triggerer restart before the event was handled) reports
    # the stored end instead of a lost actor.
    again = await TrialTrigger("trig", "nb", poll_interval_seconds=0.05).run().asend(None)
    assert again.payload["status"] == "TERMINATED" and again.payload["error"] is None
    assert again.payload["last_result"]["training_iteration"] == 5
    assert again.payload["best_checkpoint"] == kept.path


async def test_cancelled_while_the_task_is_still_deferred_leaves_the_trial_running(trials_env):
    from tests.conftest import live_trial_actors

    _launch(trials_env, "keep", {"sleep": 0.1}, stop=1000)
    trigger = TrialTrigger("trig", "keep", poll_interval_seconds=0.05)
    pending = asyncio.ensure_future(trigger.run().asend(None))
    await asyncio.sleep(0.5)
    pending.cancel()
    with pytest.raises(asyncio.CancelledError):
        await pending
    assert live_trial_actors() == ["trial.trig.keep"]  # a triggerer restart must not kill it
    assert trials_env.store.reader.get_trial("keep").status.value != "TERMINATED"


async def test_a_user_kill_stops_the_trial_through_on_kill(trials_env):
    """What the triggerer does when a user clears or marks the deferred task: it cancels run()
    with its user-action message, then awaits on_kill(), then cleanup()."""
    from tests.conftest import live_trial_actors

    _launch(trials_env, "gone", {"sleep": 0.1}, stop=1000)
    trigger = TrialTrigger("trig", "gone", poll_interval_seconds=0.05)
    pending = asyncio.ensure_future(trigger.run().asend(None))
    await asyncio.sleep(0.5)
    pending.cancel("__airflow_user_action__")
    with pytest.raises(asyncio.CancelledError):
        await pending
    assert live_trial_actors() == ["trial.trig.gone"]  # cancelling alone never stops the trial
    await trigger.on_kill()
    await trigger.cleanup()
    assert live_trial_actors() == []
    record = trials_env.store.reader.get_trial("gone")
    assert record.status.value == "TERMINATED" and "cleared or marked" in record.error_msg


@pytest.mark.parametrize(
    ("state", "stops"), [("deferred", False), (None, True), ("success", True), ("failed", True)]
)
async def test_on_kill_stops_the_trial_unless_its_trigger_only_moved_to_another_triggerer(
    trials_env, monkeypatch, state, stops
):
    """Airflow 3.3 calls on_kill also when a trigger moves to another triggerer (its triggerer's
    heartbeat lagged): the task is then still deferred, and the trial must run on. A cleared
    (no state) or marked task's trial is stopped."""
    from types import SimpleNamespace

    from airflow.sdk.execution_time.task_runner import RuntimeTaskInstance

    from tests.conftest import live_trial_actors

    asked = []

    def task_states(**query):
        asked.append(query)
        return {"run1": {"tune.trial_2": state}}

    monkeypatch.setattr(RuntimeTaskInstance, "get_task_states", staticmethod(task_states))
    _launch(trials_env, "moved", {"sleep": 0.1}, stop=1000)
    trigger = TrialTrigger("trig", "moved", poll_interval_seconds=0.05)
    trigger.task_instance = SimpleNamespace(
        dag_id="dag", run_id="run1", task_id="tune.trial", map_index=2, try_number=1
    )
    await trigger.on_kill()
    await trigger.cleanup()
    assert asked == [
        {"dag_id": "dag", "map_index": 2, "task_ids": ["tune.trial"], "run_ids": ["run1"]}
    ]
    assert live_trial_actors() == ([] if stops else ["trial.trig.moved"])
    status = trials_env.store.reader.get_trial("moved").status.value
    assert (status == "TERMINATED") is stops


async def test_on_kill_of_a_cleared_try_leaves_the_trial_to_the_later_try_already_deferred(
    trials_env, monkeypatch, capsys
):
    """A cleared task's next try may register the trial and defer before the old try's on_kill
    runs (Airflow does not wait for it): the task reads "deferred" then, yet its trigger did not
    move. on_kill reads the takeover from the trials DB first, stops nothing and says so."""
    from types import SimpleNamespace

    from airflow.sdk.execution_time.task_runner import RuntimeTaskInstance

    from tests.conftest import live_trial_actors

    asked = []

    def task_states(**query):
        asked.append(query)
        return {"run1": {"tune.trial_2": "deferred"}}

    monkeypatch.setattr(RuntimeTaskInstance, "get_task_states", staticmethod(task_states))
    _launch(trials_env, "taken", {"sleep": 0.1}, stop=1000)
    update_trial(trials_env.store, "taken", try_number=2)  # the later try re-attached
    trigger = TrialTrigger("trig", "taken", poll_interval_seconds=0.05)
    trigger.task_instance = SimpleNamespace(
        dag_id="dag", run_id="run1", task_id="tune.trial", map_index=2, try_number=1
    )
    await trigger.on_kill()
    await trigger.cleanup()
    assert asked == []  # the takeover decides; the task's state is not read
    assert "a later try took the trial over, leaving it running" in capsys.readouterr().out
    assert live_trial_actors() == ["trial.trig.taken"]
    assert trials_env.store.reader.get_trial("taken").status.value != "TERMINATED"


async def test_on_kill_of_a_moved_trigger_stops_nothing_when_the_takeover_cannot_be_read(
    trials_env, monkeypatch, capsys
):
    """The trials DB does not answer which try holds the trial: the task's state decides (here
    still deferred: the trigger only moved), and on_kill neither raises nor stops the trial."""
    from types import SimpleNamespace

    from airflow.sdk.execution_time.task_runner import RuntimeTaskInstance

    import airflow_trials.triggers.trial_trigger as trial_trigger
    from airflow_trials.exceptions import StoreError
    from tests.conftest import live_trial_actors

    def unreadable(*args):
        raise StoreError("the trials DB did not answer")

    monkeypatch.setattr(trial_trigger, "_taken_over_by_a_later_try", unreadable)
    monkeypatch.setattr(
        RuntimeTaskInstance,
        "get_task_states",
        staticmethod(lambda **query: {"run1": {"tune.trial_2": "deferred"}}),
    )
    _launch(trials_env, "unread", {"sleep": 0.1}, stop=1000)
    trigger = TrialTrigger("trig", "unread", poll_interval_seconds=0.05)
    trigger.task_instance = SimpleNamespace(
        dag_id="dag", run_id="run1", task_id="tune.trial", map_index=2, try_number=1
    )
    await trigger.on_kill()
    await trigger.cleanup()
    # Out or err: where a warning goes depends on how an earlier test left Airflow's logging.
    captured = capsys.readouterr()
    assert "Could not read which try holds trial unread" in captured.out + captured.err
    assert live_trial_actors() == ["trial.trig.unread"]
    assert trials_env.store.reader.get_trial("unread").status.value != "TERMINATED"


async def test_on_kill_before_run_attached_still_stops_the_trial(trials_env):
    from tests.conftest import live_trial_actors

    _launch(trials_env, "early", {"sleep": 0.1}, stop=1000)
    trigger = TrialTrigger("trig", "early", poll_interval_seconds=0.05)
    await trigger.on_kill()
    await trigger.cleanup()
    assert live_trial_actors() == []
    assert trials_env.store.reader.get_trial("early").status.value == "TERMINATED"


@pytest.mark.parametrize("launched_on", ["this", "another"])
async def test_an_actor_gone_with_its_cluster_is_an_infrastructure_loss(trials_env, launched_on):
    """An actor missing when the trigger starts: lost with a replaced Ray cluster (a head restarted
    between the task's deferral and the trigger's start) is infrastructure; on the same cluster
    (killed, say) it is a failure of the trial."""
    from airflow_trials.execution.ray_state import current_cluster_id

    executor = _launch(trials_env, f"gone-{launched_on}", {"sleep": 0.1}, stop=1000)
    trials_env.store.record_transition(f"gone-{launched_on}", Transition.PLACED)
    executor.terminate("trig", f"gone-{launched_on}")
    cluster = current_cluster_id() if launched_on == "this" else "0" * 56
    event = (
        await TrialTrigger(
            "trig", f"gone-{launched_on}", poll_interval_seconds=0.05, ray_cluster_id=cluster
        )
        .run()
        .asend(None)
    )
    assert event.payload["status"] == "ERROR"
    assert event.payload["infrastructure"] is (launched_on == "another"), event.payload
    if launched_on == "another":
        assert "the Ray cluster it was launched on is gone" in event.payload["error"]


async def test_an_actor_removed_after_a_graceful_stop_paused_it_is_no_failure(trials_env):
    """The main job on a Ray cluster it did not start drains its trials, stops Airflow, then
    removes their actors: the next try's trigger finds the actor gone and the storage's mark of
    the drain, which is an infrastructure loss (no ``max_failures`` spent), not a failure."""
    from airflow_trials.execution.driver.drain import drain_trials
    from airflow_trials.execution.ray_state import current_cluster_id
    from airflow_trials.storage.trial_storage import TrialStorage

    executor = _launch(trials_env, "drained", {"sleep": 0.05}, stop=1000)
    trials_env.store.record_transition("drained", Transition.PLACED)
    report = await asyncio.to_thread(drain_trials, 60, "trial.trig.drained")
    state = report.states["trial.trig.drained"]
    assert state["state"] == "paused", report.summary()
    assert TrialStorage(trials_env.storage).drained_at("trig", "drained") == state["iteration"]
    executor.terminate("trig", "drained")

    trigger = TrialTrigger(
        "trig", "drained", poll_interval_seconds=0.05, ray_cluster_id=current_cluster_id()
    )
    event = await trigger.run().asend(None)
    assert event.payload["status"] == "ERROR" and event.payload["infrastructure"] is True
    assert (
        f"a graceful stop paused it after iteration {state['iteration']}"
        in (event.payload["error"])
    )
