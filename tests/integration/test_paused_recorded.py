"""A trial its scheduler pauses is recorded PAUSED in the trials DB (not left RUNNING) while it
waits, and RUNNING again once it resumes: a TrialRunner's PBT run recorded by TrialsDbCallback on a
real local Ray, on a SQLite file and on PostgreSQL."""

from __future__ import annotations

import random

import pytest

from airflow_trials import (
    Callback,
    PopulationBasedTraining,
    Trial,
    TrialRunner,
    TrialsDbCallback,
    TrialStatus,
)
from airflow_trials.store import TrialStore
from tests.contract.conftest import postgres_schema_url  # noqa: F401 - the fixture


@pytest.fixture(params=["sqlite-file", pytest.param("postgresql", marks=pytest.mark.postgres)])
def db_url(request, tmp_path) -> str:
    if request.param == "postgresql":
        return request.getfixturevalue("postgres_schema_url")
    return f"sqlite:///{tmp_path / 'trials.db'}"


class StoredStatusWhilePaused(Callback):
    """Reads each exploited trial's stored status while it is paused: PBT exploits a trial only
    after pausing it, and resumes it later (``on_trial_start``)."""

    def __init__(self, store: TrialStore) -> None:
        self.store = store
        self.while_paused: list[tuple[str, TrialStatus, TrialStatus]] = []
        self.resumed: set[str] = set()

    def on_trial_exploit(self, trial, exploit, old_config) -> None:
        stored = self.store.reader.get_trial(trial.trial_id).status
        self.while_paused.append((trial.trial_id, trial.status, stored))

    def on_trial_start(self, trial) -> None:
        if any(trial_id == trial.trial_id for trial_id, _, _ in self.while_paused):
            self.resumed.add(trial.trial_id)


def test_a_trial_pbt_paused_is_stored_paused_until_it_resumes(ray_cluster, storage, db_url):
    scheduler = PopulationBasedTraining(
        time_attr="training_iteration",
        metric="score",
        mode="max",
        perturbation_interval=2,
        hyperparam_mutations={"scale": [0.1, 0.5, 1.0, 2.0, 4.0]},
        quantile_fraction=0.5,
        resample_probability=0.0,
        rng=random.Random(0),
    )
    store = TrialStore(db_url, create=True)
    # The recorder writes at once (no write-behind), so the probe after it reads what it wrote.
    recorder = TrialsDbCallback(metric="score", mode="max", store=store, run_key="pbt-paused")
    probe = StoredStatusWhilePaused(store)
    runner = TrialRunner(
        "pbt-paused",
        storage_path=storage,
        scheduler=scheduler,
        callbacks=[recorder, probe],
        stop={"training_iteration": 6},
        wait_timeout_s=10.0,
    )
    for trial_id, scale in {"a": 2.0, "b": 1.0, "c": 0.5, "d": 0.1}.items():
        runner.add_trial(
            Trial(
                "tests.trainables:counting",
                {"scale": scale},
                trial_id=trial_id,
                experiment_name="pbt-paused",
                resources={"cpu": 1},
            )
        )
    try:
        runner.run()
        assert probe.while_paused, "PBT paused and exploited no trial"
        # The defect: the trials DB said RUNNING while the trial was paused.
        assert {(live, stored) for _, live, stored in probe.while_paused} == {
            (TrialStatus.PAUSED, TrialStatus.PAUSED)
        }
        assert probe.resumed  # each went on, recorded RUNNING again, and ended
        assert {t.status for t in store.reader.list_trials()} == {TrialStatus.TERMINATED}
    finally:
        store.dispose()
