"""``airflow-trials history EXPERIMENT`` on a seeded trials DB: every output format, ``--last``,
``--db-url``, several metrics and an unknown experiment."""

from __future__ import annotations

import json

import pytest
import yaml
from typer.testing import CliRunner

from airflow_trials.cli import app
from airflow_trials.core.end import TrialEnd
from airflow_trials.core.fate import Transition
from airflow_trials.core.status import TrialStatus
from tests.factories import add_results
from tests.plugins.history_seed import EXPERIMENT, seed_nightly

runner = CliRunner()


@pytest.fixture(scope="module")
def seeded(tmp_path_factory):
    from airflow_trials.store import TrialStore

    url = f"sqlite:///{tmp_path_factory.mktemp('cli_history') / 'trials.db'}"
    store = TrialStore(url, create=True)
    try:
        nights = seed_nightly(store)
        store.ensure_experiment("multi", metric=["acc", "latency"], mode=["max", "min"])
        run = store.create_experiment_run("multi", "m1")
        store.upsert_trial(
            "multi-0", trainable="m:f", config={"a": 1}, resources={}, max_failures=0,
            experiment_run_id=run,
        )  # fmt: skip
        store.record_transition("multi-0", Transition.PLACED)
        add_results(store, "multi-0", [{"training_iteration": 1, "acc": 0.9, "latency": 2.0}])
        # Only a trial that ended TERMINATED is a run's best (docs/store.md, "Which trials count").
        store.record_end(TrialEnd("multi-0", "multi", TrialStatus.TERMINATED))
    finally:
        store.dispose()
    return url, nights


def _history(url: str, *args: str):
    result = runner.invoke(app, ["history", *args, "--db-url", url])
    assert result.exit_code == 0, result.output
    return result.output


def test_json_has_every_run_with_its_best_and_counts(seeded):
    url, nights = seeded
    body = json.loads(_history(url, EXPERIMENT, "--output", "json"))
    assert (body["metric"], body["mode"], body["several_metrics"]) == ("loss", "min", False)
    runs = body["runs"]
    assert [r["run_key"] for r in runs] == [n.run_key for n in nights.nights]
    assert [r["best_value"] for r in runs] == [n.best_value for n in nights.nights]
    assert [r["changed_keys"] for r in runs] == [[], [], ["lr"], ["dropout", "layers"]]
    assert runs[0]["stop_kinds"] == {
        "completed": 3,
        "early_stopped": 1,
        "errored": 1,
        "unfinished": 1,
    }
    assert (runs[0]["num_errored"], runs[0]["num_failed_tries"], runs[0]["num_trials"]) == (1, 2, 6)
    assert runs[-1]["warm_started_from"] == {
        "experiment_run_id": nights.nights[-2].run,
        "run_key": nights.nights[-2].run_key,
    }


def test_yaml_matches_json(seeded):
    url, _ = seeded
    as_json = json.loads(_history(url, EXPERIMENT, "-o", "json"))
    assert yaml.safe_load(_history(url, EXPERIMENT, "-o", "yaml")) == as_json


def test_json_flag_is_output_json(seeded):
    """``--json`` is ``-o json``, as on the other read commands; both, they must agree."""
    url, _ = seeded
    assert _history(url, EXPERIMENT, "--json") == _history(url, EXPERIMENT, "-o", "json")
    assert _history(url, EXPERIMENT, "--json", "-o", "json") == _history(url, EXPERIMENT, "--json")
    both = runner.invoke(app, ["history", EXPERIMENT, "--json", "-o", "yaml", "--db-url", url])
    assert both.exit_code == 1 and "pass only one of them" in both.output


def test_last_keeps_the_newest_runs(seeded):
    url, nights = seeded
    body = json.loads(_history(url, EXPERIMENT, "--last", "2", "-o", "json"))
    assert [r["run_key"] for r in body["runs"]] == [n.run_key for n in nights.nights[-2:]]
    assert body["runs"][0]["changed_keys"] == ["lr"]  # compared with the run before the window
    assert runner.invoke(app, ["history", EXPERIMENT, "--last", "0", "--db-url", url]).exit_code


def test_plain_is_tab_separated_with_a_header(seeded):
    url, nights = seeded
    lines = _history(url, EXPERIMENT, "--output", "plain").splitlines()
    assert lines[0].split("\t")[:5] == ["run_key", "date (UTC)", "status", "trials", "best loss"]
    cells = [line.split("\t") for line in lines[1:]]
    assert [c[0] for c in cells] == [n.run_key for n in nights.nights]
    assert cells[2][4] == "0.45" and cells[2][-2] == "lr"
    assert cells[3][-2] == "dropout, layers" and cells[3][-1] == nights.nights[2].run_key
    assert cells[0][8:11] == ["3", "1", "1"]  # completed, early-stopped, unfinished


def test_table_names_the_runs(seeded):
    url, nights = seeded
    output = _history(url, EXPERIMENT)
    assert f"{EXPERIMENT}: history of 4 runs, best loss (min)" in output
    for night in nights.nights:
        assert night.run_key in output


def test_several_metrics_say_which_best(seeded):
    url, _ = seeded
    output = _history(url, "multi")
    assert "ranks by several metrics" in output and "best acc (max) alone" in output
    body = json.loads(_history(url, "multi", "-o", "json"))
    assert body["several_metrics"] is True and body["runs"][0]["best_value"] == 0.9


def test_unknown_experiment_is_one_line_error(seeded):
    url, _ = seeded
    result = runner.invoke(app, ["history", "nope", "--db-url", url])
    assert result.exit_code == 1
    assert "Experiment 'nope' is not in" in result.output
