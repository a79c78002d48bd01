"""RunTrialOperator called directly, across tries: a cleared task, a retry after the trial
finished, a worker or a node lost, a stop from the worker, and the try fence on the worker's
failure decision."""

from __future__ import annotations

import asyncio

import pytest
import ray
from airflow.sdk.exceptions import TaskDeferred

from airflow_trials import TrialError
from airflow_trials.core.end import TrialEnd
from airflow_trials.core.fate import Transition
from airflow_trials.core.status import TrialStatus
from airflow_trials.core.status_cause import StatusCause
from airflow_trials.operators.trial_operator import MAX_INFRASTRUCTURE_RESTARTS
from tests.airflow.test_operator import first_event, operator
from tests.conftest import live_placement_groups, live_trial_actors


def test_a_failure_decision_of_a_try_a_later_try_took_over_is_not_recorded(
    trials_env, fake_context
):
    """Issue 48: the worker of try 1 recorded its failed end even after the task was cleared and
    try 2 registered and placed the trial again; the setter's try fence now skips it."""
    store = trials_env.store
    for try_number in (1, 2):
        store.upsert_trial(
            "fenced",
            trainable="tests.trainables:counting",
            config={},
            resources={"cpu": 1},
            max_failures=2,
            try_number=try_number,
        )
        store.record_transition("fenced", Transition.PLACED, try_number=try_number)
    event = TrialEnd.lost("fenced", "ops", "its Ray actor died", released=True).to_event()
    with pytest.raises(TrialError):
        operator(trial_id="fenced", max_failures=2).execute_complete(
            fake_context(try_number=1), event
        )
    record = store.reader.get_trial("fenced")
    assert (record.status, record.num_failures, record.try_number, record.status_cause) == (
        TrialStatus.RUNNING,
        0,
        2,
        StatusCause.PLACED,
    )


def test_clearing_a_finished_task_runs_the_trial_again_from_scratch(trials_env, fake_context):
    first = operator(trial_id="again", deferrable=False).execute(fake_context())
    assert first["status"] == "TERMINATED"
    old_checkpoint = first["best_checkpoint"]
    before = trials_env.store.reader.get_trial("again")
    # Cleared: Airflow gives the task a fresh budget (max_tries = try_number + retries) and runs try
    # 2.
    rerun = operator(trial_id="again", deferrable=False)
    state = rerun.execute(fake_context(try_number=2, max_tries=1 + rerun.retries))
    assert state["status"] == "TERMINATED" and state["last_result"]["training_iteration"] == 4
    again = trials_env.store.reader.get_trial("again")
    assert again.started_at > before.ended_at and again.try_number == 2 and again.num_failures == 0
    # A new run, not a resumed one: its first result is new, its history is 1..4 once.
    assert [r["training_iteration"] for r in trials_env.store.reader.get_results("again")] == [
        1,
        2,
        3,
        4,
    ]
    assert state["last_result"]["timestamp"] > before.ended_at.timestamp()
    latest = trials_env.store.reader.latest_checkpoint("again")
    assert latest is not None and latest.path == old_checkpoint  # written again by the new run
    assert live_trial_actors() == []


def test_clearing_a_finished_task_after_raising_its_stopping_criterion_continues_the_trial(
    trials_env, fake_context
):
    first = operator(trial_id="more", deferrable=False).execute(fake_context())
    assert first["status"] == "TERMINATED"
    second = operator(
        trial_id="more", deferrable=False, stopping_criterion={"training_iteration": 6}
    )
    state = second.execute(fake_context(try_number=2, max_tries=1 + second.retries))
    assert state["status"] == "TERMINATED" and state["last_result"]["training_iteration"] == 6
    # It resumed from the checkpoint at iteration 4, so the stored history stays continuous.
    assert [r["training_iteration"] for r in trials_env.store.reader.get_results("more")] == [
        1,
        2,
        3,
        4,
        5,
        6,
    ]


def test_a_retry_after_the_trial_finished_reports_the_stored_state_without_running_again(
    trials_env, fake_context
):
    first = operator(trial_id="done", deferrable=False, max_failures=1).execute(fake_context())
    assert first["status"] == "TERMINATED"
    # Airflow lost that success and retries the task (max_tries stays at its retries).
    context = fake_context(try_number=2, max_tries=1 + MAX_INFRASTRUCTURE_RESTARTS)
    again = operator(trial_id="done", deferrable=True, max_failures=1).execute(
        context
    )  # no TaskDeferred
    assert again["status"] == "TERMINATED" and again["last_result"]["training_iteration"] == 4
    assert context["ti"].xcom["trial"] == again
    assert [r["training_iteration"] for r in trials_env.store.reader.get_results("done")] == [
        1,
        2,
        3,
        4,
    ]
    assert live_trial_actors() == []


def test_a_placement_group_orphaned_by_a_killed_worker_does_not_block_the_next_try(
    trials_env, fake_context
):
    """A worker killed between creating the trial's placement group and its actor leaves the group
    behind; the next try removes it and starts the trial instead of failing on its name."""
    from ray.util.placement_group import placement_group

    orphan = placement_group([{"CPU": 0.5}], name="trial.ops.orphan", lifetime="detached")
    ray.get(orphan.ready(), timeout=60)
    op = operator(trial_id="orphan", config={"sleep": 0.05}, resources_per_trial={"cpu": 0.5})
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(fake_context(task_id="orphan", try_number=2))
    assert live_trial_actors() == ["trial.ops.orphan"]
    event = asyncio.run(first_event(deferred.value.trigger))
    assert (
        op.execute_complete(fake_context(task_id="orphan", try_number=2), event)["status"]
        == "TERMINATED"
    )
    assert [r["training_iteration"] for r in trials_env.store.reader.get_results("orphan")] == [
        1,
        2,
        3,
        4,
    ]
    assert live_trial_actors() == [] and live_placement_groups() == []


def test_a_trial_lost_to_infrastructure_is_retried_without_counting_a_failure(
    trials_env, fake_context
):
    """Its node or Ray head went away (not its own code): the try fails so that Airflow retries
    it (a second deferral in one try can be failed by Airflow's scheduler), num_failures stays 0,
    and the retry resumes the trial from its latest checkpoint, so max_failures=0 still finishes."""
    op = operator(
        trial_id="infra",
        config={"sleep": 0.05},
        max_failures=0,
        stopping_criterion={"training_iteration": 6},
    )
    assert op.retries == MAX_INFRASTRUCTURE_RESTARTS
    store = trials_env.store
    first = fake_context(task_id="infra")
    with pytest.raises(TaskDeferred):
        op.execute(first)
    lost = {
        "trial_id": "infra",
        "experiment_name": "ops",
        "status": "ERROR",
        "infrastructure": True,
        "error": "Trial infra of experiment ops failed: its Ray actor is gone: the Ray cluster "
        "restarted.",
        "last_result": None,
        "best_checkpoint": None,
        "num_results": 0,
        "released": False,
    }
    with pytest.raises(
        TrialError, match="Ray cluster restarted.*Not a failure of the trial: Airflow retries"
    ) as raised:
        op.execute_complete(first, lost)
    assert raised.value.infrastructure
    record = store.reader.get_trial("infra")
    assert (record.status.value, record.num_failures) == ("PENDING", 0)
    assert first["ti"].xcom["trial"]["status"] == "PENDING"
    retry = fake_context(task_id="infra", try_number=2, max_tries=MAX_INFRASTRUCTURE_RESTARTS)
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(retry)
    state = op.execute_complete(retry, asyncio.run(first_event(deferred.value.trigger)))
    assert state["status"] == "TERMINATED" and state["num_failures"] == 0
    assert [r["training_iteration"] for r in store.reader.get_results("infra")] == [
        1,
        2,
        3,
        4,
        5,
        6,
    ]
    # With no retry left, such a loss fails the task like any other failure.
    store.record_transition("infra", Transition.QUEUED)
    last = fake_context(
        task_id="infra",
        try_number=MAX_INFRASTRUCTURE_RESTARTS + 1,
        max_tries=MAX_INFRASTRUCTURE_RESTARTS,
    )
    with pytest.raises(TrialError, match="failure 1, no retries left"):
        op.execute_complete(last, lost)
    assert store.reader.get_trial("infra").num_failures == 1
    assert live_trial_actors() == [] and live_placement_groups() == []


def test_a_try_never_reattaches_to_the_actor_its_cleared_previous_try_stops(
    trials_env, fake_context, tmp_path
):
    """The previous try's on_kill recorded its stop before this try registered, and has not killed
    the actor yet: this try kills it and starts the trial again, with a fresh failure budget."""
    from airflow_trials.hooks.trials import TrialsHook

    config = {"sleep": 0.1, "hold_at": 2, "gate": str(tmp_path / "gate")}
    first = operator(trial_id="stopping", config=config)
    with pytest.raises(TaskDeferred):
        first.execute(fake_context(try_number=1))
    actor = ray.get_actor("trial.ops.stopping", namespace="airflow_trials")
    pid = ray.get(actor.poll.remote(0)).pid
    store = trials_env.store
    assert TrialsHook.record_stop_from_airflow(store, "stopping", 1)
    assert store.reader.get_trial("stopping").stopped_from_airflow
    assert live_trial_actors() == ["trial.ops.stopping"]  # the trigger releases it after recording

    again = operator(trial_id="stopping", config=config)
    with pytest.raises(TaskDeferred) as deferred:
        again.execute(fake_context(try_number=2, max_tries=1 + again.retries))  # the clear's try
    assert live_trial_actors() == ["trial.ops.stopping"]
    new = ray.get_actor("trial.ops.stopping", namespace="airflow_trials")
    assert ray.get(new.poll.remote(0)).pid != pid
    record = store.reader.get_trial("stopping")
    assert not record.stopped_from_airflow and record.try_number == 2
    assert record.status.value in ("PENDING", "RUNNING")
    (tmp_path / "gate").touch()
    event = asyncio.run(first_event(deferred.value.trigger))
    state = again.execute_complete(fake_context(try_number=2), event)
    assert state["status"] == "TERMINATED" and state["num_failures"] == 0
    assert live_trial_actors() == [] and live_placement_groups() == []


def test_on_kill_in_the_worker_records_the_stop_fenced_by_its_try_and_stops_the_trial(
    trials_env, fake_context
):
    from airflow_trials.hooks.trials import STOPPED_FROM_AIRFLOW

    store = trials_env.store
    long_run = {
        "trial_id": "killed",
        "config": {"sleep": 0.2},
        "stopping_criterion": {"training_iteration": 100},
    }
    first = operator(**long_run)
    with pytest.raises(TaskDeferred):
        first.execute(fake_context(try_number=1))
    first.on_kill()
    assert live_trial_actors() == [] and live_placement_groups() == []
    record = store.reader.get_trial("killed")
    assert (record.status.value, record.stopped_from_airflow, record.error_msg) == (
        "TERMINATED",
        True,
        STOPPED_FROM_AIRFLOW,
    )
    # Its retry starts it again; a late on_kill of try 1 then leaves it to try 2.
    second = operator(**long_run)
    with pytest.raises(TaskDeferred):
        second.execute(fake_context(try_number=2))
    first.on_kill()
    assert live_trial_actors() == ["trial.ops.killed"]
    assert store.reader.get_trial("killed").status.value != "TERMINATED"
    second.on_kill()
    assert live_trial_actors() == [] and live_placement_groups() == []
    assert store.reader.get_trial("killed").stopped_from_airflow


def test_select_best_reconciles_trials_whose_tasks_ended_without_their_end(trials_env):
    """A trial left RUNNING by a task that failed for good is stopped on Ray and recorded ERROR; a
    suggested trial that never registered is counted as never run."""
    from airflow_trials import Trial
    from airflow_trials.execution.driver.actor_client import TrialActorClient
    from airflow_trials.experiment import reconcile_trial_ends
    from airflow_trials.hooks.trials import TrialsHook

    store = trials_env.store
    run = store.create_experiment_run("recon", "run-1")
    for trial_id in ("done", "stuck"):
        store.upsert_trial(
            trial_id,
            trainable="tests.trainables:counting",
            config={},
            resources={"cpu": 0.5},
            max_failures=0,
            experiment_run_id=run,
        )
    store.record_transition("done", Transition.PLACED)
    store.record_end(TrialEnd("done", "recon", TrialStatus.TERMINATED))
    store.record_transition("stuck", Transition.PLACED)
    TrialActorClient(trials_env.storage).launch(
        Trial(
            "tests.trainables:counting",
            {"sleep": 0.5},
            trial_id="stuck",
            experiment_name="recon",
            resources={"cpu": 0.5},
        )
    )
    assert live_trial_actors() == ["trial.recon.stuck"]

    counts = reconcile_trial_ends(TrialsHook(), store, "recon", run, ["done", "stuck", "never"])
    assert counts == {"finished": 1, "failed": 1, "never_ran": 1}
    stuck = store.reader.get_trial("stuck")
    assert (
        stuck.status.value == "ERROR"
        and "failed without recording the trial's end" in stuck.error_msg
    )
    assert live_trial_actors() == [] and live_placement_groups() == []


def test_a_sweeps_registered_trials_that_never_started_count_as_never_run(trials_env):
    """A sweep's trials are registered before its driver starts them (``trial_ids`` None: the
    run's registered trials): one its driver never started is counted as never run and left
    PENDING, not recorded ERROR; one left RUNNING is still recorded ERROR."""
    from airflow_trials.experiment import reconcile_trial_ends
    from airflow_trials.hooks.trials import TrialsHook

    store = trials_env.store
    run = store.create_experiment_run("recon", "sweep-1")
    planned = [(trial_id, {"scale": 1.0}, None) for trial_id in ("done", "stuck", "never")]
    store.register_trials(
        run, planned, trainable="tests.trainables:counting", resources={"cpu": 0.5}, max_failures=0
    )
    store.record_transition("done", Transition.PLACED)
    store.record_end(TrialEnd("done", "recon", TrialStatus.TERMINATED))
    store.record_transition("stuck", Transition.PLACED)

    counts = reconcile_trial_ends(TrialsHook(), store, "recon", run, None)
    assert counts == {"finished": 1, "failed": 1, "never_ran": 1}
    assert store.reader.get_trial("stuck").status is TrialStatus.ERROR
    assert store.reader.get_trial("never").status is TrialStatus.PENDING
