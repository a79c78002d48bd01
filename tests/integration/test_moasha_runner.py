"""MOASHA on the TrialRunner: trials stopped at their rungs by their two metrics, on a local Ray."""

from __future__ import annotations

from airflow_trials import MOASHA, Trial, TrialRunner, TrialStatus


def test_moasha_stops_trials_at_their_rungs_by_both_metrics(ray_cluster, storage):
    # Rungs at iterations 1, 3 and 9. Each trial takes both CPUs, so they run one after another
    # in the order added and every decision depends on the values alone. "b" is dominated by "a"
    # at rung 1 and stops there; "c" is on a's front at rung 1 and goes on (rank score 1/3, not
    # above 1/3), but at rung 3 a has the better score, which the epsilon net starts from: c's
    # rank score is 1/2 and it stops. "a" runs to max_t.
    scheduler = MOASHA(
        metric=["score", "cost"], mode=["max", "min"], max_t=9, grace_period=1, reduction_factor=3
    )
    runner = TrialRunner(
        "exp",
        storage_path=storage,
        scheduler=scheduler,
        stop={"training_iteration": 20},
        wait_timeout_s=10.0,
    )
    for trial_id, scale, cost in (("a", 1.0, 1.0), ("b", 0.5, 2.0), ("c", 0.5, 0.5)):
        runner.add_trial(
            Trial(
                "tests.trainables:two_metrics",
                {"scale": scale, "cost": cost},
                trial_id=trial_id,
                experiment_name="exp",
                resources={"cpu": 2},
            )
        )

    trials = {trial.trial_id: trial for trial in runner.run()}

    assert {t.trial_id: (t.status, t.error_msg) for t in trials.values()} == {
        name: (TrialStatus.TERMINATED, None) for name in "abc"
    }
    assert {
        name: [r["training_iteration"] for _, r in runner.results(name)][-1] for name in trials
    } == {"a": 9, "b": 1, "c": 3}
    assert (
        trials["a"].stop_reason == "stopped by MOASHA at training_iteration=9: it reached max_t=9"
    )
    assert trials["b"].stop_reason == (
        "stopped by MOASHA at training_iteration=1 (rung 1 of 3): score 0.5, cost 2; its rank "
        "score among the rung's 2 trials (Syne Tune 0.16's non-dominated sort) is 0.5, above 1/3"
    )
    assert trials["c"].stop_reason == (
        "stopped by MOASHA at training_iteration=3 (rung 2 of 3): score 1.5, cost 0.5; its rank "
        "score among the rung's 2 trials (Syne Tune 0.16's non-dominated sort) is 0.5, above 1/3"
    )
