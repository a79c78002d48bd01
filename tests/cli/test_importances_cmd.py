"""``airflow-trials importances`` on a seeded trials DB (no Ray, no Airflow): the ranking in each
output format, ``--metric`` of several, ``--run``, ``--evaluator``, the too-few-trials exit, and
the cache that spares a later call Optuna's imports (recomputed once a trial's value changes)."""

from __future__ import annotations

import json
import math
import os
import random
import subprocess
import sys

import pytest
import yaml
from typer.testing import CliRunner

from airflow_trials.cli import app
from airflow_trials.core.status import TrialStatus
from airflow_trials.core.update import TrialUpdate
from tests.factories import add_results

runner = CliRunner()


@pytest.fixture(autouse=True)
def fresh_cache(tmp_path, monkeypatch):
    """Each test its own importances cache: an answer another test cached is not read here."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture(scope="module")
def seeded(tmp_path_factory) -> str:
    """Experiment "tune" (min loss, max acc): run "r1" of 40 trials where lr drives loss and
    dropout drives acc, 4 of them failed (ERROR) after reporting, so they do not count
    (docs/store.md "Which trials count"); run "r2" (the latest) of one trial."""
    from airflow_trials.store import TrialStore

    url = f"sqlite:///{tmp_path_factory.mktemp('cli_importances') / 'trials.db'}"
    store = TrialStore(url, create=True)
    try:
        store.ensure_experiment("tune", metric=["loss", "acc"], mode=["min", "max"])
        run = store.create_experiment_run(
            "tune",
            "r1",
            search_space={
                "lr": {"loguniform": [1e-4, 1e-1]},
                "dropout": {"uniform": [0, 0.6]},
                "act": {"choice": ["relu", "tanh"]},
            },
        )
        rng = random.Random(11)
        for i in range(40):
            trial_id = f"r1-{i:02d}"
            config = {
                "lr": 10 ** rng.uniform(-4, -1),
                "dropout": rng.uniform(0, 0.6),
                "act": rng.choice(["relu", "tanh"]),
                "batch": 64,
            }
            store.upsert_trial(
                trial_id,
                trainable="pkg.train:fn",
                config=config,
                resources={"cpu": 1},
                max_failures=0,
                experiment_run_id=run,
            )
            loss = abs(math.log10(config["lr"]) + 2.5) + 0.01 * rng.random()
            acc = 1 - abs(config["dropout"] - 0.3) + 0.001 * rng.random()
            add_results(store, trial_id, [{"training_iteration": 1, "loss": loss, "acc": acc}])
            # Every tenth failed after its result: ERROR, left out (its loss counted before).
            _end(store, trial_id, TrialStatus.ERROR if i % 10 == 3 else TrialStatus.TERMINATED)
        latest = store.create_experiment_run("tune", "r2")
        store.upsert_trial(
            "r2-00",
            trainable="pkg.train:fn",
            config={"lr": 0.1},
            resources={"cpu": 1},
            max_failures=0,
            experiment_run_id=latest,
        )
        add_results(store, "r2-00", [{"training_iteration": 1, "loss": 0.4, "acc": 0.5}])
        _end(store, "r2-00", TrialStatus.TERMINATED)
    finally:
        store.dispose()
    return url


def _end(store, trial_id: str, status) -> None:
    from airflow_trials.core.end import TrialEnd
    from airflow_trials.core.fate import after_failure

    decision = None if status is TrialStatus.TERMINATED else after_failure(trial_id, 0, 0)
    store.record_end(TrialEnd(trial_id, "tune", status, error=None), decision)


def invoke(*args):
    result = runner.invoke(app, [str(a) for a in args])
    assert result.exit_code == 0, (result.stdout, result.stderr)
    return result.stdout


@pytest.mark.parametrize("fmt", ["json", "yaml"])
def test_the_document_ranks_the_hyperparameters(seeded, fmt):
    text = invoke("importances", "tune", "--run", "r1", "--db-url", seeded, "--output", fmt)
    doc = json.loads(text) if fmt == "json" else yaml.safe_load(text)
    # Of several metrics, the first unless --metric picks another.
    assert (doc["metric"], doc["mode"], doc["metrics"]) == ("loss", "min", ["loss", "acc"])
    assert (doc["run_key"], doc["evaluator"]) == ("r1", "ped-anova")
    assert (doc["trials"], doc["skipped"], doc["constant"]) == (36, 4, ["batch"])
    names = [p["name"] for p in doc["importances"]]
    assert names[0] == "lr" and sorted(names) == ["act", "dropout", "lr"]
    shares = [p["importance"] for p in doc["importances"]]
    assert shares == sorted(shares, reverse=True) and sum(shares) == pytest.approx(1.0)
    lr = doc["importances"][0]
    assert (lr["kind"], lr["low"], lr["high"], lr["log"], lr["from_search_space"]) == (
        "float",
        1e-4,
        1e-1,
        True,
        True,
    )


def test_metric_picks_one_of_several_with_its_mode(seeded):
    doc = json.loads(
        invoke(
            "importances", "tune", "--run", "r1", "--metric", "acc", "--db-url", seeded, "--json"
        )
    )
    assert (doc["metric"], doc["mode"]) == ("acc", "max")
    assert doc["importances"][0]["name"] == "dropout"


def test_the_table_and_plain_output(seeded):
    table = invoke("importances", "tune", "--run", "r1", "--db-url", seeded)
    assert "tune / r1: importances of min loss (ped-anova)" in table
    assert (
        "From 36 of 40 trials; 4 without loss or not TERMINATED left out; the same in every "
        "trial: batch." in table
    )
    assert "float 0.0001 to 0.1, log" in table

    plain = invoke("importances", "tune", "--run", "r1", "--db-url", seeded, "--output", "plain")
    lines = [line.split("\t") for line in plain.splitlines()]
    assert lines[0] == ["rank", "hyperparameter", "importance", "evaluated on"]
    assert [row[:2] for row in lines[1:]][0] == ["1", "lr"] and len(lines) == 4
    assert "From 36" not in plain  # scripts get the rows only


def test_fanova_ranks_the_same_driver_first(seeded):
    doc = json.loads(
        invoke(
            "importances",
            "tune",
            "--run",
            "r1",
            "--evaluator",
            "fanova",
            "--db-url",
            seeded,
            "--json",
        )
    )
    assert doc["evaluator"] == "fanova" and doc["importances"][0]["name"] == "lr"


def test_too_few_trials_exit_1_naming_the_run_and_what_is_needed(seeded):
    result = runner.invoke(app, ["importances", "tune", "--db-url", seeded])  # latest: r2
    assert result.exit_code == 1
    assert (
        "Error: Cannot compute the hyperparameter importances of loss for run r2" in result.stderr
    )
    assert "1 of its 1 trials reported loss" in result.stderr and "at least 2" in result.stderr
    assert result.stdout == ""


def test_fanova_without_scikit_learn_says_how_to_install_it(seeded, monkeypatch):
    monkeypatch.setitem(sys.modules, "sklearn", None)  # as if it were not installed
    result = runner.invoke(
        app, ["importances", "tune", "--run", "r1", "--evaluator", "fanova", "--db-url", seeded]
    )
    assert result.exit_code == 1
    assert "fANOVA needs scikit-learn" in result.stderr
    assert "pip install 'scikit-learn>=1.5'" in result.stderr


def test_a_metric_no_trial_reported_lists_those_they_did(seeded):
    result = runner.invoke(
        app, ["importances", "tune", "--run", "r1", "--metric", "lossy", "--db-url", seeded]
    )
    assert result.exit_code == 1
    assert "reported metric 'lossy'" in result.stderr and "acc, loss" in result.stderr


def test_an_unknown_evaluator_is_refused_by_the_option(seeded):
    result = runner.invoke(app, ["importances", "tune", "--evaluator", "shap", "--db-url", seeded])
    assert result.exit_code == 2 and "ped-anova" in result.stderr


# In a fresh process, as a shell runs the command: which heavy modules the call imported.
_CALL = """
import sys
from airflow_trials.cli import app
try:
    app(sys.argv[1:])
except SystemExit as e:
    assert not e.code, e.code
print("imported:", sorted({"optuna", "sklearn"} & set(sys.modules)))
"""


def _call_in_a_new_process(*args: str) -> tuple[dict, str]:
    done = subprocess.run(
        [sys.executable, "-c", _CALL, *args], capture_output=True, text=True, env=dict(os.environ)
    )
    assert done.returncode == 0, done.stderr
    document, imported = done.stdout.rsplit("imported:", 1)
    return json.loads(document), imported.strip()


def test_a_later_call_reads_the_cache_and_imports_no_optuna(seeded, fresh_cache):
    args = ("importances", "tune", "--run", "r1", "--db-url", seeded, "--json")
    first, first_imported = _call_in_a_new_process(*args)
    assert first_imported == "['optuna', 'sklearn']"  # optuna.importance imports scikit-learn
    assert len(list((fresh_cache / "airflow_trials" / "importances").glob("*.json"))) == 1
    again, imported = _call_in_a_new_process(*args)
    assert (again, imported) == (first, "[]")


def test_a_new_value_of_a_trial_computes_them_again(tmp_path):
    from airflow_trials.store import TrialStore

    url = f"sqlite:///{tmp_path / 'trials.db'}"
    store = TrialStore(url, create=True)
    store.ensure_experiment("tune", metric="loss", mode="min")
    run = store.create_experiment_run("tune", "r1")
    for i, (lr, loss) in enumerate([(0.1, 0.9), (0.01, 0.2), (0.001, 0.5)]):
        trial_id = f"t-{i}"
        store.upsert_trial(
            trial_id,
            trainable="pkg.train:fn",
            config={"lr": lr, "act": ["relu", "tanh", "relu"][i]},
            resources={"cpu": 1},
            max_failures=0,
            experiment_run_id=run,
        )
        add_results(store, trial_id, [{"training_iteration": 1, "loss": loss}])
        _end(store, trial_id, TrialStatus.TERMINATED)
    before = json.loads(invoke("importances", "tune", "--db-url", url, "--json"))
    # t-0 (relu) reports a far better loss at its last iteration: its best value changes.
    store.record_progress([TrialUpdate("t-0", results=[{"training_iteration": 2, "loss": 0.01}])])
    store.dispose()
    after = json.loads(invoke("importances", "tune", "--db-url", url, "--json"))
    assert before["importances"] != after["importances"]
