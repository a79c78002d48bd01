"""Sweeps on the real stack: the whole experiment in one task, its driver a detached named actor.

Case 1: the triggerer is SIGKILLed while the sweep runs deferred, and a new one starts once every
trial has trained on unwatched: the new trigger re-attaches to the same driver (one driver only)
and the sweep task ends on its first try, with every result once.

Case 2: the experiment's second run, warm-started from the first (``WarmStart(top_k=1)``): its
first trial is the first run's best config, and says so. Its driver is killed mid-run (with it,
its trials): the trigger reports it lost, the task's retry starts a new driver, which resumes each
trial from its latest checkpoint.

Case 3: a sweep whose searcher (OptunaSearch, in the driver) chose every config loses its driver
with every trial mid-run: the next driver runs them on with the configs they were asked for.

Case 4: an experiment of more trials than a mapped task may have is refused when the
dag-processor parses it, naming both numbers and ``sweep=True``.
"""

from __future__ import annotations

import time

import pytest

from tests.faults.trainables import read_journal

pytestmark = pytest.mark.timeout(900)

DAG_ID = "faults_sweep"
WARM = "WarmStart(top_k=1)"


def sweep_drivers() -> list[str]:
    import ray

    return [
        e["name"]
        for e in ray.util.list_named_actors(all_namespaces=True)
        if e["name"].startswith("sweep.")
    ]


def driver(run):
    import ray

    return ray.get_actor(f"sweep.{run.dag_id}.{run.run_id}", namespace="airflow_trials")


def finished_runs(run) -> list:
    store = run.store()
    try:
        return [
            r for r in store.reader.list_experiment_runs(run.dag_id) if r.status.value == "SUCCESS"
        ]
    finally:
        store.dispose()


def test_a_sweep_survives_a_killed_triggerer_with_one_driver(stack, experiment):
    run = experiment(DAG_ID, trials=3, max_failures=0, sweep=True, warm_start=WARM)
    run.trigger()  # the experiment's first run: a cold start, with a warning
    run.wait_until_trials_deferred()  # held mid-run, the sweep watched by its trigger
    driver_id = driver(run)._actor_id.hex()
    stack.kill("triggerer")
    killed_at = time.time()
    run.open_gate()
    stack.wait_for(
        lambda: all(
            any(
                t > killed_at
                for inc in read_journal(run.journal_dir, trial_id)
                for t in inc.beat_times
            )
            for trial_id in run.trial_ids
        ),
        120,
        "every trial to train on with no triggerer",
    )
    assert (
        sweep_drivers() == [f"sweep.{run.dag_id}.{run.run_id}"]
        and driver(run)._actor_id.hex() == driver_id
    )
    stack.start("triggerer")

    assert run.finish() == "success"
    run.assert_no_lost_results()
    for incarnations in run.assert_no_duplicate_trial().values():
        assert len(incarnations) == 1  # nothing restarted: the driver ran on with no triggerer
    run.assert_trials_end("TERMINATED")
    run.assert_tasks_end()  # the sweep task on its first try
    run.assert_experiment_run("SUCCESS")
    stack.wait_for(
        lambda: sweep_drivers() == [],
        60,
        "the driver, killed by the trigger once it read its end, to go",
    )
    (ti,) = run.trial_tis()
    log = run.log(ti)
    assert (
        "Started the sweep driver" in log
        and "3 trials: 3 done, 0 running, 0 pending; best score=36" in log
    ), log
    # The trigger ended the task (TaskSuccessEvent): its XComs are the summary, and no second worker
    # start.
    assert f"Sweep {run.run_id} ended: 3 trials TERMINATED, 0 ERROR; best score=36" in log, log
    assert "Pausing task as DEFERRED" in log and log.count("Worker startup parse complete") == 1, (
        log
    )
    summary = run.stack.xcom(run.dag_id, run.run_id, ti["task_id"], "sweep")
    assert isinstance(summary, dict), summary  # stored as a worker stores it: a task pulls a dict
    assert summary == run.stack.xcom(run.dag_id, run.run_id, ti["task_id"], "return_value"), summary
    assert (summary["total"], summary["terminated"], summary["errored"], summary["best_value"]) == (
        3,
        3,
        0,
        36,
    ), summary
    assert summary["run_key"] == run.run_id and summary["warm_started_trials"] == 0, summary
    suggest = run.stack.task_log(run.dag_id, run.run_id, f"{run.dag_id}.suggest_configs", 1)
    assert "has no earlier successful run of DAG faults_sweep; this run starts cold" in suggest, (
        suggest
    )


def test_a_warm_started_sweep_whose_driver_is_killed_resumes_on_the_tasks_retry(stack, experiment):
    import ray

    run = experiment(DAG_ID, trials=3, max_failures=0, sweep=True, warm_start=WARM)
    if not finished_runs(run):  # run alone: give it the first run to warm-start from
        run.open_gate()
        run.trigger()
        assert run.finish() == "success"
    (source,) = finished_runs(run)[-1:]
    run.close_gate()
    run.trigger()
    run.wait_until_trials_deferred()
    ray.kill(driver(run), no_restart=True)
    run.open_gate()

    assert run.finish() == "success"
    run.assert_no_lost_results()
    journals = run.assert_no_duplicate_trial()
    for trial_id, incarnations in journals.items():
        # Killed with the driver while held; resumed by the next driver from its checkpoint.
        assert len(incarnations) == 2 and incarnations[1].resumed_from >= 1, (
            trial_id,
            incarnations,
        )
    records = run.assert_trials_end("TERMINATED")
    run.assert_tasks_end(tries={-1: ["failed", "success"]})
    run.assert_experiment_run("SUCCESS")
    stack.wait_for(lambda: sweep_drivers() == [], 60, "the second driver to go")
    first = records[run.trial_ids[0]]
    assert (
        first.warm_start["run_key"] == source.run_key and first.config["x"] == 3
    )  # run 1's best: score 36
    assert all(records[t].warm_start is None for t in run.trial_ids[1:])
    (ti,) = run.trial_tis()
    assert "gone" in run.log(ti, try_number=1) and "Started the sweep driver" in run.log(
        ti, try_number=2
    )


def test_a_searched_sweep_whose_driver_is_killed_keeps_every_asked_config(stack, experiment):
    """OptunaSearch in the driver chose each trial's config; the driver is killed with every trial
    held mid-run. The retry's driver runs each trial on from its checkpoint with the config it was
    asked for, asking the searcher for none: no trial changes its config, none runs twice."""
    import ray

    run = experiment(
        "faults_sweep_search",
        trials=3,
        max_failures=0,
        sweep=True,
        search_alg="OptunaSearch(seed=0)",
    )
    run.trigger()
    run.wait_until_trials_deferred()
    store = run.store()
    try:
        asked = {trial_id: store.reader.get_trial(trial_id).config for trial_id in run.trial_ids}
    finally:
        store.dispose()
    assert len({config["x"] for config in asked.values()}) == 3 and all(
        1.0 <= c["x"] <= 3.0 for c in asked.values()
    )
    ray.kill(driver(run), no_restart=True)
    run.open_gate()

    assert run.finish() == "success"
    run.assert_no_lost_results()
    for trial_id, incarnations in run.assert_no_duplicate_trial().items():
        assert len(incarnations) == 2 and incarnations[1].resumed_from >= 1, (
            trial_id,
            incarnations,
        )
    records = run.assert_trials_end("TERMINATED")
    assert {trial_id: record.config for trial_id, record in records.items()} == asked
    run.assert_tasks_end(tries={-1: ["failed", "success"]})
    run.assert_experiment_run("SUCCESS")
    stack.wait_for(lambda: sweep_drivers() == [], 60, "the second driver to go")


def test_more_trials_than_a_mapped_task_may_have_are_refused_when_the_dag_is_parsed(stack):
    path = stack.write_dag(
        "faults_too_many.py",
        """
import datetime
from airflow.sdk import DAG
from airflow_trials.core.search import uniform
from airflow_trials.experiment import tuning_experiment

with DAG("faults_too_many", schedule=None, start_date=datetime.datetime(2026, 1, 1), catchup=False):
    tuning_experiment(experiment_name="faults_too_many",
                      trainable="tests.faults.trainables:journaled",
                      search_space={"x": uniform(0, 1)}, num_samples=2000, metric="score",
                      mode="max")
""",
    )

    def refused() -> str | None:
        errors = stack.api("GET", "/importErrors")["import_errors"]
        return next(
            (e["stack_trace"] for e in errors if e["filename"].endswith("faults_too_many.py")), None
        )

    try:
        trace = stack.wait_for(refused, 300, "the dag-processor to refuse faults_too_many.py")
    finally:
        path.unlink()  # the cases after this one share the stack
    assert (
        "num_samples 2000 is 2000 trials, more than 1024, the most one mapped task may have "
        "(Airflow's [core] "
        "max_map_length); pass sweep=True to run them all in one sweep task, raise [core] "
        "max_map_length to "
        "at least 2000, or ask for at most 1024 samples."
    ) in trace, trace
