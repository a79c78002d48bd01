"""Early-stopping schedulers on the TrialRunner path, on a real local Ray."""

from __future__ import annotations

import json
import os

from airflow_trials import ASHAScheduler, HyperBandScheduler, Trial, TrialRunner, TrialStatus


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


def test_hyperband_pauses_trials_at_their_milestone_and_halves_the_bracket(ray_cluster, storage):
    # max_t=4, reduction_factor=2: as in Ray Tune, round 1 fills bracket 1 (3 trials, milestone 4)
    # first, then bracket 2 (3 trials, milestone 2). Each trial takes both CPUs, so one runs at a
    # time and the order is HyperBand's alone. A trial that reaches its milestone is paused
    # (checkpointed, its CPUs freed) until its bracket's others get there; then the bracket is
    # halved: the best resume from their checkpoints, the worst stop. When the last trial of a
    # bracket ends, HyperBand stops the paused ones, which the runner carries out.
    scheduler = HyperBandScheduler(metric="score", mode="max", max_t=4, reduction_factor=2)
    runner = TrialRunner(
        "exp", storage_path=storage, scheduler=scheduler, stop={"training_iteration": 20}, wait_timeout_s=10.0
    )
    scales = {"a": 1.0, "b": 0.8, "c": 0.6, "d": 0.9, "e": 0.5, "f": 0.1}
    for trial_id, scale in scales.items():
        runner.add_trial(Trial("tests.trainables:counting", {"scale": scale}, trial_id=trial_id,
                               experiment_name="exp", resources={"cpu": 2}))

    trials = {trial.trial_id: trial for trial in runner.run()}

    assert {t.trial_id: (t.status, t.error_msg) for t in trials.values()} == {
        name: (TrialStatus.TERMINATED, None) for name in scales
    }
    # d and e were paused at iteration 2 and resumed from their checkpoints: no result twice.
    assert {name: [r["training_iteration"] for _, r in runner.results(name)] for name in trials} == {
        **{name: [1, 2, 3, 4] for name in "abcde"}, "f": [1, 2],
    }
    assert trials["f"].stop_reason == (
        "stopped by HyperBand at training_iteration=2 (round 1, bracket 2, milestone 2): score 0.2 "
        "ranked 3 of 3, and only the best 2 go on"
    )
    for name, bracket in (("a", 1), ("b", 1), ("d", 2)):  # paused at max_t, stopped with their bracket
        assert trials[name].stop_reason == (
            f"stopped by HyperBand at training_iteration=4: its bracket (round 1, bracket {bracket}) "
            f"reached its last milestone, 4"
        ), name
