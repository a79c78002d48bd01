"""Case 1: the triggerer is SIGKILLed while the trials run deferred, and a new one starts once
every trial has trained on unwatched.

The trials keep training on Ray with nobody watching; the new triggerer re-attaches to them,
stores what they reported meanwhile, and every task ends on its first try.
"""

from __future__ import annotations

import time

import pytest

from tests.faults.trainables import read_journal

pytestmark = pytest.mark.timeout(900)


def test_killed_triggerer_is_replaced_and_no_trial_is_lost_or_duplicated(stack, experiment):
    run = experiment("faults_triggerer_restart", trials=3, max_failures=0)
    run.trigger()
    run.wait_until_trials_deferred()  # held mid-run, each watched by its trigger
    old_pid = stack.pid("triggerer")
    stack.kill("triggerer")
    killed_at = time.time()
    run.open_gate()
    # The trials train on with no triggerer: every one reports again before a new one starts.
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
    restarted_at = time.time()
    stack.start("triggerer")

    assert run.finish() == "success"
    assert stack.pid("triggerer") != old_pid
    run.assert_no_lost_results()
    journals = run.assert_no_duplicate_trial()
    for trial_id, incarnations in journals.items():
        # One incarnation each: the kill restarted nothing, and the trial trained on unwatched.
        (incarnation,) = incarnations
        unwatched = [t for t in incarnation.beat_times if killed_at < t < restarted_at]
        assert unwatched, (trial_id, incarnation)
    run.assert_trials_end("TERMINATED")
    run.assert_tasks_end()
    run.assert_experiment_run("SUCCESS")
    stack.assert_triggerer_responsive(since=run.triggered_at)
    for ti in run.trial_tis():
        log = run.log(ti)
        assert f"Started trial {run.trial_ids[ti['map_index']]}" in log, log
        assert f"Trial {run.trial_ids[ti['map_index']]} finished" in log, log
