"""A trial's output and progress in its task's log (the trigger's log), and its log files kept on
the experiment's storage after it ends, on a real local Ray and a real SQLite trials store.

Airflow 3.3's trigger logger is a structlog logger that does not go through the stdlib's logging
(so pytest's ``caplog`` never sees it); ``structlog.testing.capture_logs`` captures exactly what
the triggerer would write to the task instance's log.
"""

from __future__ import annotations

import os

import structlog

from airflow_trials.triggers.trial_trigger import TrialTrigger

CHATTY = "tests.trainables:chatty"


def launch(trials_env, trial_id):
    from airflow_trials import Trial
    from airflow_trials.execution.driver.actor_client import TrialActorClient

    trials_env.store.upsert_trial(
        trial_id, trainable=CHATTY, config={}, resources={"cpu": 0.1}, max_failures=0
    )
    trial = Trial(CHATTY, {}, trial_id=trial_id, experiment_name="logs", resources={"cpu": 0.1})
    TrialActorClient(trials_env.storage).launch(trial)


async def watch_to_the_end(trial_id):
    with structlog.testing.capture_logs() as logs:
        event = await TrialTrigger("logs", trial_id, poll_interval_seconds=0.1).run().asend(None)
    # A poll's lines of one kind are one log event (TaskLogEcho), one line each in it.
    return event.payload, [line for r in logs for line in str(r["event"]).splitlines()]


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


async def test_the_task_log_shows_output_and_progress_and_the_files_outlive_the_node(trials_env):
    trial_id = "chatty"
    launch(trials_env, trial_id)
    payload, messages = await watch_to_the_end(trial_id)
    assert payload["status"] == "TERMINATED", payload
    printed = f"[trial stdout] hello from trial {trial_id}"
    progress = f"Trial {trial_id} iteration 1: score=1"
    assert printed in messages and "[trial stderr] a warning on stderr" in messages, messages
    assert messages.count(progress) == 1, messages  # one line per result, logged once
    assert messages.index(printed) < messages.index(progress)  # printed before it reported
    logs_dir = os.path.join(trials_env.storage, "logs", trial_id, "logs")
    assert f"hello from trial {trial_id}\n" in read(os.path.join(logs_dir, "stdout.log"))
    assert "a warning on stderr\n" in read(os.path.join(logs_dir, "stderr.log"))
    assert any(
        m.startswith(f"Trial {trial_id}: its full stdout and stderr are saved at") and logs_dir in m
        for m in messages
    ), messages


async def test_logs_that_cannot_be_copied_never_fail_the_trial(trials_env):
    trial_id = "chatty-blocked"
    blocked = os.path.join(trials_env.storage, "logs", trial_id, "logs")
    os.makedirs(os.path.dirname(blocked))
    with open(blocked, "w") as f:  # a file where the logs directory should go
        f.write("in the way")
    launch(trials_env, trial_id)
    payload, messages = await watch_to_the_end(trial_id)
    assert payload["status"] == "TERMINATED", payload
    assert [r["score"] for r in trials_env.store.reader.get_results(trial_id)] == [1.0]
    warnings = [m for m in messages if "could not copy its stdout/stderr" in m]
    assert len(warnings) == 1 and trial_id in warnings[0] and blocked in warnings[0], messages
