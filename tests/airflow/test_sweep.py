"""Sweeps: a whole experiment run as one task (RunSweepOperator), its driver a detached named actor
on real Ray, with real Airflow (dag.test, and the operator called as a worker would) and a real
trials store. Re-attaching never starts a second driver, and a lost driver's run resumes. A sweep's
searcher (learning from each ended trial, resumed, several metrics) is in test_sweep_search.py."""

from __future__ import annotations

import asyncio
import time

import pytest
from airflow.sdk.exceptions import TaskDeferred

from airflow_trials.core.search import grid_search
from tests.airflow.test_early_stopping import Code
from tests.airflow.test_experiment_dag import experiment_dag, task_states, xcom
from tests.airflow.test_provider_info import extra_link
from tests.conftest import live_placement_groups, live_trial_actors

NAMESPACE = "airflow_trials"


def live_drivers() -> list[str]:
    import ray

    return [
        e["name"]
        for e in ray.util.list_named_actors(all_namespaces=True)
        if e["name"].startswith("sweep.")
    ]


def nothing_left_on_ray() -> None:
    """No driver, trial actor or placement group is left: killed actors leave Ray's list soon
    after."""
    wait_for(
        lambda: (
            live_drivers() == [] and live_trial_actors() == [] and live_placement_groups() == []
        ),
        "the sweep's driver, actors and placement groups to be gone",
        timeout_s=60,
    )


def test_a_sweep_dag_runs_every_trial_in_one_task(trials_env):
    dag = experiment_dag(
        "sweep_e2e",
        search_space={"scale": grid_search([1.0, 3.0, 2.0, 0.5, 4.0, 1.5])},
        sweep=True,
        max_concurrent_trials=2,
    )
    run = dag.test()
    states = task_states(run)
    assert run.state == "success", states
    assert states == {
        ("tune.suggest_configs", -1): "success",
        ("tune.sweep", -1): "success",
        ("tune.select_best", -1): "success",
    }
    store = trials_env.store
    (exp_run,) = store.reader.list_experiment_runs("sweep_e2e")
    trials = store.reader.list_trials(experiment_run_id=exp_run.id)
    assert len(trials) == 6 and {t.status.value for t in trials} == {"TERMINATED"}
    for record in trials:  # every result once, in order
        assert [r["training_iteration"] for r in store.reader.get_results(record.trial_id)] == [
            1,
            2,
            3,
        ]
    summary = xcom(run, "tune.sweep", key="sweep")
    assert (summary["total"], summary["terminated"], summary["errored"]) == (6, 6, 0)
    best = xcom(run, "tune.select_best")
    assert best["config"]["scale"] == 4.0 and best["value"] == 12.0 and best["trials"] == 6
    assert summary["best_value"] == 12.0 and summary["best_trial_id"] == best["trial_id"]
    assert extra_link(run, "tune.sweep") == f"/trials/runs/{exp_run.id}"  # its dashboard button
    nothing_left_on_ray()


def test_a_sweep_runs_its_scheduler_in_the_driver(trials_env):
    """ASHA decides in the driver (the runner's scheduler). With two trials at a time, best first,
    the worst trial starts after four others recorded rung 1, all above it: it stops there."""
    asha = Code(
        "__import__('airflow_trials').ASHAScheduler(max_t=9, grace_period=1, reduction_factor=3)"
    )
    scales = [6.0, 5.0, 4.0, 3.0, 2.0, 1.0]
    dag = experiment_dag(
        "sweep_asha",
        search_space={"scale": grid_search(scales)},
        stop={"training_iteration": 9},
        sweep=True,
        max_concurrent_trials=2,
        scheduler=asha,
    )
    run = dag.test()
    assert run.state == "success", task_states(run)
    store = trials_env.store
    (exp_run,) = store.reader.list_experiment_runs("sweep_asha")
    by_scale = {
        t.config["scale"]: t for t in store.reader.list_trials(experiment_run_id=exp_run.id)
    }
    assert {t.status.value for t in by_scale.values()} == {"TERMINATED"}
    assert by_scale[6.0].last_result["training_iteration"] == 9
    worst = by_scale[1.0]
    assert worst.last_result["training_iteration"] == 1 and worst.stop_reason.startswith(
        "stopped by ASHA"
    )
    assert xcom(run, "tune.select_best")["config"]["scale"] == 6.0


def test_a_gpu_pool_sweep_needs_max_concurrent_trials(trials_env):
    with pytest.raises(
        ValueError, match="sweep=True with gpu_pool 'gpus' needs max_concurrent_trials"
    ):
        experiment_dag(
            "sweep_gpu",
            search_space={"scale": grid_search([1.0])},
            sweep=True,
            gpu_pool="gpus",
            resources_per_trial={"cpu": 0.5, "gpu": 1},
        )


def test_a_gpu_pool_sweep_holds_its_concurrent_trials_slots(trials_env):
    dag = experiment_dag(
        "sweep_pool",
        search_space={"scale": grid_search([1.0, 2.0])},
        sweep=True,
        gpu_pool="gpus",
        resources_per_trial={"cpu": 0.5, "gpu": 0.5},
        max_concurrent_trials=3,
    )
    sweep = dag.get_task("tune.sweep")
    assert (sweep.pool, sweep.pool_slots, sweep.max_concurrent_trials) == (
        "gpus",
        2 * 3,
        3,
    )  # 0.5 GPU = 2 slots


def sweep_operator(**kwargs):
    from airflow_trials.operators.sweep_operator import RunSweepOperator

    kwargs.setdefault("trainable", "tests.trainables:counting")
    kwargs.setdefault("deferrable", True)
    return RunSweepOperator(
        task_id="sweep",
        metric="score",
        mode="max",
        experiment_name="sweep_op",
        stopping_criterion={"training_iteration": 3},
        resources_per_trial={"cpu": 0.5},
        poll_interval_seconds=0.05,
        **kwargs,
    )


def first_trigger_event(trigger):
    async def first():
        async for event in trigger.run():
            return event

    return asyncio.run(first())


def first_event(trigger):
    return first_trigger_event(trigger).payload


@pytest.mark.parametrize("status", ["finished", "error", "lost"])
def test_execute_complete_reads_each_sweep_end(status, fake_context):
    """A finished run returns and pushes its summary; a failed or lost driver raises for
    Airflow's retry, naming the run."""
    from airflow_trials.core.end import SweepEnd, SweepStatus
    from airflow_trials.operators.sweep_operator import SweepLostError

    progress = {
        "total": 2,
        "terminated": 2,
        "errored": 0,
        "best_value": 6.0,
        "best_trial_id": "t2",
        "metric": "score",
        "mode": "max",
        "elapsed_seconds": 3.0,
        "finished": True,
    }
    ends = {
        "finished": SweepEnd("run8", SweepStatus.FINISHED, progress),
        "error": SweepEnd("run8", SweepStatus.ERROR, progress, "ValueError: boom"),
        "lost": SweepEnd.lost("sweep_op", "run8", "is gone with 1 of 2 trials unfinished."),
    }
    operator, context = sweep_operator(trials=[]), fake_context(run_id="run8")
    event = ends[status].to_event()
    if status == "finished":
        summary = operator.execute_complete(context, event)
        assert (summary["total"], summary["best_value"], summary["run_key"]) == (2, 6.0, "run8")
        assert context["ti"].xcom["sweep"] == summary
        return
    match = (
        "driver of run run8 failed.*\n.*ValueError: boom"
        if status == "error"
        else "run run8 of experiment sweep_op is gone with 1 of 2"
    )
    with pytest.raises(SweepLostError, match=match):
        operator.execute_complete(context, event)
    assert context["ti"].xcom == {}


def wait_for(condition, what, timeout_s=120.0):
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_a_sweep_reattaches_to_its_driver_and_resumes_after_losing_it(
    trials_env, fake_context, tmp_path
):
    """Try 1 starts the driver; try 2 (its worker died) re-attaches to it, never starting another.
    The driver is then killed with two trials finished and two mid-run: the trigger reports it
    lost, and try 3's new driver runs only the unfinished two, from their checkpoints."""
    import ray

    from airflow_trials.experiment import trial_ids
    from airflow_trials.operators.sweep_operator import SweepLostError

    store = trials_env.store
    store.ensure_experiment("sweep_op", metric="score", mode="max")
    run_pk = store.create_experiment_run("sweep_op", "run1")
    gate = tmp_path / "gate"
    ids = trial_ids("sweep_op", "dag", "run1", 4)
    configs = [
        {"scale": 1.0},
        {"scale": 2.0},
        {"scale": 3.0, "hold_at": 2, "gate": str(gate)},
        {"scale": 4.0, "hold_at": 2, "gate": str(gate)},
    ]
    trials = [
        {"trial_id": i, "config": c, "experiment_run_id": run_pk}
        for i, c in zip(ids, configs, strict=True)
    ]
    operator = sweep_operator(trials=trials)

    with pytest.raises(TaskDeferred) as first:
        operator.execute(fake_context(run_id="run1", try_number=1))
    driver = ray.get_actor("sweep.sweep_op.run1", namespace=NAMESPACE)
    with pytest.raises(TaskDeferred) as second:
        operator.execute(fake_context(run_id="run1", try_number=2))
    assert live_drivers() == ["sweep.sweep_op.run1"]
    assert ray.get_actor("sweep.sweep_op.run1", namespace=NAMESPACE)._actor_id == driver._actor_id
    assert first.value.trigger.try_number == 1 and second.value.trigger.try_number == 2

    def progressed() -> bool:
        records = {r.trial_id: r for r in store.reader.list_trials(experiment_run_id=run_pk)}
        return (
            all(ids[i] in records and records[ids[i]].status.value == "TERMINATED" for i in (0, 1))
            and all(len(store.reader.get_results(ids[i])) == 1 for i in (2, 3) if ids[i] in records)
            and all(ids[i] in records for i in (2, 3))
        )

    wait_for(progressed, "two trials to finish and two to hold at iteration 2")
    finished_before = {i: store.reader.get_results(ids[i]) for i in (0, 1)}
    ray.kill(driver, no_restart=True)
    wait_for(lambda: live_trial_actors() == [], "the driver's trials to die with it")

    lost = first_event(second.value.trigger)
    assert lost["status"] == "lost" and "2 of 4 trials unfinished" in lost["error"]
    with pytest.raises(SweepLostError, match="resumes them from their latest checkpoints"):
        operator.execute_complete(fake_context(run_id="run1", try_number=2), lost)

    gate.touch()
    with pytest.raises(TaskDeferred) as third:
        operator.execute(fake_context(run_id="run1", try_number=3))
    context = fake_context(run_id="run1", try_number=3)
    summary = operator.execute_complete(context, first_event(third.value.trigger))
    assert (summary["total"], summary["terminated"], summary["errored"]) == (4, 4, 0)
    assert context["ti"].xcom["sweep"] == summary and summary["best_value"] == 12.0
    for i in (0, 1):  # not run again
        assert store.reader.get_results(ids[i]) == finished_before[i]
    for i in range(4):  # every result once; the held two resumed from their checkpoint at 1
        assert [r["training_iteration"] for r in store.reader.get_results(ids[i])] == [1, 2, 3]
        assert store.reader.get_trial(ids[i]).status.value == "TERMINATED"
    nothing_left_on_ray()


def test_a_stop_from_an_older_try_never_ends_the_sweep_a_newer_try_took_over(
    trials_env, fake_context, tmp_path
):
    """on_kill of try 1 (the task was cleared, say) may run after try 2 re-attached: it leaves the
    driver alone. A cleared task's stop waits for its next try to claim the driver, and is dropped
    when one does. A stop from the try that watches it stops the trials, keeping their results,
    and the driver ends itself."""
    import ray

    from airflow_trials.execution.driver.sweep_client import stop_driver
    from airflow_trials.experiment import trial_ids

    store = trials_env.store
    store.ensure_experiment("sweep_op", metric="score", mode="max")
    run_pk = store.create_experiment_run("sweep_op", "run2")
    ids = trial_ids("sweep_op", "dag", "run2", 2)
    held = {"scale": 1.0, "hold_at": 2, "gate": str(tmp_path / "never")}
    operator = sweep_operator(
        trials=[{"trial_id": i, "config": held, "experiment_run_id": run_pk} for i in ids]
    )
    for try_number in (1, 2):
        with pytest.raises(TaskDeferred):
            operator.execute(fake_context(run_id="run2", try_number=try_number))
    wait_for(
        lambda: (
            len(store.reader.list_trials(experiment_run_id=run_pk)) == 2
            and all(
                t.status.value == "RUNNING" and store.reader.get_results(t.trial_id)
                for t in store.reader.list_trials(experiment_run_id=run_pk)
            )
        ),
        "both trials to hold at iteration 2",
    )

    assert stop_driver("sweep_op", "run2", NAMESPACE, try_number=1) is False
    driver = ray.get_actor("sweep.sweep_op.run2", namespace=NAMESPACE)
    assert (
        ray.get(driver.request_stop.remote(2, 600.0)) is True
    )  # try 2's task cleared: a stop pending
    assert ray.get(driver.progress.remote())["stop_pending"] is True
    assert ray.get(driver.claim.remote(3)) == 3  # try 3 re-attached: the pending stop is dropped
    snapshot = ray.get(driver.progress.remote())
    assert (
        snapshot["stop_pending"] is False and snapshot["running"] == 2 and not snapshot["finished"]
    )

    assert stop_driver("sweep_op", "run2", NAMESPACE, try_number=3) is True
    nothing_left_on_ray()
    for trial_id in ids:
        assert store.reader.get_trial(trial_id).status.value == "TERMINATED"
        assert [r["training_iteration"] for r in store.reader.get_results(trial_id)] == [1]


def test_a_sweep_that_is_not_deferrable_watches_its_driver_from_the_worker(
    trials_env, fake_context
):
    from airflow_trials.experiment import trial_ids

    store = trials_env.store
    store.ensure_experiment("sweep_op", metric="score", mode="max")
    run_pk = store.create_experiment_run("sweep_op", "run3")
    trials = [
        {"trial_id": i, "config": {"scale": float(n)}, "experiment_run_id": run_pk}
        for n, i in enumerate(trial_ids("sweep_op", "dag", "run3", 2), start=1)
    ]
    context = fake_context(run_id="run3")
    summary = sweep_operator(trials=trials, deferrable=False).execute(
        context
    )  # no TaskDeferred: it blocks
    assert (summary["total"], summary["terminated"], summary["best_value"]) == (2, 2, 6.0)
    assert context["ti"].xcom["sweep"] == summary
    nothing_left_on_ray()


def test_under_a_triggerer_a_finished_sweep_ends_its_task_from_the_trigger(
    trials_env, fake_context, monkeypatch
):
    """Under a triggerer (its task instance set) a finished run pushes the task's XComs through
    the SDK, as a worker does, and yields TaskSuccessEvent, so no worker starts again only to push
    them; the summary is the one execute_complete returns. (The fault tests show it on the real
    triggerer, and that a downstream task pulls it as a dict.)"""
    from types import SimpleNamespace

    from airflow.sdk.execution_time import xcom
    from airflow.triggers.base import TaskSuccessEvent

    from airflow_trials.experiment import trial_ids
    from airflow_trials.triggers import trial_trigger as trial_trigger

    monkeypatch.setattr(trial_trigger, "MIN_DEFERRAL_SECONDS", 0.0)
    pushed = {}

    def record(key, value, **where):
        pushed[key] = (value, where)

    monkeypatch.setattr(
        xcom.XCom, "set", record
    )  # the triggerer's supervisor is not in this process
    store = trials_env.store
    store.ensure_experiment("sweep_op", metric="score", mode="max")
    run_pk = store.create_experiment_run("sweep_op", "run6")
    trials = [
        {"trial_id": i, "config": {"scale": float(n)}, "experiment_run_id": run_pk}
        for n, i in enumerate(trial_ids("sweep_op", "dag", "run6", 2), start=1)
    ]
    trials[1]["warm_start"] = {"run_key": "run5", "trial_id": "earlier"}
    with pytest.raises(TaskDeferred) as deferred:
        sweep_operator(trials=trials).execute(fake_context(run_id="run6"))
    trigger = deferred.value.trigger
    trigger.task_instance = SimpleNamespace(
        dag_id="dag", task_id="sweep", run_id="run6", map_index=-1, try_number=1, task=None
    )
    event = first_trigger_event(trigger)
    assert isinstance(event, TaskSuccessEvent) and not event.xcoms, event
    summary, where = pushed["sweep"]
    assert pushed["return_value"] == (summary, where)
    assert where == {"dag_id": "dag", "task_id": "sweep", "run_id": "run6", "map_index": -1}
    assert (summary["total"], summary["terminated"], summary["errored"], summary["best_value"]) == (
        2,
        2,
        0,
        6.0,
    )
    assert summary["run_key"] == "run6" and summary["warm_started_trials"] == 1
    nothing_left_on_ray()

    # A task with outlets ends in a worker: Airflow emits its asset events only there.
    from airflow.sdk import Asset

    run_pk = store.create_experiment_run("sweep_op", "run7")
    trials = [
        {
            "trial_id": trial_ids("sweep_op", "dag", "run7", 1)[0],
            "config": {"scale": 1.0},
            "experiment_run_id": run_pk,
        }
    ]
    with pytest.raises(TaskDeferred) as deferred:
        sweep_operator(trials=trials, outlets=[Asset("sweep_op_best")]).execute(
            fake_context(run_id="run7")
        )
    trigger = deferred.value.trigger
    trigger.task_instance = SimpleNamespace(
        dag_id="dag", task_id="sweep", run_id="run7", map_index=-1, try_number=1, task=None
    )
    event = first_trigger_event(trigger)
    assert type(event).__name__ == "TriggerEvent" and event.payload["status"] == "finished", event
    nothing_left_on_ray()


def test_clearing_a_deferred_sweep_leaves_its_run_to_the_next_try(
    trials_env, fake_context, tmp_path
):
    """The trigger's on_kill (a user cleared the task) asks for a stop that waits for a newer try;
    the next try's execute claims the driver, re-attaching to the live run."""
    import ray

    from airflow_trials.execution.driver.sweep_client import stop_driver
    from airflow_trials.experiment import trial_ids

    store = trials_env.store
    store.ensure_experiment("sweep_op", metric="score", mode="max")
    run_pk = store.create_experiment_run("sweep_op", "run4")
    held = {"scale": 1.0, "hold_at": 2, "gate": str(tmp_path / "never")}
    operator = sweep_operator(
        trials=[
            {"trial_id": i, "config": held, "experiment_run_id": run_pk}
            for i in trial_ids("sweep_op", "dag", "run4", 1)
        ]
    )
    with pytest.raises(TaskDeferred) as deferred:
        operator.execute(fake_context(run_id="run4", try_number=1))
    driver = ray.get_actor("sweep.sweep_op.run4", namespace=NAMESPACE)
    asyncio.run(deferred.value.trigger.on_kill())
    assert ray.get(driver.progress.remote())["stop_pending"] is True
    with pytest.raises(TaskDeferred):
        operator.execute(fake_context(run_id="run4", try_number=2))  # the cleared task's next try
    assert ray.get(driver.progress.remote())["stop_pending"] is False and live_drivers() == [
        "sweep.sweep_op.run4"
    ]
    assert stop_driver("sweep_op", "run4", NAMESPACE, try_number=2) is True
    nothing_left_on_ray()
