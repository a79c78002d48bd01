"""``airflow-trials db end-run`` on SQLite and PostgreSQL, as a real ``airflow-trials`` process: a
run left RUNNING (its DAG run marked failed, so select_best never ran) is ended with its status
and reason; one that has ended is refused; unended trials refuse it unless ``--force``, which
records them ERROR; its RUNNING extension ends with it; and afterwards ``db delete-run`` and
``extend`` accept the run."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from airflow_trials.core.end import TrialEnd
from airflow_trials.core.fate import CRITERION_MET, Transition
from airflow_trials.core.status import TrialStatus
from airflow_trials.core.status_cause import StatusCause
from airflow_trials.store import TrialStore
from tests.contract.conftest import postgres_schema_url  # noqa: F401  (a fixture)
from tests.factories import add_checkpoint, add_results

#: The run's space: a grid of two values, and a random key (so that new samples are new configs).
SPACE = {"layers": {"grid_search": [2, 4]}, "lr": {"loguniform": [1e-4, 1e-1]}}
REASON = "marked failed in Airflow: the GPU node was lost"


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def db_url(request, tmp_path) -> str:
    """A migrated trials DB: experiment ``exp`` with run ``stuck`` (RUNNING, as a DAG run marked
    failed leaves it: trial ``stuck-a`` ended, ``stuck-b`` still PENDING) and run ``done``
    (SUCCESS)."""
    if request.param == "postgresql":
        url = request.getfixturevalue("postgres_schema_url")
    else:
        url = f"sqlite:///{tmp_path / 'trials.db'}"
    store = TrialStore(url, create=True)
    try:
        store.ensure_experiment("exp", metric="score", mode="max")
        for run_key in ("stuck", "done"):
            run = store.create_experiment_run(
                "exp", run_key, dag_id="exp", run_id=run_key, search_space=SPACE, num_samples=1
            )
            ended(store, run, f"{run_key}-a")
        store.upsert_trial(
            "stuck-b", trainable="m:f", config={"layers": 4, "lr": 0.01}, resources={"cpu": 1},
            max_failures=0, experiment_run_id=run_pk(store, "stuck"),
        )  # fmt: skip
        store.finish_experiment_run(run_pk(store, "done"), "SUCCESS")
    finally:
        store.dispose()
    return url


def ended(store: TrialStore, run: int, trial_id: str) -> None:
    """A trial that trained 3 iterations, checkpointed at 3 and met its stopping criterion."""
    store.upsert_trial(
        trial_id, trainable="m:f", config={"layers": 2, "lr": 0.01}, resources={"cpu": 1},
        max_failures=0, experiment_run_id=run,
    )  # fmt: skip
    store.record_transition(trial_id, Transition.PLACED)
    add_results(store, trial_id, [{"training_iteration": i, "score": float(i)} for i in (1, 2, 3)])
    add_checkpoint(store, trial_id, f"/nowhere/{trial_id}/3", 3)
    store.record_end(
        TrialEnd(
            trial_id,
            "exp",
            TrialStatus.TERMINATED,
            last_result={"training_iteration": 3, "score": 3.0},
            stop_reason=CRITERION_MET,
        )
    )


def run_pk(store: TrialStore, run_key: str) -> int:
    return next(r.id for r in store.reader.list_experiment_runs("exp") if r.run_key == run_key)


def cli(url: str, *args: str) -> subprocess.CompletedProcess:
    """``airflow-trials ARGS --db-url URL`` as its own process, as a user runs it."""
    return subprocess.run(
        [sys.executable, "-m", "airflow_trials.cli", *args, "--db-url", url],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "200"},
    )


def end_run(url: str, run: str, *args: str) -> subprocess.CompletedProcess:
    return cli(url, "db", "end-run", "exp", "--run", run, "--reason", REASON, *args)


def read(url: str, run_key: str) -> tuple[object, dict[str, object]]:
    """The run's record and its trials by id."""
    store = TrialStore(url)
    try:
        record = next(r for r in store.reader.list_experiment_runs("exp") if r.run_key == run_key)
        return record, {
            t.trial_id: t for t in store.reader.list_trials(experiment_run_id=record.id)
        }
    finally:
        store.dispose()


def one_error_line(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 1, (result.stdout, result.stderr)
    (line,) = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    return line


def test_a_stuck_run_is_refused_then_ended_with_force_and_then_deleted_or_extended(db_url):
    # Refused by the commands that need an ended run, each naming end-run.
    refused = one_error_line(cli(db_url, "db", "delete-run", "exp", "--run", "stuck", "--yes"))
    assert "is RUNNING" in refused and "airflow-trials db end-run exp --run stuck" in refused
    refused = one_error_line(cli(db_url, "extend", "stuck", "--stop", "training_iteration=5"))
    assert "is still running" in refused and "airflow-trials db end-run" in refused

    # A trial not ended refuses it, naming the trial; nothing changes.
    refused = one_error_line(end_run(db_url, "stuck"))
    assert refused.startswith(
        "Error: Run stuck (id 1) of experiment exp has 1 trial(s) that have not ended: stuck-b "
        "(PENDING)."
    )
    assert "--force" in refused and "nothing was changed" in refused
    record, trials = read(db_url, "stuck")
    assert record.status.value == "RUNNING" and trials["stuck-b"].status is TrialStatus.PENDING

    # --force records the trial ERROR through the status setter, then ends the run.
    forced = end_run(db_url, "stuck", "--force", "--json")
    assert forced.returncode == 0, forced.stderr
    assert json.loads(forced.stdout) == {
        "experiment": "exp",
        "experiment_run_id": 1,
        "run_key": "stuck",
        "status": "FAILED",
        "reason": REASON,
        "trials_ended": [{"trial_id": "stuck-b", "was": "PENDING", "status": "ERROR"}],
        "extensions_ended": [],
    }
    record, trials = read(db_url, "stuck")
    assert (record.status.value, record.end_reason) == ("FAILED", REASON)
    assert record.ended_at is not None
    stuck = trials["stuck-b"]
    assert stuck.status is TrialStatus.ERROR and stuck.status_cause is StatusCause.ABANDONED
    assert "ended by hand ('airflow-trials db end-run --force')" in stuck.error_msg
    assert REASON in stuck.error_msg
    assert trials["stuck-a"].status is TrialStatus.TERMINATED  # an ended trial keeps its end
    listed = json.loads(cli(db_url, "runs", "exp", "-o", "json").stdout)
    assert {r["run_key"]: r["end_reason"] for r in listed} == {"stuck": REASON, "done": None}

    # Ended: extend accepts it (new samples are new configs: one pass over a grid of two) ...
    plan = cli(db_url, "extend", "stuck", "--num-samples", "+1", "--dry-run")
    assert plan.returncode == 0, plan.stderr
    assert "+1 samples (1 pass(es) over the grid's 2 combinations, each drawing lr afresh" in (
        plan.stdout
    )
    assert "2 new trials" in plan.stdout and "Dry run: would trigger DAG exp" in plan.stdout
    # ... and delete-run deletes it.
    deleted = cli(
        db_url, "db", "delete-run", "exp", "--run", "stuck", "--yes", "--keep-checkpoints"
    )
    assert deleted.returncode == 0, deleted.stderr
    store = TrialStore(db_url)
    try:
        assert [r.run_key for r in store.reader.list_experiment_runs("exp")] == ["done"]
    finally:
        store.dispose()


def test_a_run_without_unended_trials_ends_with_the_status_asked_and_only_once(db_url):
    store = TrialStore(db_url)
    try:
        store.record_transition("stuck-b", Transition.ABANDONED, why="its task was lost")
    finally:
        store.dispose()
    result = end_run(db_url, "stuck", "--status", "success")
    assert result.returncode == 0, result.stderr
    expected = f"Run stuck (id 1) of experiment exp: RUNNING -> SUCCESS; reason: {REASON}"
    assert result.stdout.startswith(expected)
    record, _ = read(db_url, "stuck")
    assert (record.status.value, record.end_reason) == ("SUCCESS", REASON)

    # Ended: refused in one line that names the run and its status; nothing changes.
    for run, run_id in (("stuck", 1), ("done", 2)):
        refused = one_error_line(end_run(db_url, run, "--force"))
        assert refused.startswith(
            f"Error: Run {run} (id {run_id}) of experiment exp has already ended: it is SUCCESS at "
        )
        assert "nothing was changed" in refused
    assert read(db_url, "stuck")[0] == record
    assert read(db_url, "done")[0].end_reason is None


def test_a_running_extension_ends_with_its_run(db_url):
    store = TrialStore(db_url)
    try:
        store.begin_run_extension(
            run_pk(store, "done"),
            "extend-1",
            num_samples_added=0,
            stop_before={"training_iteration": 3},
            stop_after={"training_iteration": 5},
            trials_continued=[],
            trials_added=[],
        )
    finally:
        store.dispose()
    result = end_run(db_url, "done")
    assert result.returncode == 0, result.stderr
    assert "its extension by DAG run extend-1: RUNNING -> FAILED" in result.stdout
    store = TrialStore(db_url)
    try:
        (extension,) = store.reader.list_run_extensions(run_pk(store, "done"))
    finally:
        store.dispose()
    assert extension.status.value == "FAILED" and extension.ended_at is not None


def test_a_blank_reason_is_refused_and_the_reason_is_required(db_url):
    blank = cli(db_url, "db", "end-run", "exp", "--run", "stuck", "--reason", "  ")
    assert "--reason is empty" in one_error_line(blank)
    missing = cli(db_url, "db", "end-run", "exp", "--run", "stuck")
    assert missing.returncode == 2 and "--reason" in missing.stderr
    assert read(db_url, "stuck")[0].status.value == "RUNNING"
