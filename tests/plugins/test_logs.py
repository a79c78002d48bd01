"""A trial page shows the tail of the trial's stdout/stderr and serves the files when the
dashboard's machine can read them, and says where they are when it cannot."""

from __future__ import annotations

import os

import pytest

from airflow_trials.core.end import TrialEnd
from airflow_trials.core.fate import Transition, after_failure
from airflow_trials.core.status import TrialStatus
from tests.factories import add_checkpoint, add_results
from tests.plugins.conftest import HOSTILE


def add_trial(store, trial_id, checkpoint=None, status="TERMINATED"):
    store.ensure_experiment("logged", metric="loss", mode="min")
    runs = [r for r in store.reader.list_experiment_runs("logged") if r.run_key == "r1"]
    run = (
        runs[0].id
        if runs
        else store.create_experiment_run("logged", "r1", dag_id="tune_mnist", run_id="r1")
    )
    store.upsert_trial(
        trial_id,
        trainable="pkg.train:fn",
        config={},
        resources={"cpu": 1},
        max_failures=0,
        experiment_run_id=run,
        dag_id="tune_mnist",
        run_id="r1",
        task_id="logged.trial",
        map_index=0,
    )
    store.record_transition(trial_id, Transition.PLACED)
    add_results(store, trial_id, [{"training_iteration": 1, "loss": 0.5}])
    if checkpoint:
        add_checkpoint(store, trial_id, checkpoint, 1, score=0.5)
    if status != "RUNNING":
        fate = None if status == "TERMINATED" else after_failure(trial_id, 0, 0)
        store.record_end(TrialEnd(trial_id, "logged", TrialStatus(status)), fate)


def write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


@pytest.fixture
def storage(tmp_path, monkeypatch):
    root = tmp_path / "storage"
    monkeypatch.setenv("AIRFLOW_TRIALS_STORAGE", str(root))
    return root


def test_a_finished_trials_page_shows_its_saved_logs_tail_and_serves_the_files(
    make_dashboard, trials_store, storage
):
    trial_dir = storage / "logged" / "t1"
    add_trial(trials_store, "t1", checkpoint=str(trial_dir / "checkpoint_000001"))
    stdout = "".join(f"epoch {i}\n" for i in range(300)) + f"{HOSTILE}\n"
    write(str(trial_dir / "logs" / "stdout.log"), stdout)
    write(str(trial_dir / "logs" / "stderr.log"), "a warning on stderr\n")
    dashboard = make_dashboard(trials_store)
    page = dashboard.get("/trials/t1")
    assert page.status_code == 200, page.text
    html = page.text
    assert "epoch 299" in html and "a warning on stderr" in html
    assert "epoch 50\n" not in html  # the tail only: the newest 200 lines
    assert HOSTILE not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert 'href="/trials/trials/t1/logs/stdout"' in html
    download = dashboard.get("/trials/t1/logs/stdout")
    assert download.status_code == 200 and download.text == stdout  # the whole file
    assert download.headers["content-type"].startswith("text/plain")
    assert 'attachment; filename="t1-stdout.log"' == download.headers["content-disposition"]
    assert (
        dashboard.get("/trials/t1/logs/stdout", user="bob").status_code == 403
    )  # bob may not read tune_mnist
    assert dashboard.get("/trials/t1/logs/passwd").status_code == 422


def test_a_running_trials_page_shows_the_file_its_node_writes(
    make_dashboard, trials_store, storage
):
    add_trial(
        trials_store, "t2", status="RUNNING"
    )  # no checkpoint yet: found from the storage root
    write(str(storage / "logged" / "t2" / "stdout.log"), "step 1\nstep 2\n")
    write(str(storage / "logged" / "t2" / "logs" / "stdout.log"), "an earlier try\n")
    html = make_dashboard(trials_store).get("/trials/t2").text
    assert "step 2" in html and "an earlier try" not in html
    assert (
        "It is on the trial's Ray node while it runs, and is copied at its end to" in html
    )  # no stderr.log


def test_logs_the_dashboard_cannot_read_are_named_not_served(make_dashboard, trials_store, storage):
    add_trial(trials_store, "t3", checkpoint="s3://bucket/trials/logged/t3/checkpoint_000001")
    dashboard = make_dashboard(trials_store)
    html = dashboard.get("/trials/t3").text
    assert "Not readable from the dashboard's machine. It is kept at" in html
    assert "s3://bucket/trials/logged/t3/logs/stdout.log" in html
    missing = dashboard.get("/trials/t3/logs/stderr")
    assert (
        missing.status_code == 404
        and "s3://bucket/trials/logged/t3/logs/stderr.log" in missing.text
    )


def test_a_log_symlinked_to_a_file_outside_the_storage_root_is_not_served(
    make_dashboard, trials_store, storage, tmp_path
):
    secret = tmp_path / "airflow.cfg"
    write(str(secret), "jwt_secret = the-secret\n")
    trial_dir = storage / "logged" / "t4"
    add_trial(trials_store, "t4", checkpoint=str(trial_dir / "checkpoint_000001"))
    write(str(trial_dir / "logs" / "stderr.log"), "a plain stderr\n")
    os.symlink(secret, trial_dir / "logs" / "stdout.log")  # what a trainable may leave
    dashboard = make_dashboard(trials_store)
    html = dashboard.get("/trials/t4").text
    assert "the-secret" not in html and "a plain stderr" in html
    refused = dashboard.get("/trials/t4/logs/stdout")
    assert refused.status_code == 404 and "the-secret" not in refused.text
    assert "cannot be read from the dashboard" in refused.text
    served = dashboard.get("/trials/t4/logs/stderr")
    assert served.status_code == 200 and served.text == "a plain stderr\n"


def test_a_checkpoint_recorded_outside_the_storage_root_names_no_log_directory(
    make_dashboard, trials_store, storage, tmp_path
):
    elsewhere = tmp_path / "elsewhere" / "t5"  # the trials DB names it; the root does not hold it
    write(str(elsewhere / "logs" / "stdout.log"), "the-secret of another place\n")
    add_trial(trials_store, "t5", checkpoint=str(elsewhere / "checkpoint_000001"))
    dashboard = make_dashboard(trials_store)
    assert "the-secret" not in dashboard.get("/trials/t5").text
    refused = dashboard.get("/trials/t5/logs/stdout")
    assert refused.status_code == 404 and "the-secret" not in refused.text
