"""Early-stopping schedulers on the TrialRunner path, on a real local Ray."""

from __future__ import annotations

import json
import os
import random

import pytest

from airflow_trials import (
    ASHAScheduler,
    HyperBandScheduler,
    PopulationBasedTraining,
    Trial,
    TrialRunner,
    TrialStatus,
)


def test_asha_stops_the_worse_trials_at_their_rung_while_the_best_runs_to_max_t(
    ray_cluster, storage
):
    # Rungs at iterations 2, 4 and 8. Each trial takes both CPUs, so they run one after another,
    # best first: every decision depends on the scores alone, never on which result came first.
    scheduler = ASHAScheduler(
        metric="score", mode="max", max_t=8, grace_period=2, reduction_factor=2
    )
    runner = TrialRunner(
        "exp",
        storage_path=storage,
        scheduler=scheduler,
        stop={"training_iteration": 20},
        wait_timeout_s=10.0,
    )
    for trial_id, scale in (("best", 1.0), ("mid", 0.5), ("worst", 0.1)):
        runner.add_trial(
            Trial(
                "tests.trainables:counting",
                {"scale": scale},
                trial_id=trial_id,
                experiment_name="exp",
                resources={"cpu": 2},
            )
        )

    trials = {trial.trial_id: trial for trial in runner.run()}

    assert {t.trial_id: (t.status, t.error_msg) for t in trials.values()} == {
        name: (TrialStatus.TERMINATED, None) for name in ("best", "mid", "worst")
    }
    assert {
        name: [r["training_iteration"] for _, r in runner.results(name)][-1] for name in trials
    } == {
        "best": 8,
        "mid": 2,
        "worst": 2,
    }
    assert (
        trials["best"].stop_reason == "stopped by ASHA at training_iteration=8: it reached max_t=8"
    )
    assert trials["mid"].stop_reason == (
        "stopped by ASHA at training_iteration=2 (rung 1 of 3): score 1 below the rung's cutoff 2"
    )
    assert trials["worst"].stop_reason == (
        "stopped by ASHA at training_iteration=2 (rung 1 of 3): score 0.2 below the rung's cutoff "
        "1.5"
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
        "exp",
        storage_path=storage,
        scheduler=scheduler,
        stop={"training_iteration": 20},
        wait_timeout_s=10.0,
    )
    scales = {"a": 1.0, "b": 0.8, "c": 0.6, "d": 0.9, "e": 0.5, "f": 0.1}
    for trial_id, scale in scales.items():
        runner.add_trial(
            Trial(
                "tests.trainables:counting",
                {"scale": scale},
                trial_id=trial_id,
                experiment_name="exp",
                resources={"cpu": 2},
            )
        )

    trials = {trial.trial_id: trial for trial in runner.run()}

    assert {t.trial_id: (t.status, t.error_msg) for t in trials.values()} == {
        name: (TrialStatus.TERMINATED, None) for name in scales
    }
    # d and e were paused at iteration 2 and resumed from their checkpoints: no result twice.
    assert {
        name: [r["training_iteration"] for _, r in runner.results(name)] for name in trials
    } == {
        **{name: [1, 2, 3, 4] for name in "abcde"},
        "f": [1, 2],
    }
    assert trials["f"].stop_reason == (
        "stopped by HyperBand at training_iteration=2 (round 1, bracket 2, milestone 2): score 0.2 "
        "ranked 3 of 3, and only the best 2 go on"
    )
    for name, bracket in (
        ("a", 1),
        ("b", 1),
        ("d", 2),
    ):  # paused at max_t, stopped with their bracket
        assert trials[name].stop_reason == (
            "stopped by HyperBand at training_iteration=4: its bracket (round 1, bracket "
            f"{bracket}) "
            f"reached its last milestone, 4"
        ), name


def test_pbt_bottom_trials_continue_from_a_copy_of_a_top_trials_checkpoint_with_a_perturbed_config(
    ray_cluster, storage
):
    # score = iteration * scale. At every second iteration the bottom half clones the top half:
    # "d" (scale 0.1) is always at the bottom, so it is paused, takes over a top trial's
    # checkpoint copied into its own directory and that trial's scale shifted to a neighbour in
    # the list, and reports on from the donor's iteration with its new scale.
    scheduler = PopulationBasedTraining(
        time_attr="training_iteration",
        metric="score",
        mode="max",
        perturbation_interval=2,
        hyperparam_mutations={"scale": [0.1, 0.5, 1.0, 2.0, 4.0]},
        quantile_fraction=0.5,
        resample_probability=0.0,
        rng=random.Random(0),
    )
    runner = TrialRunner(
        "exp",
        storage_path=storage,
        scheduler=scheduler,
        stop={"training_iteration": 6},
        wait_timeout_s=10.0,
    )
    for trial_id, scale in {"a": 2.0, "b": 1.0, "c": 0.5, "d": 0.1}.items():
        runner.add_trial(
            Trial(
                "tests.trainables:counting",
                {"scale": scale},
                trial_id=trial_id,
                experiment_name="exp",
                resources={"cpu": 1},
            )
        )

    trials = {trial.trial_id: trial for trial in runner.run()}

    assert {t.trial_id: (t.status, t.error_msg) for t in trials.values()} == {
        name: (TrialStatus.TERMINATED, None) for name in "abcd"
    }
    lineage = scheduler.lineage("d")
    assert lineage, "the bottom trial was never exploited"
    last = lineage[-1]
    assert last.trial_id == "d" and last.donor_trial_id != "d"
    assert trials["d"].config == last.new_config and trials["d"].config["scale"] != 0.1
    results = [r for _, r in runner.results("d")]
    assert results[-1]["training_iteration"] == 6
    assert results[-1]["score"] == pytest.approx(6 * trials["d"].config["scale"])
    # Each of d's exploits resumed from the donor's iteration: the next result is the next one,
    # with the new scale (the lineage starts with the donors' own exploits).
    for exploit in (e for e in lineage if e.trial_id == "d"):
        after = [
            r for r in results if r["training_iteration"] == exploit.donor_checkpoint.iteration + 1
        ]
        assert any(
            r["score"] == pytest.approx(r["training_iteration"] * exploit.new_config["scale"])
            for r in after
        ), (exploit, results)
    # The copy lives in d's own directory, not linked to the donor's.
    newest = trials["d"].checkpoint
    assert newest is not None and newest.path.startswith(os.path.join(storage, "exp", "d") + os.sep)
    assert not os.path.islink(newest.path)


def test_pbt_refuses_a_trainable_it_could_not_clone_before_any_trial_starts(ray_cluster, storage):
    from tests.conftest import live_trial_actors

    scheduler = PopulationBasedTraining(
        metric="loss", mode="min", perturbation_interval=1, hyperparam_mutations={"x": [0.1, 0.2]}
    )
    runner = TrialRunner("exp", storage_path=storage, scheduler=scheduler)
    with pytest.raises(
        ValueError,
        match=r"PopulationBasedTraining: trainable 'tests.trainables:quadratic' never "
        r"calls airflow_trials.get_checkpoint\(\)",
    ):
        runner.add_trial(
            Trial("tests.trainables:quadratic", {"x": 0.1}, trial_id="a", experiment_name="exp")
        )
    assert runner.get_trials() == [] and live_trial_actors() == []
