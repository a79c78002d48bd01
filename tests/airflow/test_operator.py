"""RunTrialOperator called directly: deferral, re-attaching after a worker death, completion, bad
input."""

from __future__ import annotations

import asyncio

import pytest
import ray
from airflow.sdk.exceptions import AirflowFailException, TaskDeferred

from airflow_trials import InsufficientResourcesError, TrainableNotFoundError, TrialError
from airflow_trials.core.end import TrialEnd
from airflow_trials.core.fate import Transition
from airflow_trials.core.status import TrialStatus
from airflow_trials.core.update import TrialUpdate
from airflow_trials.operators.trial_operator import MAX_INFRASTRUCTURE_RESTARTS, RunTrialOperator
from airflow_trials.triggers.trial_trigger import TrialTrigger
from tests.conftest import live_placement_groups, live_trial_actors


def operator(**kwargs):
    kwargs.setdefault("task_id", "trial")
    kwargs.setdefault("trainable", "tests.trainables:counting")
    kwargs.setdefault("experiment_name", "ops")
    kwargs.setdefault("stopping_criterion", {"training_iteration": 4})
    kwargs.setdefault("poll_interval_seconds", 0.05)
    kwargs.setdefault("deferrable", True)
    return RunTrialOperator(**kwargs)


async def first_event(trigger):
    async for event in trigger.run():
        return event.payload


def test_execute_defers_and_a_second_try_reattaches_without_a_second_copy(
    trials_env, fake_context, tmp_path
):
    # The trial holds at iteration 3 until the second try has re-attached, however slow the machine.
    config = {"sleep": 0.2, "hold_at": 3, "gate": str(tmp_path / "gate")}
    op = operator(trial_id="tw", config=config)
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(fake_context(try_number=1))
    trigger = deferred.value.trigger
    assert isinstance(trigger, TrialTrigger) and deferred.value.method_name == "execute_complete"
    assert trigger.serialize()[1]["trial_id"] == "tw"
    pid = ray.get(ray.get_actor("trial.ops.tw", namespace="airflow_trials").poll.remote(0)).pid

    # The worker died while the trial ran; Airflow runs the next try, which re-attaches.
    again = operator(trial_id="tw", config=config)
    with pytest.raises(TaskDeferred):
        again.execute(fake_context(try_number=2))
    assert live_trial_actors() == ["trial.ops.tw"]
    assert (
        ray.get(ray.get_actor("trial.ops.tw", namespace="airflow_trials").poll.remote(0)).pid == pid
    )
    (tmp_path / "gate").touch()

    event = asyncio.run(first_event(trigger))
    assert event["status"] == "TERMINATED"
    context = fake_context(try_number=2)
    state = again.execute_complete(context, event)
    assert state == context["ti"].xcom["trial"]
    assert state["status"] == "TERMINATED" and state["num_failures"] == 0
    assert state["last_result"]["training_iteration"] == 4 and state["config"] == config
    assert state["best_checkpoint"].endswith("checkpoint_000004")
    assert [r["training_iteration"] for r in trials_env.store.reader.get_results("tw")] == [
        1,
        2,
        3,
        4,
    ]
    assert trials_env.store.reader.get_trial("tw").status.value == "TERMINATED"
    assert live_trial_actors() == [] and live_placement_groups() == []


def test_a_trial_queued_for_resources_defers_at_once_and_starts_when_placed(
    trials_env, fake_context
):
    """More trials than the cluster holds: the extra ones wait deferred, not in a worker."""
    from airflow_trials.execution.handles import find_trial_actor, is_placed

    ops, deferred = {}, {}
    for trial_id in ("q1", "q2"):  # each needs the whole cluster
        ops[trial_id] = operator(
            trial_id=trial_id, config={"sleep": 0.1}, resources_per_trial={"cpu": 2}
        )
        with pytest.raises(TaskDeferred) as raised:
            ops[trial_id].execute(
                fake_context(task_id=trial_id)
            )  # returns without waiting for CPUs
        deferred[trial_id] = raised.value.trigger
    # Ray places one of them (which one is Ray's choice); the other waits for its CPUs.
    polls = {find_trial_actor("ops", t).poll.remote(0): t for t in ops}
    ready, _ = ray.wait(list(polls), num_returns=1, timeout=60)
    assert ready, "Ray placed neither trial"
    running = polls[ready[0]]
    queued = "q2" if running == "q1" else "q1"
    assert not is_placed(find_trial_actor("ops", queued))
    store = trials_env.store
    assert store.reader.get_trial(queued).status.value == "PENDING"
    # A retry while it is still queued re-attaches to it instead of starting a second copy.
    with pytest.raises(TaskDeferred):
        operator(trial_id=queued, config={"sleep": 0.1}, resources_per_trial={"cpu": 2}).execute(
            fake_context(task_id=queued, try_number=2)
        )
    assert sorted(live_trial_actors()) == ["trial.ops.q1", "trial.ops.q2"]

    event = asyncio.run(first_event(deferred[running]))  # the trigger frees its CPUs at the end...
    ops[running].execute_complete(fake_context(task_id=running), event)
    event = asyncio.run(first_event(deferred[queued]))  # ...so Ray places the queued trial
    assert event["status"] == "TERMINATED" and event["last_result"]["training_iteration"] == 4
    record = store.reader.get_trial(queued)
    assert (
        record.status.value == "TERMINATED" and record.started_at is not None
    )  # the trigger marked both
    assert (
        ops[queued].execute_complete(fake_context(task_id=queued), event)["status"] == "TERMINATED"
    )
    assert live_trial_actors() == [] and live_placement_groups() == []


def test_a_finished_end_is_recorded_once_by_its_trigger_and_only_read_by_the_worker(
    trials_env, fake_context
):
    """Issue 48: the trigger and execute_complete both wrote a finished trial's end. The trigger
    records it before it fires (so a retry of a task whose worker died finds it); the worker
    writes nothing more."""
    op = operator(trial_id="once")
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(fake_context(try_number=1))
    event = asyncio.run(first_event(deferred.value.trigger))
    store = trials_env.store
    recorded = store.reader.get_trial("once")
    assert recorded.status is TrialStatus.TERMINATED and recorded.ended_at is not None
    state = op.execute_complete(fake_context(try_number=1), event)
    assert state["status"] == "TERMINATED" and state["last_result"]["training_iteration"] == 4
    again = store.reader.get_trial("once")
    assert (again.updated_at, again.ended_at) == (recorded.updated_at, recorded.ended_at)


@pytest.mark.parametrize("status", ["TERMINATED", "ERROR"])
def test_execute_complete_for_every_status(trials_env, fake_context, status):
    op = operator(trial_id=f"ec-{status.lower()}", max_failures=1)
    trials_env.store.upsert_trial(
        op.trial_id, trainable=op.trainable, config={}, resources={}, max_failures=1
    )
    trials_env.store.record_transition(op.trial_id, Transition.PLACED)
    event = {
        "trial_id": op.trial_id,
        "experiment_name": "ops",
        "status": status,
        "error": "Traceback ...\nValueError: boom" if status == "ERROR" else None,
        "last_result": {"training_iteration": 2},
        "best_checkpoint": None,
        "num_results": 2,
    }
    context = fake_context(try_number=1)
    if status == "TERMINATED":
        # Its trigger recorded the end before it fired (TrialWatch._ended); the worker reads it.
        trials_env.store.record_progress([TrialUpdate.of_end(TrialEnd.from_event(event))])
        assert op.execute_complete(context, event)["status"] == "TERMINATED"
    else:
        with pytest.raises(TrialError, match="failure 1, will retry from its latest checkpoint"):
            op.execute_complete(context, event)
        assert context["ti"].xcom["trial"]["status"] == "PENDING"
        record = trials_env.store.reader.get_trial(op.trial_id)
        assert record.num_failures == 1 and "ValueError: boom" in record.error_msg
        with pytest.raises(
            AirflowFailException, match=r"failure 2, no retries left.*max_failures \(1\)"
        ):
            op.execute_complete(fake_context(try_number=2), event)
        assert trials_env.store.reader.get_trial(op.trial_id).status.value == "ERROR"


def test_max_failures_below_retries_stops_retrying(trials_env, fake_context):
    """A run's params can give a trial fewer failures than the task's (fixed) retries."""
    op = operator(trial_id="budget", max_failures=0, retries=3)
    trials_env.store.upsert_trial(
        op.trial_id, trainable=op.trainable, config={}, resources={}, max_failures=0
    )
    event = {
        "trial_id": op.trial_id,
        "experiment_name": "ops",
        "status": "ERROR",
        "error": "Traceback ...\nValueError: boom",
        "last_result": None,
        "best_checkpoint": None,
        "num_results": 0,
    }
    with pytest.raises(
        AirflowFailException,
        match=r"no retries left.*max_failures \(0\) before the task's retries \(3\)",
    ):
        op.execute_complete(fake_context(try_number=1), event)
    assert trials_env.store.reader.get_trial(op.trial_id).status.value == "ERROR"


def test_a_cleared_task_of_a_trial_that_failed_for_good_gets_a_fresh_failure_budget(
    trials_env, fake_context
):
    broken = operator(trial_id="flaky", deferrable=False, trainable="tests.trainables:failing")
    with pytest.raises(AirflowFailException, match="failure 1, no retries left"):
        broken.execute(fake_context())
    assert trials_env.store.reader.get_trial("flaky").status.value == "ERROR"
    # Cleared after the trainable was fixed: Airflow gives it fresh retries, the trial fresh
    # failures.
    fixed = operator(trial_id="flaky", deferrable=False, trainable="tests.trainables:counting")
    state = fixed.execute(fake_context(try_number=2, max_tries=1 + fixed.retries))
    assert state["status"] == "TERMINATED" and state["num_failures"] == 0


def test_blocking_fallback_polls_in_the_worker(trials_env, fake_context):
    context = fake_context()
    state = operator(trial_id="blocking", deferrable=False).execute(context)
    assert state["status"] == "TERMINATED" and context["ti"].xcom["trial"] == state


def test_retries_default_to_max_failures():
    # Plus the retries that resume trials lost to infrastructure, which are not their failures.
    assert operator(max_failures=3).retries == 3 + MAX_INFRASTRUCTURE_RESTARTS
    assert operator(max_failures=-1).retries == 10_000
    assert operator(max_failures=3, retries=1).retries == 1
    # Only retries given: the trial may fail as often (the operator does not stop retrying first).
    assert operator(retries=2).max_failures == 2 and operator().max_failures == 0


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"trainable": "tests.trainables:nope"}, TrainableNotFoundError, "has no attribute 'nope'"),
        (
            {"resources_per_trial": {"cpu": 1, "gpu": 8}},
            InsufficientResourcesError,
            "needs 1 CPU, 8 GPU",
        ),
        ({"config": {"f": object()}}, ValueError, "config is not JSON-serialisable"),
        ({"trial_id": "../../etc"}, ValueError, "Trial id '../../etc' is not a valid name"),
        ({"experiment_name": "a/b"}, ValueError, "Experiment name 'a/b' is not a valid name"),
    ],
)
def test_bad_input_fails_before_any_ray_work_and_writes_nothing(
    trials_env, fake_context, kwargs, error, message
):
    kwargs.setdefault("trial_id", "bad")
    with pytest.raises(error, match=message):
        operator(**kwargs).execute(fake_context())
    assert trials_env.store.reader.list_trials() == []
    assert live_trial_actors() == [] and live_placement_groups() == []


def test_a_trial_that_ran_waits_for_its_lost_node_instead_of_being_refused(
    trials_env, fake_context
):
    """A retry after the node a trial ran on was lost (the GPU node, say): the cluster is short
    of the trial's resources now, but it fitted when the trial started, so the trial is launched
    and waits for Ray to place it, its task deferred, rather than failing every retry."""
    from ray.util.placement_group import placement_group_table

    op = operator(trial_id="waits", resources_per_trial={"cpu": 1, "gpu": 8}, retries=1)
    trials_env.store.upsert_trial(
        "waits", trainable=op.trainable, config={}, resources={"cpu": 1, "gpu": 8}, max_failures=0
    )
    trials_env.store.record_transition("waits", Transition.PLACED)
    assert trials_env.store.reader.get_trial("waits").started_at is not None
    with pytest.raises(TaskDeferred):
        op.execute(fake_context(try_number=2, max_tries=1))
    (waiting,) = [info for info in placement_group_table().values() if info["state"] != "REMOVED"]
    assert waiting["state"] == "PENDING" and waiting["bundles"][0]["GPU"] == 8
