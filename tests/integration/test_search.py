"""A search algorithm on the TrialRunner path, on a real local Ray."""

from __future__ import annotations

from airflow_trials import OptunaSearch, TrialRunner, TrialStatus
from airflow_trials.core.search import uniform


def test_optuna_search_suggests_every_trial_and_is_told_every_result(ray_cluster, storage):
    # Two 1-CPU trials at a time on 2 CPUs; TPE's first 10 suggestions are seeded random draws, so
    # which x values run does not depend on which trial finishes first.
    search = OptunaSearch({"x": uniform(0, 1), "tag": "fixed"}, metric="loss", mode="min", seed=0)
    runner = TrialRunner(
        "search",
        storage_path=storage,
        search_alg=search,
        num_samples=8,
        trainable="tests.trainables:quadratic",
        trial_kwargs={"resources": {"cpu": 1}},
        wait_timeout_s=10.0,
    )

    trials = runner.run()

    assert [(t.status, t.error_msg, t.config["tag"]) for t in trials] == [
        (TrialStatus.TERMINATED, None, "fixed")
    ] * 8
    assert {t.trial_id: len(runner.results(t.trial_id)) for t in trials} == {
        t.trial_id: 3 for t in trials
    }
    told = search.study.trials
    assert [(t.state.name, sorted(t.intermediate_values)) for t in told] == [
        ("COMPLETE", [1, 2, 3])
    ] * 8
    assert sorted((t.params["x"], t.value) for t in told) == sorted(
        (t.config["x"], t.last_result["loss"]) for t in trials
    )
    best = min(trials, key=lambda t: t.last_result["loss"])
    assert abs(best.config["x"] - 0.3) < 0.2  # seed 0 draws one within 0.124
