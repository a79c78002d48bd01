"""Case 7: the main job (``airflow-trials run --keep-running``) is stopped with Ctrl-C mid-run,
which drains the running trials (``execution/driver/drain.py``), stops Airflow and the Ray head it
started, and then started again on the same state directory.

The second job resumes the interrupted DAG run instead of starting over: the deferred trial tasks'
triggers find their actors gone with the old Ray cluster (an infrastructure loss, so no failure is
counted), and each trial resumes on the new head from its latest checkpoint.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from airflow_trials.exceptions import StoreError
from airflow_trials.experiment import trial_ids
from tests.conftest import REPO
from tests.faults.conftest import HOLD_AT, ITERATIONS, experiment_dag_source
from tests.faults.stack import base_env, free_port, wait_for
from tests.faults.trainables import gate, read_journal

pytestmark = pytest.mark.timeout(1500)

DAG_ID = "faults_main_job_interrupted"
TRIALS = 2


def _job(
    state: Path,
    dags: Path,
    log: Path,
    *extra: str,
    dag_id: str = DAG_ID,
    drain_timeout_s: float | None = None,
) -> subprocess.Popen[bytes]:
    cli = os.path.join(os.path.dirname(sys.executable), "airflow-trials")
    env = {**base_env(), "COLUMNS": "200"}
    if drain_timeout_s is not None:
        env["AIRFLOW__AIRFLOW_TRIALS__DRAIN_TIMEOUT_SECONDS"] = str(drain_timeout_s)
    env.pop("RAY_ADDRESS", None)
    env.pop("AIRFLOW_TRIALS_DB_URL", None)
    return subprocess.Popen(
        [
            cli,
            "run",
            "--dag-id",
            dag_id,
            "--dags-folder",
            str(dags),
            "--state-dir",
            str(state),
            "--num-cpus",
            "4",
            "--api-port",
            str(free_port()),
            "--plot",
            str(state.parent / "curves.png"),
            "--timeout-s",
            "900",
            *extra,
        ],
        cwd=REPO,
        env=env,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )


def test_interrupted_main_job_resumes_its_run_and_loses_nothing(tmp_path):
    from airflow_trials.store import TrialStore

    state, dags, journal = tmp_path / "state", tmp_path / "dags", tmp_path / "journal"
    for folder in (dags, journal):
        folder.mkdir()
    (dags / f"{DAG_ID}.py").write_text(
        experiment_dag_source(DAG_ID, journal, trials=TRIALS, max_failures=0)
    )

    # Held mid-iteration, the trials cannot pause: the drain gives up after its bound.
    first = _job(state, dags, tmp_path / "first.log", "--keep-running", drain_timeout_s=5)
    try:

        def all_held_and_recorded() -> bool:
            # Held mid-run, and their triggers have recorded the checkpoint they hold after.
            if not (state / "trials.db").exists():
                return False
            store = TrialStore(f"sqlite:///{state / 'trials.db'}")
            try:
                trials = store.reader.list_trials(experiment_name=DAG_ID)
                latest = [store.reader.latest_checkpoint(t.trial_id) for t in trials]
            except StoreError:  # the job created the file and is still migrating it
                return False
            finally:
                store.dispose()
            return len(trials) == TRIALS and all(
                c is not None and c.iteration == HOLD_AT for c in latest
            )

        wait_for(
            all_held_and_recorded,
            600,
            "every trial to run and hold mid-run, its checkpoint recorded",
            guard=lambda: _alive(first, tmp_path / "first.log"),
        )
        first.send_signal(signal.SIGINT)  # Ctrl-C
        assert first.wait(timeout=180) == 130, (tmp_path / "first.log").read_text()[-3000:]
    finally:
        if first.poll() is None:
            first.kill()
    out = (tmp_path / "first.log").read_text()
    assert "Interrupted: stopping everything this job started." in out
    assert f"Drained {TRIALS} trial(s) in " in out, out[-3000:]
    assert "Did not pause within 5 s" in out, out[-3000:]
    gate(journal).touch()  # the resumed trials run through

    second = _job(state, dags, tmp_path / "second.log")
    try:
        code = second.wait(timeout=1200)
    finally:
        if second.poll() is None:
            second.kill()
    out = (tmp_path / "second.log").read_text()
    assert code == 0, out[-4000:]
    assert "Resuming faults_main_job_interrupted run main_job__" in out, out[-4000:]
    assert ": success." in out, out[-4000:]

    store = TrialStore(f"sqlite:///{state / 'trials.db'}")
    try:
        (run,) = store.reader.list_experiment_runs(DAG_ID)
        assert run.status.value == "SUCCESS"
        ids = trial_ids(DAG_ID, DAG_ID, run.run_key, TRIALS)
        for trial_id in ids:
            record = store.reader.get_trial(trial_id)
            # Lost with the Ray head the first job stopped: not a failure of the trial.
            assert (record.status.value, record.num_failures, record.error_msg) == (
                "TERMINATED",
                0,
                None,
            )
            iterations = [r["training_iteration"] for r in store.reader.get_results(trial_id)]
            assert iterations == list(range(1, ITERATIONS + 1)), (trial_id, iterations)
            incarnations = read_journal(journal, trial_id)
            assert len(incarnations) == 2, (
                incarnations
            )  # the first, and the one resumed on the new head
            old, new = sorted(incarnations, key=lambda i: i.started)
            assert old.last_seen < new.started, (old, new)  # never two copies at once
            assert new.resumed_from == HOLD_AT  # from its latest checkpoint, not from scratch
    finally:
        store.dispose()


DRAIN_DAG_ID = "faults_main_job_drained"
#: Enough that the trials still train when the job is stopped, past their first checkpoint.
DRAIN_ITERATIONS = 100
CHECKPOINT_FREQ = 10


def test_sigterm_drains_the_trials_so_that_their_resume_re_runs_nothing(tmp_path):
    """SIGTERM (handled as Ctrl-C) while the trials train between two checkpoints (a class
    trainable checkpointing every 10 iterations): the job first drains them (each checkpoints the
    iteration it finished and pauses), then stops Airflow and Ray. The next job resumes each from
    that checkpoint: no iteration is trained twice, no result is stored twice, no failure is
    counted."""
    from airflow_trials.store import TrialStore

    state, dags, journal = tmp_path / "state", tmp_path / "dags", tmp_path / "journal"
    for folder in (dags, journal):
        folder.mkdir()
    (dags / f"{DRAIN_DAG_ID}.py").write_text(
        experiment_dag_source(
            DRAIN_DAG_ID,
            journal,
            trials=TRIALS,
            iterations=DRAIN_ITERATIONS,
            sleep_s=0.5,
            hold_at=0,
            max_failures=0,
            trainable="tests.faults.trainables:JournaledClass",
            extra=f"checkpoint_freq={CHECKPOINT_FREQ},",
        )
    )
    db_url = f"sqlite:///{state / 'trials.db'}"

    def past_a_checkpoint() -> bool:
        # Each trial trained past its first checkpoint, as its own journal says: the trials DB
        # may lag far behind while the triggerer starts, and the trials must still be training
        # when the job is stopped (DRAIN_ITERATIONS leaves them tens of seconds more).
        trained = {
            path.stem: read_journal(journal, path.stem)[-1].iterations
            for path in journal.glob("*.jsonl")
        }
        return len(trained) == TRIALS and all(
            its and CHECKPOINT_FREQ + 2 <= its[-1] for its in trained.values()
        )

    first = _job(state, dags, tmp_path / "first.log", "--keep-running", dag_id=DRAIN_DAG_ID)
    try:
        wait_for(
            past_a_checkpoint,
            600,
            "every trial to record results past its first checkpoint",
            guard=lambda: _alive(first, tmp_path / "first.log"),
        )
        first.send_signal(signal.SIGTERM)  # a service manager's stop, handled as Ctrl-C
        assert first.wait(timeout=180) == 130, (tmp_path / "first.log").read_text()[-3000:]
    finally:
        if first.poll() is None:
            first.kill()
    out = (tmp_path / "first.log").read_text()
    assert f"Drained {TRIALS} trial(s) in " in out and f"{TRIALS} paused" in out, out[-3000:]

    second = _job(state, dags, tmp_path / "second.log", dag_id=DRAIN_DAG_ID)
    try:
        code = second.wait(timeout=1200)
    finally:
        if second.poll() is None:
            second.kill()
    assert code == 0, (tmp_path / "second.log").read_text()[-4000:]

    store = TrialStore(db_url)
    try:
        (run,) = store.reader.list_experiment_runs(DRAIN_DAG_ID)
        for trial_id in trial_ids(DRAIN_DAG_ID, DRAIN_DAG_ID, run.run_key, TRIALS):
            record = store.reader.get_trial(trial_id)
            assert (record.status.value, record.num_failures) == ("TERMINATED", 0)
            iterations = [r["training_iteration"] for r in store.reader.get_results(trial_id)]
            assert iterations == list(range(1, DRAIN_ITERATIONS + 1)), (trial_id, iterations)
            old, new = read_journal(journal, trial_id)
            # Resumed from the drained checkpoint: the last iteration the first job trained,
            # past the checkpoint its policy last took. Nothing was trained twice.
            assert new.resumed_from == old.iterations[-1] > CHECKPOINT_FREQ, (old, new)
            assert old.last_seen < new.started, (old, new)  # never two copies at once
    finally:
        store.dispose()


def _alive(proc: subprocess.Popen[bytes], log: Path) -> None:
    if proc.poll() is not None:
        raise AssertionError(
            f"the main job exited early ({proc.returncode}):\n{log.read_text()[-3000:]}"
        )
