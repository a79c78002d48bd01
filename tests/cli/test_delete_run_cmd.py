"""``airflow-trials db delete-run`` on a seeded SQLite trials DB with checkpoints on a local
storage: the dry run, the question, ``--yes``, ``--keep-checkpoints``, ``--storage-path``, JSON, a
RUNNING run or an unended trial refused, ``--run`` required, and nothing outside the storage root
deleted."""

from __future__ import annotations

import json
import os

import pytest
from typer.testing import CliRunner

from airflow_trials.cli import app
from airflow_trials.core.end import TrialEnd
from airflow_trials.core.fate import Transition
from airflow_trials.core.status import TrialStatus
from airflow_trials.storage.trial_storage import TrialStorage
from airflow_trials.store import TrialStore
from tests.factories import add_checkpoint, add_results

runner = CliRunner()


@pytest.fixture
def seeded(tmp_path, monkeypatch):
    """Runs ``old`` (SUCCESS) and ``live`` (RUNNING) of experiment ``exp``, two ended trials each,
    each trial with two checkpoint folders and a trial folder (trial.json) on ``tmp_path/storage``,
    the configured storage root."""
    monkeypatch.setenv("AIRFLOW_TRIALS_STORAGE", str(tmp_path / "storage"))
    url = f"sqlite:///{tmp_path / 'trials.db'}"
    storage = TrialStorage(str(tmp_path / "storage"))
    store = TrialStore(url, create=True)
    try:
        store.ensure_experiment("exp", metric="loss", mode="min")
        for run_key, status in (("old", "SUCCESS"), ("live", "RUNNING")):
            run = store.create_experiment_run("exp", run_key)
            for letter in "ab":
                trial_id = f"{run_key}-{letter}"
                store.upsert_trial(
                    trial_id, trainable="m:f", config={"x": 1}, resources={"cpu": 1},
                    max_failures=0, experiment_run_id=run,
                )  # fmt: skip
                store.record_transition(trial_id, Transition.PLACED)
                add_results(store, trial_id, [{"training_iteration": 1, "loss": 0.5}])
                store.record_end(TrialEnd(trial_id, "exp", TrialStatus.TERMINATED))
                storage.write_json(f"{storage.trial_dir('exp', trial_id)}/trial.json", {})
                for iteration in (1, 2):
                    path = storage.checkpoint_dir("exp", trial_id, iteration)
                    os.makedirs(path)
                    add_checkpoint(store, trial_id, path, iteration)
            store.finish_experiment_run(run, status)
    finally:
        store.dispose()
    return url, storage


def invoke(url: str, *args: str, input: str | None = None):
    return runner.invoke(app, ["db", "delete-run", "exp", *args, "--db-url", url], input=input)


def trials_of(url: str) -> list[str]:
    store = TrialStore(url)
    try:
        return sorted(t.trial_id for t in store.reader.list_trials())
    finally:
        store.dispose()


def checkpoints_on(storage: TrialStorage, trial_id: str) -> list[str]:
    folder = storage.trial_dir("exp", trial_id)
    return sorted(os.listdir(folder)) if os.path.isdir(folder) else []


def test_dry_run_says_what_it_would_delete_and_deletes_nothing(seeded):
    url, storage = seeded
    result = invoke(url, "--run", "old", "--dry-run")
    assert result.exit_code == 0, result.output
    assert "Run old" in result.output and "SUCCESS" in result.output
    assert "at_trials: 2" in result.output and "at_results: 2" in result.output
    assert (
        "these 4 path(s) on the storage" in result.output
        and "Dry run: nothing was deleted." in result.output
    )
    assert trials_of(url) == ["live-a", "live-b", "old-a", "old-b"]
    assert checkpoints_on(storage, "old-a") == [
        "checkpoint_000001",
        "checkpoint_000002",
        "trial.json",
    ]


def test_asks_first_and_no_deletes_nothing(seeded):
    url, storage = seeded
    result = invoke(url, "--run", "old", input="n\n")
    assert result.exit_code == 1
    assert "Delete them?" in result.output and "Nothing was deleted of run old" in result.output
    for trial_id in ("old-a", "old-b"):  # the question names every path it would delete
        for iteration in (1, 2):
            assert storage.checkpoint_dir("exp", trial_id, iteration) in result.output
    assert trials_of(url) == ["live-a", "live-b", "old-a", "old-b"]
    assert len(checkpoints_on(storage, "old-b")) == 3


def test_yes_deletes_the_rows_then_the_checkpoints_and_leaves_the_other_run(seeded):
    url, storage = seeded
    result = invoke(url, "--run", "old", "--yes")
    assert result.exit_code == 0, result.output
    assert "deleted 9 rows" in result.output  # 2 results, 4 checkpoints, 2 trials and the run
    assert trials_of(url) == ["live-a", "live-b"]
    assert checkpoints_on(storage, "old-a") == ["trial.json"]  # its folder is kept without
    assert len(checkpoints_on(storage, "live-a")) == 3  # --storage-path


def test_storage_path_also_deletes_the_trials_folders(seeded):
    url, storage = seeded
    result = invoke(url, "--run", "old", "--yes", "--storage-path", storage.root)
    assert result.exit_code == 0, result.output
    assert not os.path.exists(storage.trial_dir("exp", "old-a"))
    assert not os.path.exists(storage.trial_dir("exp", "old-b"))
    assert len(checkpoints_on(storage, "live-b")) == 3


def test_keep_checkpoints_deletes_the_rows_only_and_json_says_so(seeded):
    url, storage = seeded
    result = invoke(url, "--run", "old", "--yes", "--keep-checkpoints", "--json")
    assert result.exit_code == 0, result.output
    body = json.loads(result.output)
    assert body["rows"]["at_trials"] == 2 and body["rows"]["at_experiment_runs"] == 1
    assert (body["checkpoints"], body["files_deleted"], body["checkpoints_kept"]) == (4, [], True)
    assert trials_of(url) == ["live-a", "live-b"]
    assert len(checkpoints_on(storage, "old-a")) == 3


def test_a_running_run_is_refused_with_what_to_do(seeded):
    url, storage = seeded
    result = invoke(url, "--run", "live", "--yes")
    assert result.exit_code == 1
    assert "is RUNNING" in result.output and "nothing was deleted" in result.output
    assert trials_of(url) == ["live-a", "live-b", "old-a", "old-b"]
    assert len(checkpoints_on(storage, "live-a")) == 3


def test_an_unknown_run_is_one_error_line(seeded):
    url, _ = seeded
    result = invoke(url, "--run", "nope", "--yes")
    assert result.exit_code == 1 and result.output.startswith("Error:")


def test_run_is_required(seeded):
    url, storage = seeded
    result = invoke(url, "--yes")
    assert result.exit_code == 2 and "Missing option '--run'" in result.output
    assert trials_of(url) == ["live-a", "live-b", "old-a", "old-b"]
    assert len(checkpoints_on(storage, "old-a")) == 3


def add_checkpoint_at(url, trial_id, path, iteration):
    store = TrialStore(url)
    try:
        add_checkpoint(store, trial_id, path, iteration)
    finally:
        store.dispose()


def test_a_checkpoint_outside_the_storage_root_refuses_the_whole_delete(seeded, tmp_path):
    url, storage = seeded
    precious = tmp_path / "precious"  # a row names it; the storage root does not hold it
    (precious / "sub").mkdir(parents=True)
    (precious / "sub" / "data").write_text("keep me")
    add_checkpoint_at(url, "old-a", str(precious), 3)
    escaping = os.path.join(storage.trial_dir("exp", "old-b"), "checkpoint_000009")
    os.symlink(precious, escaping)  # inside the root, pointing out of it
    add_checkpoint_at(url, "old-b", escaping, 9)
    for args in ((), ("--storage-path", storage.root)):
        result = invoke(url, "--run", "old", "--yes", *args)
        assert result.exit_code == 1, result.output
        assert str(precious) in result.output and escaping in result.output
        assert "Nothing was deleted" in result.output
        assert (precious / "sub" / "data").read_text() == "keep me"
        assert trials_of(url) == ["live-a", "live-b", "old-a", "old-b"]  # the rows too
        assert len(checkpoints_on(storage, "old-a")) == 3
    kept = invoke(url, "--run", "old", "--yes", "--keep-checkpoints")  # rows only: allowed
    assert kept.exit_code == 0, kept.output
    assert (precious / "sub" / "data").read_text() == "keep me"


def test_a_storage_path_that_does_not_hold_the_checkpoints_deletes_nothing(seeded, tmp_path):
    url, storage = seeded
    result = invoke(url, "--run", "old", "--yes", "--storage-path", str(tmp_path / "other"))
    assert result.exit_code == 1 and "Nothing was deleted" in result.output
    assert trials_of(url) == ["live-a", "live-b", "old-a", "old-b"]
    assert len(checkpoints_on(storage, "old-a")) == 3


def test_a_run_with_a_trial_not_ended_is_refused_with_its_id(seeded):
    url, storage = seeded
    store = TrialStore(url)
    try:
        run = store.reader.resolve_run("exp", "old").id
        store.upsert_trial(
            "old-c", trainable="m:f", config={}, resources={"cpu": 1}, max_failures=0,
            experiment_run_id=run,
        )  # fmt: skip
    finally:
        store.dispose()
    result = invoke(url, "--run", "old", "--yes")
    assert result.exit_code == 1
    assert "old-c (PENDING)" in result.output and "nothing was deleted" in result.output
    assert trials_of(url) == ["live-a", "live-b", "old-a", "old-b", "old-c"]
    assert len(checkpoints_on(storage, "old-a")) == 3


def test_a_url_storage_deletes_its_checkpoints_and_the_local_log_folders(tmp_path, monkeypatch):
    """With checkpoints on an object store, the trials' log folders are local (below
    ``~/airflow_trials_results``): each is deleted below its own root, and the command ends
    well, not with the rows gone and a refusal of the local folder."""
    import fsspec

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    root = "memory://bucket-delete-run/trials"
    url = f"sqlite:///{tmp_path / 'trials.db'}"
    storage = TrialStorage(root)
    store = TrialStore(url, create=True)
    try:
        store.ensure_experiment("exp", metric="loss", mode="min")
        run = store.create_experiment_run("exp", "old")
        store.upsert_trial(
            "old-a", trainable="m:f", config={"x": 1}, resources={"cpu": 1},
            max_failures=0, experiment_run_id=run,
        )  # fmt: skip
        store.record_transition("old-a", Transition.PLACED)
        store.record_end(TrialEnd("old-a", "exp", TrialStatus.TERMINATED))
        checkpoint = storage.checkpoint_dir("exp", "old-a", 1)
        storage.fs.pipe(f"{checkpoint}/model.bin", b"m")
        add_checkpoint(store, "old-a", checkpoint, 1)
        store.finish_experiment_run(run, "SUCCESS")
    finally:
        store.dispose()
    log_dir = os.path.dirname(storage.log_paths("exp", "old-a")[0])
    os.makedirs(log_dir)
    result = invoke(url, "--run", "old", "--yes", "--storage-path", root)
    assert result.exit_code == 0, result.output
    assert trials_of(url) == []
    assert not fsspec.filesystem("memory").exists(checkpoint)
    assert not os.path.exists(log_dir)
