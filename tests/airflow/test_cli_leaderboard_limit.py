"""``airflow-trials leaderboard`` prints the first 50 rows unless ``--limit`` says otherwise
(``--limit 0``: every trial), says on stderr under a cut table how many of the run's trials it
showed, and leaves a JSON document as it is; the best and the front stay the whole run's."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from airflow_trials.cli import app
from airflow_trials.cli.boards import LEADERBOARD_LIMIT
from airflow_trials.core.status import TrialStatus
from tests.airflow.test_cli_pareto import EXPERIMENT as PARETO_EXPERIMENT
from tests.airflow.test_cli_pareto import pareto_url  # noqa: F401  (a fixture)
from tests.contract.conftest import postgres_schema_url  # noqa: F401  (a fixture)
from tests.one_best_seed import seed_run

EXPERIMENT = "limited"
NUM_TRIALS = LEADERBOARD_LIMIT + 5
runner = CliRunner()


def invoke(*args: str):
    return runner.invoke(app, list(args))


@pytest.fixture(scope="module")
def url(tmp_path_factory) -> str:
    """One run of 55 trials, trial i with loss i (so lim-00000 ranks first)."""
    from airflow_trials.store import TrialStore

    url = f"sqlite:///{tmp_path_factory.mktemp('cli_limit') / 'trials.db'}"
    store = TrialStore(url, create=True)
    try:
        runs = {
            f"lim-{i:05d}": (TrialStatus.TERMINATED, [{"loss": float(i)}])
            for i in range(NUM_TRIALS)
        }
        seed_run(store, EXPERIMENT, {"metric": "loss", "mode": "min"}, runs)
    finally:
        store.dispose()
    return url


def _plain_rows(result) -> list[str]:
    assert result.exit_code == 0, result.output
    return [line.split("\t")[1] for line in result.stdout.splitlines()[1:]]


def test_the_default_shows_the_first_50_and_says_how_to_see_every_trial(url):
    result = invoke("leaderboard", EXPERIMENT, "--db-url", url, "-o", "plain")
    assert _plain_rows(result) == [f"lim-{i:05d}" for i in range(LEADERBOARD_LIMIT)]
    assert result.stderr.strip() == (
        f"The first 50 of the run's {NUM_TRIALS} trials; --limit N shows N, --limit 0 every trial."
    )


def test_limit_0_shows_every_trial_and_a_whole_table_says_nothing_more(url):
    result = invoke("leaderboard", EXPERIMENT, "--db-url", url, "-o", "plain", "--limit", "0")
    assert _plain_rows(result) == [f"lim-{i:05d}" for i in range(NUM_TRIALS)]
    assert result.stderr == ""
    table = invoke("leaderboard", EXPERIMENT, "--db-url", url, "--limit", str(NUM_TRIALS))
    assert table.exit_code == 0 and "lim-00054" in table.stdout and table.stderr == ""


def test_json_is_cut_to_the_limit_and_names_the_whole_run_s_best(url):
    result = invoke("leaderboard", EXPERIMENT, "--db-url", url, "--json")
    document = json.loads(result.stdout)
    assert [row["trial_id"] for row in document["rows"]] == [
        f"lim-{i:05d}" for i in range(LEADERBOARD_LIMIT)
    ]
    assert result.stderr == ""
    every = json.loads(
        invoke("leaderboard", EXPERIMENT, "--db-url", url, "--json", "--limit", "0").stdout
    )
    assert len(every["rows"]) == NUM_TRIALS
    assert document["best_trial_id"] == every["best_trial_id"]


def test_a_board_of_several_metrics_says_it_was_cut_too(pareto_url):  # noqa: F811
    args = ["leaderboard", PARETO_EXPERIMENT, "--db-url", pareto_url, "-o", "plain"]
    every = invoke(*args, "--limit", "0")
    cut = invoke(*args, "--limit", "1")
    assert every.exit_code == cut.exit_code == 0 and every.stderr == ""
    assert len(cut.stdout.splitlines()) == 2  # the header and one row
    total = len(every.stdout.splitlines()) - 1
    assert cut.stderr.strip().startswith(f"The first 1 of the run's {total} trials; ")
