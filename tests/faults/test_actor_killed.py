"""Case 3: a trial's actor is killed on Ray (``ray.kill``) while it trains.

With ``max_failures=1`` the loss costs the trial one failure: its task fails its try, and the
retry resumes the trial from its latest checkpoint, with every result stored once.
"""

from __future__ import annotations

import time

import pytest

from tests.faults.conftest import HOLD_AT
from tests.faults.stack import NAMESPACE, actor_dead

pytestmark = pytest.mark.timeout(900)


def test_killed_trial_actor_is_retried_from_its_latest_checkpoint(stack, experiment):
    import ray

    run = experiment("faults_actor_killed", trials=2, max_failures=1)
    run.trigger()
    run.wait_until_trials_deferred()
    target = run.trial_ids[0]
    actor = ray.get_actor(run.actor_name(target), namespace=NAMESPACE)
    ray.kill(actor, no_restart=True)
    # The kill lands a moment after ray.kill returns: the bound on the killed incarnation's last
    # heartbeat is when Ray reports the actor dead, not when the kill was sent.
    stack.wait_for(lambda: actor_dead(actor), 120, f"the actor of trial {target} to be dead")
    dead_at = time.time()
    run.wait_for_trial_ti(0, "deferred", 2)
    run.open_gate()
    assert run.finish() == "success"

    run.assert_no_lost_results()
    killed, retried = run.assert_no_duplicate_trial()[target]
    assert not killed.ended and killed.last_seen <= dead_at, killed
    # Held at HOLD_AT when killed: the retry starts right after that checkpoint.
    assert retried.resumed_from == HOLD_AT and retried.iterations[0] == HOLD_AT + 1, retried
    records = run.assert_trials_end("TERMINATED")
    assert [records[t].num_failures for t in run.trial_ids] == [1, 0]
    run.assert_tasks_end(tries={0: ["failed", "success"]})
    run.assert_experiment_run("SUCCESS")
    stack.assert_triggerer_responsive(since=run.triggered_at)
    failed_log = run.log(run.trial_ti(0), try_number=1)
    assert (
        f"Trial {target} of experiment {run.dag_id} failed: its Ray actor died while it ran"
        in failed_log
    ), failed_log
    assert "will retry from its latest checkpoint" in failed_log, failed_log
    assert f"Trial {target} resumes from checkpoint" in run.log(run.trial_ti(0), try_number=2)
