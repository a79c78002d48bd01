"""``airflow-trials approvals EXPERIMENT``: the answers to a run's approve_best as the trials DB
recorded them (``TrialStore.record_approval``, the writer approve_best uses)."""

from __future__ import annotations

import datetime as dt
import json

import pytest
from typer.testing import CliRunner

from airflow_trials.cli import app

runner = CliRunner()
AT = dt.datetime(2026, 11, 28, 9, 30, 5, tzinfo=dt.UTC)


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    from airflow_trials.store import TrialStore

    url = f"sqlite:///{tmp_path_factory.mktemp('cli_approvals') / 'trials.db'}"
    store = TrialStore(url, create=True)
    try:
        answered = store.create_experiment_run("gate", "manual__1", dag_id="gate")
        for dag_run_id, outcome, who, minutes in (
            ("manual__1", "SELF_APPROVED", "alice", 0),
            ("extend__2", "REJECTED", "bob", 5),
        ):
            store.record_approval(
                answered,
                dag_run_id,
                trial_id="gate-1",
                outcome=outcome,
                responded_by_id=who,
                responded_by_name=who.title(),
                responded_at=AT + dt.timedelta(minutes=minutes),
                reason="" if outcome == "SELF_APPROVED" else "val set leaked",
                triggered_by="alice",
            )
        store.create_experiment_run("gate", "manual__3", dag_id="gate")
    finally:
        store.dispose()
    return url


def approvals(url: str, *args: str):
    return runner.invoke(app, ["approvals", "gate", *args, "--db-url", url])


def test_the_table_lists_each_dag_run_s_answer_with_who_when_and_why(url):
    result = approvals(url, "--run", "manual__1", "--output", "plain")
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == [
        "DAG run\tanswered (UTC)\ttrial\toutcome\tby\ttriggered by\tpublishes\treason",
        "manual__1\t2026-11-28 09:30:05\tgate-1\tSELF_APPROVED\tAlice (id alice)\talice\tno\t-",
        "extend__2\t2026-11-28 09:35:05\tgate-1\tREJECTED\tBob (id bob)\talice\tno\tval set leaked",
    ]
    table = approvals(url, "--run", "manual__1")
    assert table.exit_code == 0 and "gate / manual__1: approvals" in table.output
    assert "REJECTED" in table.output and "val set leaked" in table.output


def test_json_holds_the_records(url):
    result = approvals(url, "--run", "manual__1", "--json")
    assert result.exit_code == 0, result.output
    first, second = json.loads(result.output)
    assert first["outcome"] == "SELF_APPROVED" and first["responded_by_id"] == "alice"
    assert first["responded_at"] == "2026-11-28T09:30:05+00:00"
    assert (second["outcome"], second["reason"], second["triggered_by"]) == (
        "REJECTED",
        "val set leaked",
        "alice",
    )


def test_a_run_without_answers_says_so_and_an_unknown_run_is_one_line(url):
    result = approvals(url)  # the latest run, manual__3: never asked
    assert result.exit_code == 0, result.output
    assert "No answer to approve_best is recorded for run manual__3 of experiment gate" in (
        " ".join(result.output.split())
    )
    unknown = approvals(url, "--run", "nope")
    assert unknown.exit_code == 1
    assert unknown.output.startswith("Error: Experiment 'gate' has no run 'nope'")
