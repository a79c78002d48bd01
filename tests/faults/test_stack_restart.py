"""Case 7: the whole Airflow stack is stopped mid-run (SIGTERM to scheduler, dag-processor,
triggerer and api-server at once, as Ctrl-C on ``airflow-trials run --keep-running``) while Ray
stays up, and started again.

The trials train on while Airflow is down; the new stack picks their tasks up where they were and
the experiment finishes with every result stored once and no trial restarted.
"""

from __future__ import annotations

import time

import pytest

from tests.faults.stack import AIRFLOW_COMPONENTS
from tests.faults.trainables import read_journal

pytestmark = pytest.mark.timeout(900)


def test_stack_stopped_mid_run_and_started_again_loses_nothing(stack, experiment):
    run = experiment("faults_stack_restart", trials=3, max_failures=0)
    run.trigger()
    run.wait_until_trials_deferred()
    exit_codes = stack.stop()
    stopped_at = time.time()
    assert set(exit_codes) == set(AIRFLOW_COMPONENTS)
    assert None not in exit_codes.values(), f"a component did not stop on SIGTERM: {exit_codes}"
    run.open_gate()
    # The trials train on with Airflow down.
    stack.wait_for(
        lambda: all(
            any(
                t > stopped_at
                for inc in read_journal(run.journal_dir, trial_id)
                for t in inc.beat_times
            )
            for trial_id in run.trial_ids
        ),
        120,
        "every trial to train on while Airflow is down",
    )
    stack.start()
    assert run.finish() == "success"

    run.assert_no_lost_results()
    for trial_id, incarnations in run.assert_no_duplicate_trial().items():
        assert len(incarnations) == 1, (trial_id, incarnations)  # nothing was restarted
    run.assert_trials_end("TERMINATED")
    run.assert_tasks_end()
    run.assert_experiment_run("SUCCESS")
    stack.assert_triggerer_responsive(since=run.triggered_at)
    for ti in run.trial_tis():
        assert f"Trial {run.trial_ids[ti['map_index']]} finished" in run.log(ti)
