"""Contract of a trial's warm-start origin in the trials store (migration 0008), on every backend:
kept from the trial's registration on, never replaced by a later registration, dropped in place by
the downgrade without touching any trial's rows."""

from __future__ import annotations

import pytest
from sqlalchemy import inspect, text

from airflow_trials.store import TrialStore
from airflow_trials.store.engine import create_store_engine
from airflow_trials.store.migration import current_revision, upgrade_engine
from tests.contract.conftest import MEMORY, POSTGRESQL, SQLITE_FILE
from tests.contract.test_store import HEAD_REVISION, register, results, schema_differences
from tests.contract.test_store_stop_reason import _insert_old_trial, _migrate
from tests.factories import add_checkpoint, add_results

ORIGIN = {
    "run_key": "scheduled__2026-11-23T02:00:00+00:00",
    "experiment_run_id": 7,
    "trial_id": "night1-0003",
    "value": 0.125,
    "checkpoint": "/ckpt/night1-0003/checkpoint_000020",
}


class WarmStartContract:
    """Every backend must pass these; subclasses name the backend for the ``store`` fixture."""

    backend: str

    def test_a_warm_started_trial_keeps_where_it_came_from(self, store):
        store.upsert_trial(
            "w1",
            trainable="m:f",
            config={"lr": 0.1},
            resources={"cpu": 1},
            max_failures=0,
            warm_start=ORIGIN,
        )
        register(store, "cold")
        assert store.reader.get_trial("w1").warm_start == ORIGIN
        assert store.reader.get_trial("cold").warm_start is None
        # A later registration (the next try, TrialsDbCallback) refreshes ids only.
        store.upsert_trial(
            "w1",
            trainable="m:f",
            config={"lr": 0.1},
            resources={"cpu": 1},
            max_failures=0,
            try_number=2,
        )
        store.upsert_trial(
            "w1",
            trainable="m:f",
            config={"lr": 0.1},
            resources={"cpu": 1},
            max_failures=0,
            warm_start={"trial_id": "other"},
        )
        assert store.reader.get_trial("w1").warm_start == ORIGIN
        assert {t.trial_id: t.warm_start for t in store.reader.list_trials()} == {
            "w1": ORIGIN,
            "cold": None,
        }

    def test_an_origin_that_is_not_json_is_stored_as_json_safe_values(self, store):
        store.upsert_trial(
            "w2",
            trainable="m:f",
            config={},
            resources={"cpu": 1},
            max_failures=0,
            warm_start={**ORIGIN, "value": float("inf")},
        )
        assert (
            store.reader.get_trial("w2").warm_start["value"] is None
        )  # strict JSON: not finite is null

    def test_upgrade_from_0004_keeps_the_trials_and_their_rows(self, store_url):
        if self.backend == MEMORY:
            pytest.skip("sqlite:// is a new, empty database per engine: nothing to upgrade")
        engine = create_store_engine(store_url)
        try:
            _migrate(engine, "0004", upgrade=True)
            _insert_old_trial(engine)
            upgrade_engine(engine)
            assert current_revision(engine) == HEAD_REVISION
        finally:
            engine.dispose()
        store = TrialStore(store_url)
        try:
            assert store.reader.get_trial("t-old").warm_start is None
            assert schema_differences(store) == []
        finally:
            store.dispose()

    def test_downgrade_to_0007_drops_the_column_and_keeps_every_trial_s_rows(self, store):
        store.upsert_trial(
            "w1",
            trainable="m:f",
            config={"lr": 0.1},
            resources={"cpu": 1},
            max_failures=0,
            warm_start=ORIGIN,
        )
        add_results(store, "w1", results([1, 2]))
        add_checkpoint(store, "w1", "/ckpt/w1/2", 2)
        engine = store._write_engine
        _migrate(engine, "0007", upgrade=False)
        with engine.connect() as connection:
            columns = {c["name"] for c in inspect(connection).get_columns("at_trials")}
            kept = [
                connection.execute(
                    text(f"SELECT count(*) FROM {table} WHERE trial_id = 'w1'")
                ).scalar_one()
                for table in ("at_trials", "at_results", "at_checkpoints")
            ]
        assert "warm_start" not in columns
        assert kept == [1, 2, 1]  # no rebuild of at_trials cascaded into its children
        _migrate(engine, "head", upgrade=True)
        assert (
            store.reader.get_trial("w1").warm_start is None
            and len(store.reader.get_results("w1")) == 2
        )


class TestInMemorySQLite(WarmStartContract):
    backend = MEMORY


class TestSQLiteFile(WarmStartContract):
    backend = SQLITE_FILE


@pytest.mark.postgres
class TestPostgreSQL(WarmStartContract):
    backend = POSTGRESQL
