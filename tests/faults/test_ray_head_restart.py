"""Case 4: the Ray head dies mid-run (every process of it SIGKILLed) and a new head starts at the
same address 15 s, or 45 s, later.

The triggerer survives (same PID); each trial task says its trial was lost with the cluster and
resumes it on the new head from its latest checkpoint on the shared storage, in an Airflow retry
that does not spend one of its ``max_failures`` (0 here): a lost cluster is not the trial's failure.
Nothing hangs.
"""

from __future__ import annotations

import re
import time

import pytest

from tests.faults.conftest import HOLD_AT

pytestmark = pytest.mark.timeout(900)

# What a trial task says when its trial went down with the Ray cluster (the trigger's words).
CLUSTER_LOST = re.compile(
    r"Ray cluster restarted|Ray did not answer|Ray cluster it was launched on is gone|NODE_DIED"
)


@pytest.mark.parametrize("outage_s", [15, 45])
def test_trials_resume_on_a_restarted_ray_head_from_their_latest_checkpoint(
    stack, experiment, outage_s
):
    run = experiment(f"faults_ray_restart_{outage_s}", trials=2, max_failures=0)
    run.trigger()
    run.wait_until_trials_deferred()
    triggerer = stack.pid("triggerer")
    stack.ray.kill()
    killed_at = time.time()
    time.sleep(outage_s)
    assert stack.is_running("triggerer") and stack.pid("triggerer") == triggerer, (
        "the triggerer died with Ray"
    )
    stack.ray.start()
    run.open_gate()
    assert run.finish() == "success"

    assert stack.is_running("triggerer") and stack.pid("triggerer") == triggerer
    run.assert_no_lost_results()
    for trial_id, (lost, resumed) in run.assert_no_duplicate_trial().items():
        assert not lost.ended and lost.last_seen <= killed_at, (trial_id, lost)
        assert resumed.resumed_from == HOLD_AT, (
            trial_id,
            resumed,
        )  # from the checkpoint on storage
    records = run.assert_trials_end("TERMINATED")
    assert {t: r.num_failures for t, r in records.items()} == dict.fromkeys(run.trial_ids, 0)
    run.assert_experiment_run("SUCCESS")
    stack.assert_triggerer_responsive(since=run.triggered_at)
    for ti in run.trial_tis():
        tries = stack.tries(run.dag_id, run.run_id, run.trial_task, ti["map_index"])
        # The loss fails the try (not the trial), and Airflow's retry resumes it.
        assert [t["state"] for t in tries] == ["failed"] * (len(tries) - 1) + ["success"], tries
        logs = "\n".join(run.log(ti, try_number=n) for n in range(1, ti["try_number"] + 1))
        assert CLUSTER_LOST.search(logs), logs
        assert "Not a failure of the trial: Airflow retries this task" in logs, logs
        assert f"Trial {run.trial_ids[ti['map_index']]} resumes from checkpoint" in logs, logs
