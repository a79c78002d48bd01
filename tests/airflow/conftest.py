"""Fixtures for tests that run real Airflow (dag.test) against real Ray and a real trials store."""

from __future__ import annotations

import importlib.util
import os
from types import SimpleNamespace

import pytest

from tests.conftest import remove_leftovers, start_ray


@pytest.fixture
def trials_env(airflow_home, tmp_path, monkeypatch):
    """A fresh, migrated trials DB and checkpoint storage, found by the hooks' fallbacks."""
    yield from _trials_env(f"sqlite:///{tmp_path / 'trials.db'}", tmp_path, monkeypatch)


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def trials_env_any_db(request, airflow_home, tmp_path, monkeypatch):
    """:func:`trials_env` on a SQLite file, then on a new PostgreSQL database (skipped, with the
    reason, when AIRFLOW_TRIALS_TEST_POSTGRES_URL is unset)."""
    if request.param == "sqlite":
        yield from _trials_env(f"sqlite:///{tmp_path / 'trials.db'}", tmp_path, monkeypatch)
        return
    from tests.contract.conftest import new_postgres_database

    with new_postgres_database("at_airflow") as database:
        yield from _trials_env(database.url, tmp_path, monkeypatch)


def _trials_env(url, tmp_path, monkeypatch):
    from airflow_trials.store import TrialStore

    storage = tmp_path / "storage"
    storage.mkdir()
    monkeypatch.setenv("AIRFLOW_TRIALS_DB_URL", url)
    monkeypatch.setenv("AIRFLOW_TRIALS_STORAGE", str(storage))
    start_ray(num_cpus=2, num_gpus=2)
    store = TrialStore(url, create=True)
    try:
        yield SimpleNamespace(url=url, storage=str(storage), store=store)
    finally:
        store.dispose()
        remove_leftovers()


class FakeTI:
    """The task-instance fields RunTrialOperator reads, for calling execute() directly (a worker
    restart is simulated by calling it again with the next try_number; a try after a clear by
    giving ``max_tries``, which Airflow sets to ``try_number + retries`` when it clears)."""

    def __init__(
        self, dag_id="dag", run_id="run1", task_id="trial", map_index=-1, try_number=1, max_tries=0
    ):
        self.dag_id, self.run_id, self.task_id = dag_id, run_id, task_id
        self.map_index, self.try_number, self.max_tries = map_index, try_number, max_tries
        self.xcom = {}

    def xcom_push(self, key, value):
        self.xcom[key] = value


@pytest.fixture
def fake_context():
    def make(**kwargs):
        return {"ti": FakeTI(**kwargs)}

    return make


def dags_folder() -> str:
    return os.environ["AIRFLOW__CORE__DAGS_FOLDER"]


def load_dag_source(name: str, source: str):
    """Write a DAG file ``<name>.py`` into the DAGs folder (dag.test() serializes DAGs from there)
    and return the ``dag`` it defines."""
    path = os.path.join(dags_folder(), f"{name}.py")
    with open(path, "w") as f:
        f.write(source)
    spec = importlib.util.spec_from_file_location(f"test_dag_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.dag
