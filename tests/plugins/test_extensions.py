"""The run page shows the run's extensions (``airflow-trials extend``): which DAG run, when, what
changed and how it ended; a run without one shows no section."""

from __future__ import annotations


def test_the_run_page_lists_the_runs_extensions(make_dashboard, trials_store, seeded):
    trials_store.finish_experiment_run(seeded.run, "SUCCESS")
    trials_store.begin_run_extension(
        seeded.run,
        "manual__extend-1",
        num_samples_added=3,
        stop_before={"training_iteration": 10},
        stop_after={"training_iteration": 20},
        trials_continued=seeded.trials[:2],
        trials_added=["n1", "n2", "n3"],
    )
    dashboard = make_dashboard(trials_store, seeded)
    page = dashboard.get(f"/runs/{seeded.run}").text
    assert "<h2>Extensions</h2>" in page
    assert "manual__extend-1" in page and "status-running" in page
    assert (
        "+3 samples, stop {&#39;training_iteration&#39;: 10} -&gt; "
        "{&#39;training_iteration&#39;: 20}, 2 trials continued"
    ) in page
    assert '<td class="num">3</td>' in page
    trials_store.end_run_extension(seeded.run, "manual__extend-1", "SUCCESS")
    assert "status-success" in dashboard.get(f"/runs/{seeded.run}").text.split("Extensions")[1]
    assert "<h2>Extensions</h2>" not in dashboard.get(f"/runs/{seeded.other_run}").text
