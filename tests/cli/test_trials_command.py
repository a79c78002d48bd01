"""``airflow-trials trials`` on a seeded trials DB (no Ray, no Airflow): ``--early-stopped``, and
each
trial's ASHA rungs and PBT lineage in the JSON and YAML output."""

from __future__ import annotations

import json

import pytest
import yaml
from typer.testing import CliRunner

from airflow_trials.cli import app
from airflow_trials.core.end import TrialEnd
from airflow_trials.core.fate import Transition
from airflow_trials.core.scheduler import Decision
from airflow_trials.core.status import TrialStatus
from airflow_trials.core.stop_kind import StopKind
from airflow_trials.schedulers.asha.asha_rungs import RungVerdict
from tests.factories import add_results
from tests.scheduler_writes import OneWriteEach

runner = CliRunner()
ASHA_STOP = (
    "stopped by ASHA at training_iteration=2 (rung 1 of 2): loss 1.5 above the rung's cutoff 1"
)
AT_MAX_T = "stopped by ASHA at training_iteration=4: it reached max_t=4"


def verdict(decision: Decision, reason: str | None = None):
    return lambda values: RungVerdict(decision=decision, cutoff=None, reason=reason)


@pytest.fixture(scope="module")
def seeded(tmp_path_factory) -> str:
    """Run "r1" of "tune": "best" ran to max_t, "cut" was stopped at a rung, "clone" cloned
    "best"."""
    from airflow_trials.store import TrialStore

    url = f"sqlite:///{tmp_path_factory.mktemp('cli_trials') / 'trials.db'}"
    store = TrialStore(url, create=True)
    try:
        store.ensure_experiment("tune", metric="loss", mode="min")
        run = store.create_experiment_run("tune", "r1")
        for i, trial_id in enumerate(("best", "clone", "cut")):
            store.upsert_trial(
                trial_id,
                trainable="pkg.train:fn",
                config={"lr": 0.1 * (i + 1), "opt": {"m": 0.9}},
                resources={"cpu": 1},
                max_failures=0,
                experiment_run_id=run,
            )
            store.record_transition(trial_id, Transition.PLACED)
            add_results(
                store, trial_id, [{"training_iteration": it, "loss": 1.0 / it + i} for it in (1, 2)]
            )
        OneWriteEach(store).record_rung(
            run,
            "best",
            bracket=0,
            milestone=2,
            value=0.5,
            iteration=2,
            decide=verdict(Decision.CONTINUE),
        )
        OneWriteEach(store).record_rung(
            run,
            "cut",
            bracket=0,
            milestone=2,
            value=2.5,
            iteration=2,
            decide=verdict(Decision.STOP, ASHA_STOP),
        )
        OneWriteEach(store).record_rung(
            run,
            "best",
            bracket=0,
            milestone=4,
            value=0.25,
            iteration=4,
            at_end=True,
            decide=verdict(Decision.CONTINUE),
        )
        store.record_exploit(
            "clone",
            iteration=2,
            donor_trial_id="best",
            donor_checkpoint="/ckpt/best/2",
            old_config={"lr": 0.2, "opt": {"m": 0.9}},
            new_config={"lr": 0.12, "opt": {"m": 0.9}},
            operations={"lr": "0.1 * 1.2"},
        )
        for trial_id, reason, kind in (
            ("best", AT_MAX_T, StopKind.MAX_T),
            ("cut", ASHA_STOP, StopKind.SCHEDULER),
            ("clone", "its trainable finished", StopKind.FINISHED),
        ):
            store.record_end(
                TrialEnd(
                    trial_id, "tune", TrialStatus.TERMINATED, stop_reason=reason, stop_kind=kind
                )
            )
    finally:
        store.dispose()
    return url


def invoke(*args):
    result = runner.invoke(app, [str(a) for a in args])
    assert result.exit_code == 0, (result.stdout, result.stderr)
    return result.stdout


@pytest.mark.parametrize("fmt", ["json", "yaml"])
def test_trials_give_each_trial_s_rungs_and_lineage(seeded, fmt):
    text = invoke("trials", "tune", "--db-url", seeded, "--output", fmt)
    trials = {
        t["trial_id"]: t
        for t in (json.loads(text) if fmt == "json" else yaml.safe_load(text))["trials"]
    }
    assert [
        (r["milestone"], r["iteration"], r["value"], r["decision"], r["at_end"])
        for r in trials["best"]["rungs"]
    ] == [(2.0, 2, 0.5, "CONTINUE", False), (4.0, 4, 0.25, "CONTINUE", True)]
    [cut] = trials["cut"]["rungs"]
    assert (cut["decision"], cut["reason"]) == ("STOP", ASHA_STOP)
    [step] = trials["clone"]["lineage"]
    assert (
        step["trial_id"],
        step["donor_trial_id"],
        step["iteration"],
        step["donor_checkpoint"],
    ) == ("clone", "best", 2, "/ckpt/best/2")
    assert (step["old_config"]["lr"], step["new_config"]["lr"], step["operations"]) == (
        0.2,
        0.12,
        {"lr": "0.1 * 1.2"},
    )
    assert trials["clone"]["config"]["lr"] == 0.12  # the exploit's config is the trial's
    assert trials["best"]["lineage"] == [] and trials["clone"]["rungs"] == []


@pytest.mark.parametrize("fmt", ["json", "plain"])
def test_early_stopped_keeps_only_the_trials_their_scheduler_stopped_early(seeded, fmt):
    text = invoke("trials", "tune", "--db-url", seeded, "--early-stopped", "--output", fmt)
    if fmt == "json":
        assert [t["trial_id"] for t in json.loads(text)["trials"]] == [
            "cut"
        ]  # not "best", stopped at max_t
    else:
        header, *lines = text.splitlines()
        assert [line.split("\t")[0] for line in lines] == ["cut"] and header.startswith("trial\t")
    everyone = json.loads(invoke("trials", "tune", "--db-url", seeded, "--json"))["trials"]
    assert [t["trial_id"] for t in everyone] == ["best", "clone", "cut"]


def test_early_stopped_says_so_when_no_trial_was(tmp_path):
    from airflow_trials.store import TrialStore

    url = f"sqlite:///{tmp_path / 'trials.db'}"
    store = TrialStore(url, create=True)
    try:
        store.ensure_experiment("calm", metric="loss", mode="min")
        run = store.create_experiment_run("calm", "r1")
        store.upsert_trial(
            "t",
            trainable="m:f",
            config={},
            resources={"cpu": 1},
            max_failures=0,
            experiment_run_id=run,
        )
    finally:
        store.dispose()
    assert "No trial of run r1 of calm was stopped early by its scheduler." in invoke(
        "trials", "calm", "--db-url", url, "--early-stopped"
    )
