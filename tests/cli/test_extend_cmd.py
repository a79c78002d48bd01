"""``airflow-trials extend`` on a grid run (SQLite): new samples of a search space that draws
nothing at random would repeat the run's configs, so they are refused in one line that names the
fix; a raised stop alone still extends it."""

from __future__ import annotations

from typer.testing import CliRunner

from airflow_trials.cli import app
from airflow_trials.core.end import TrialEnd
from airflow_trials.core.fate import CRITERION_MET, Transition
from airflow_trials.core.search import generate_configs, grid_search
from airflow_trials.core.status import TrialStatus
from airflow_trials.store import TrialStore
from tests.factories import add_checkpoint, add_results

runner = CliRunner()
GRID = {"layers": grid_search([2, 4]), "act": grid_search(["relu", "gelu"])}


def grid_run(url: str) -> None:
    """Run ``grid`` of experiment ``grid``: one pass over its 4 combinations, every trial ended."""
    store = TrialStore(url, create=True)
    try:
        run = store.create_experiment_run(
            "grid", "grid", dag_id="grid", run_id="grid", search_space=GRID, num_samples=1
        )
        for i, config in enumerate(generate_configs(GRID, 1, seed=7)):
            trial_id = f"grid-{i}"
            store.upsert_trial(
                trial_id, trainable="m:f", config=config, resources={"cpu": 1}, max_failures=0,
                experiment_run_id=run,
            )  # fmt: skip
            store.record_transition(trial_id, Transition.PLACED)
            add_results(store, trial_id, [{"training_iteration": 3, "score": float(i)}])
            add_checkpoint(store, trial_id, f"/nowhere/{trial_id}/3", 3)
            last = {"training_iteration": 3, "score": float(i)}
            store.record_end(
                TrialEnd(
                    trial_id,
                    "grid",
                    TrialStatus.TERMINATED,
                    last_result=last,
                    stop_reason=CRITERION_MET,
                )
            )
        store.finish_experiment_run(run, "SUCCESS")
    finally:
        store.dispose()


def test_new_samples_of_a_grid_alone_are_refused_and_a_raised_stop_extends_it(tmp_path):
    url = f"sqlite:///{tmp_path / 'trials.db'}"
    grid_run(url)
    refused = runner.invoke(app, ["extend", "1", "--num-samples", "+1", "--db-url", url])
    assert refused.exit_code == 1
    (line,) = refused.output.strip().splitlines()
    assert line == (
        "Error: Run grid (id 1) of experiment grid: its search space is a grid over layers, act "
        "(4 combinations) and draws nothing at random, so 1 new sample(s) would only run the "
        "configs the run was given again; nothing was written. Raise --stop to train its trials "
        "longer, or trigger a new run of the DAG with a wider grid or a random domain "
        "(warm_start=<run key> seeds it with this run's best)."
    )
    stop = ["extend", "1", "--stop", "training_iteration=5", "--dry-run", "--db-url", url]
    extended = runner.invoke(app, stop)
    assert extended.exit_code == 0, extended.output
    assert "+0 samples; stop {'training_iteration': 5}; 4 trials continue" in extended.output
