"""Case 2: a trial task's process dies mid-``execute``, and trial tasks are cleared through the
REST API while deferred and after they finished.

Whatever happens to the task, its trial has at most one copy on Ray at a time, resumes from its
latest checkpoint, and ends TERMINATED with every result stored once.
"""

from __future__ import annotations

import signal
import time

import pytest

from tests.faults.conftest import HOLD_AT, on_ray

pytestmark = pytest.mark.timeout(900)


def test_task_process_killed_mid_execute_is_retried_without_a_second_copy(stack, experiment):
    run = experiment("faults_task_killed", trials=2, max_failures=1)
    run.trigger()
    target = run.trial_ids[0]

    def task_process():
        ti = run.trial_ti(0)
        return ti and ti["state"] == "running" and stack.task_processes(ti["id"])

    (proc,) = stack.wait_for(task_process, 300, f"the task process of trial {target}")
    # Freeze it the moment its execute has asked Ray for the trial's placement group: between
    # that and the actor's creation is where a dead task used to leave an orphan behind.
    stack.wait_for(
        lambda: "placement_group" in on_ray(run.actor_name(target)),
        300,
        f"the placement group of trial {target}",
        interval_s=0.02,
    )
    proc.send_signal(signal.SIGSTOP)
    proc.kill()
    proc.wait(timeout=60)
    time.sleep(1)  # an actor creation the process sent before it froze reaches the GCS
    left_behind = on_ray(run.actor_name(target))

    run.wait_for_trial_ti(0, "deferred", 2)
    run.open_gate()
    assert run.finish() == "success"

    run.assert_no_lost_results()
    run.assert_no_duplicate_trial()
    run.assert_trials_end("TERMINATED")
    run.assert_tasks_end(tries={0: ["failed", "success"]})
    run.assert_experiment_run("SUCCESS")
    stack.assert_triggerer_responsive(since=run.triggered_at)
    assert "Process terminated by signal" in run.log(run.trial_ti(0), try_number=1)
    retry_log = run.log_once_it_says(0, 2, f"Trial {target} finished")
    if "actor" in left_behind:
        assert f"Trial {target} is RUNNING on Ray already; re-attaching to it." in retry_log or (
            f"Trial {target} is QUEUED on Ray already; re-attaching to it." in retry_log
        ), retry_log
    else:  # only the placement group: the retry removes it and starts the trial
        assert "left by a process that died before it started the trial's actor" in retry_log, (
            retry_log
        )
        assert f"Started trial {target}" in retry_log, retry_log
    assert f"Trial {target} finished" in retry_log, retry_log


def test_cleared_trial_tasks_stop_their_trial_and_run_it_again(stack, experiment):
    run = experiment("faults_task_cleared", trials=2, max_failures=0)
    run.trigger()
    run.wait_until_trials_deferred()
    deferred = run.trial_ids[0]

    # Clearing a deferred task ends its try. Its trigger's on_kill stops the trial on Ray, and the
    # new try resumes it from its checkpoint; unless the new try registered first (Airflow does not
    # wait for on_kill), in which case on_kill leaves the trial to it and the new try re-attaches.
    cleared_at = time.time()
    stack.clear(run.dag_id, run.run_id, run.trial_task, 0)
    run.wait_for_trial_ti(0, "deferred", 2)
    run.open_gate()
    assert run.finish() == "success"
    incarnations = run.assert_no_duplicate_trial()[deferred]
    retry_log = run.log(run.trial_ti(0), try_number=2)
    trigger_log = run.log(run.trial_ti(0), try_number=1)  # with its trigger's lines
    if len(incarnations) == 1:  # the new try took the live trial over
        assert "a later try took the trial over, leaving it running" in trigger_log, trigger_log
        assert f"Trial {deferred} is RUNNING on Ray already; re-attaching to it." in retry_log, (
            retry_log
        )
    else:
        first, second = incarnations
        assert not first.ended and first.last_seen < second.started, (first, second)
        assert second.started > cleared_at and second.resumed_from >= HOLD_AT, second
        assert f"Trial {deferred} resumes from checkpoint" in retry_log, retry_log

    run.assert_no_lost_results()
    run.assert_trials_end("TERMINATED")
    run.assert_tasks_end(tries={0: ["failed", "success"]})  # try 1 is recorded failed when cleared
    run.assert_experiment_run("SUCCESS")
    stack.assert_triggerer_responsive(since=run.triggered_at)


def test_clearing_a_finished_trial_task_runs_its_trial_again(stack, experiment):
    run = experiment("faults_finished_cleared", trials=1, hold_at=0)
    run.trigger()
    assert run.finish() == "success"
    (trial_id,) = run.trial_ids
    cleared_at = time.time()
    stack.clear(run.dag_id, run.run_id, run.trial_task, 0)
    run.wait_for_trial_ti(0, "success", 2)
    assert run.finish() == "success"

    first, again = run.assert_no_duplicate_trial()[trial_id]
    assert again.started > cleared_at, again
    run.assert_no_lost_results()
    run.assert_trials_end("TERMINATED")
    run.assert_tasks_end(tries={0: ["success", "success"]})
    assert f"Started trial {trial_id}" in run.log(run.trial_ti(0), try_number=2)
