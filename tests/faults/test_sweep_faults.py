"""Sweeps on the real stack: the whole experiment in one task, its driver a detached named actor.

Case 1: the triggerer is SIGKILLed while the sweep runs deferred, and a new one starts once every
trial has trained on unwatched: the new trigger re-attaches to the same driver (one driver only)
and the sweep task ends on its first try, with every result once.

Case 2: the driver is killed mid-run (with it, its trials): the trigger reports it lost, the
task's retry starts a new driver, which resumes each trial from its latest checkpoint.
"""

from __future__ import annotations

import time

import pytest

from tests.faults.trainables import read_journal

pytestmark = pytest.mark.timeout(900)


def sweep_drivers() -> list[str]:
    import ray

    return [e["name"] for e in ray.util.list_named_actors(all_namespaces=True) if e["name"].startswith("sweep.")]


def driver_id(run) -> str:
    import ray

    return ray.get_actor(f"sweep.{run.dag_id}.{run.run_id}", namespace="airflow_trials")._actor_id.hex()


def test_a_sweep_survives_a_killed_triggerer_with_one_driver(stack, experiment):
    run = experiment("faults_sweep_triggerer", trials=3, max_failures=0, sweep=True)
    run.trigger()
    run.wait_until_trials_deferred()  # held mid-run, the sweep watched by its trigger
    driver = driver_id(run)
    stack.kill("triggerer")
    killed_at = time.time()
    run.open_gate()
    stack.wait_for(lambda: all(any(t > killed_at for inc in read_journal(run.journal_dir, trial_id)
                                   for t in inc.beat_times) for trial_id in run.trial_ids),
                   120, "every trial to train on with no triggerer")
    assert sweep_drivers() == [f"sweep.{run.dag_id}.{run.run_id}"] and driver_id(run) == driver
    stack.start("triggerer")

    assert run.finish() == "success"
    run.assert_no_lost_results()
    for incarnations in run.assert_no_duplicate_trial().values():
        assert len(incarnations) == 1  # nothing restarted: the driver ran on with no triggerer
    run.assert_trials_end("TERMINATED")
    run.assert_tasks_end()  # the sweep task on its first try
    run.assert_experiment_run("SUCCESS")
    stack.wait_for(lambda: sweep_drivers() == [], 60, "the driver, killed by the trigger once it read its end, to go")
    (ti,) = run.trial_tis()
    log = run.log(ti)
    assert "Started the sweep driver" in log and "3 trials: 3 done, 0 running, 0 pending; best score=36" in log, log


def test_a_sweep_whose_driver_is_killed_resumes_on_the_tasks_retry(stack, experiment):
    import ray

    run = experiment("faults_sweep_driver_killed", trials=3, max_failures=0, sweep=True)
    run.trigger()
    run.wait_until_trials_deferred()
    ray.kill(ray.get_actor(f"sweep.{run.dag_id}.{run.run_id}", namespace="airflow_trials"), no_restart=True)
    run.open_gate()

    assert run.finish() == "success"
    run.assert_no_lost_results()
    journals = run.assert_no_duplicate_trial()
    for trial_id, incarnations in journals.items():
        # Killed with the driver while held; resumed by the next driver from its checkpoint.
        assert len(incarnations) == 2 and incarnations[1].resumed_from >= 1, (trial_id, incarnations)
    run.assert_trials_end("TERMINATED")
    run.assert_tasks_end(tries={-1: ["failed", "success"]})
    run.assert_experiment_run("SUCCESS")
    stack.wait_for(lambda: sweep_drivers() == [], 60, "the second driver to go")
    (ti,) = run.trial_tis()
    assert "gone" in run.log(ti, try_number=1) and "Started the sweep driver" in run.log(ti, try_number=2)
