"""Early-stopping schedulers on the TrialRunner path, on a real local Ray."""

from __future__ import annotations

import json
import os

from airflow_trials import ASHAScheduler, Trial, TrialRunner, TrialStatus


def test_asha_stops_the_worse_trials_at_their_rung_while_the_best_runs_to_max_t(ray_cluster, storage):
    # Rungs at iterations 2, 4 and 8. Each trial takes both CPUs, so they run one after another,
    # best first: every decision depends on the scores alone, never on which result came first.
    scheduler = ASHAScheduler(metric="score", mode="max", max_t=8, grace_period=2, reduction_factor=2)
    runner = TrialRunner(
        "exp", storage_path=storage, scheduler=scheduler, stop={"training_iteration": 20}, wait_timeout_s=10.0
    )
    for trial_id, scale in (("best", 1.0), ("mid", 0.5), ("worst", 0.1)):
        runner.add_trial(Trial("tests.trainables:counting", {"scale": scale}, trial_id=trial_id,
                               experiment_name="exp", resources={"cpu": 2}))

    trials = {trial.trial_id: trial for trial in runner.run()}

    assert {t.trial_id: (t.status, t.error_msg) for t in trials.values()} == {
        name: (TrialStatus.TERMINATED, None) for name in ("best", "mid", "worst")
    }
    assert {name: [r["training_iteration"] for _, r in runner.results(name)][-1] for name in trials} == {
        "best": 8, "mid": 2, "worst": 2,
    }
    assert trials["best"].stop_reason == "stopped by ASHA at training_iteration=8: it reached max_t=8"
    assert trials["mid"].stop_reason == (
        "stopped by ASHA at training_iteration=2 (rung 1 of 3): score 1 below the rung's cutoff 2"
    )
    assert trials["worst"].stop_reason == (
        "stopped by ASHA at training_iteration=2 (rung 1 of 3): score 0.2 below the rung's cutoff 1.5"
    )
    with open(os.path.join(storage, "exp", "worst", "trial.json")) as f:
        assert json.load(f)["stop_reason"] == trials["worst"].stop_reason
