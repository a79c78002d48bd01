"""Contract of a run's data version in the trials store (migration 0020), on every backend: the
run records the version it was created with, a second create keeps the first, a version too long
is refused before anything is written, and an upgrade leaves the runs it finds without one while
a downgrade keeps them."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from airflow_trials.store.migration import current_revision
from tests.contract.conftest import MEMORY, POSTGRESQL, SQLITE_FILE
from tests.contract.test_store import HEAD_REVISION, schema_differences
from tests.contract.test_store_stop_reason import _migrate


class DataVersionContract:
    backend: str

    def test_a_run_keeps_the_data_version_it_was_created_with(self, store):
        run = store.create_experiment_run("mnist", "r1", data_version="v0007")
        # Idempotent on (experiment, run_key): a second create (a retried suggest) keeps it.
        assert store.create_experiment_run("mnist", "r1", data_version="v0008") == run
        store.create_experiment_run("mnist", "r2")
        by_key = {r.run_key: r.data_version for r in store.reader.list_experiment_runs("mnist")}
        assert by_key == {"r1": "v0007", "r2": None}
        assert store.reader.resolve_run("mnist", "r1").data_version == "v0007"

    def test_a_data_version_too_long_is_refused_before_anything_is_written(self, store):
        with pytest.raises(ValueError, match="data_version of run r1 must be .* at most 250"):
            store.create_experiment_run("mnist", "r1", data_version="v" * 251)
        with pytest.raises(ValueError, match="data_version of run r1 must be a non-empty"):
            store.create_experiment_run("mnist", "r1", data_version="")
        assert store.reader.list_experiments() == []

    def test_upgrade_from_0019_leaves_runs_without_a_version_and_downgrade_keeps_them(self, store):
        if self.backend == MEMORY:
            pytest.skip("sqlite:// is a new, empty database per engine: nothing to upgrade")
        store.create_experiment_run("mnist", "r1", data_version="v1")
        engine = store._write_engine
        _migrate(engine, "0019", upgrade=False)
        with engine.connect() as connection:
            keys = connection.execute(text("SELECT run_key FROM at_experiment_runs")).all()
        assert keys == [("r1",)]
        _migrate(engine, "head", upgrade=True)
        assert current_revision(engine) == HEAD_REVISION
        [run] = store.reader.list_experiment_runs("mnist")
        assert (run.run_key, run.data_version) == ("r1", None)
        store.create_experiment_run("mnist", "r2", data_version="v2")
        assert store.reader.resolve_run("mnist", "r2").data_version == "v2"
        assert schema_differences(store) == []


class TestInMemorySQLite(DataVersionContract):
    backend = MEMORY


class TestSQLiteFile(DataVersionContract):
    backend = SQLITE_FILE


@pytest.mark.postgres
class TestPostgreSQL(DataVersionContract):
    backend = POSTGRESQL
