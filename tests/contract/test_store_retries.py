"""TrialStore re-runs a transaction that failed transiently, and only then; against real
databases."""

from __future__ import annotations

import functools
import logging
import random
import threading
from typing import Any

import pytest
from sqlalchemy import event, text

from airflow_trials import StoreError
from airflow_trials.core.fate import Transition
from airflow_trials.ports import free_port
from airflow_trials.store import TrialStore
from airflow_trials.store.models import CheckpointRow, ResultRow
from airflow_trials.store.retry import RetryPolicy
from tests.contract.conftest import PostgresDatabase
from tests.contract.test_store import count, register, results, retry_warnings, run_in_threads
from tests.factories import add_checkpoint, add_results, update_trial


def closed_port() -> int:
    """A port on 127.0.0.1 that nothing listens on (it was free a moment ago)."""
    return free_port()


class RetryLog(logging.Handler):
    """Sets ``retried`` at the store's first retry warning."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.retried = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if "retrying in" in record.getMessage():
            self.retried.set()


@pytest.fixture
def retry_log() -> Any:
    handler = RetryLog()
    logger = logging.getLogger("airflow_trials.store.database")
    logger.addHandler(handler)
    yield handler
    logger.removeHandler(handler)


# -- the policy ------------------------------------------------------------------------------


def test_backoff_grows_is_jittered_and_stops_at_attempts_or_timeout():
    policy = RetryPolicy(
        max_attempts=8, timeout_seconds=30.0, initial_backoff_seconds=0.1, max_backoff_seconds=5.0
    )
    for attempt in range(1, 8):
        ceiling = min(5.0, 0.1 * 2 ** (attempt - 1))
        delays = {policy.delay_seconds(attempt, 0.0) for _ in range(50)}
        assert all(ceiling / 2 <= d <= ceiling for d in delays), (attempt, delays)
        assert len(delays) > 1
    assert policy.delay_seconds(8, 0.0) is None
    assert policy.delay_seconds(1, 29.99) is None
    assert RetryPolicy(max_attempts=1).delay_seconds(1, 0.0) is None


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"retry_max_attempts": 0}, "retry_max_attempts must be an integer of at least 1"),
        ({"retry_timeout_seconds": -1}, "retry_timeout_seconds must be a finite number"),
        (
            {"retry_max_backoff_seconds": float("inf")},
            "retry_max_backoff_seconds must be a finite number",
        ),
    ],
)
def test_bad_retry_settings_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        TrialStore("sqlite://", **kwargs)


# -- outages that outlast the budget ---------------------------------------------------------


def test_unreachable_server_raises_store_error_after_the_retries(caplog):
    port = closed_port()
    store = TrialStore(
        f"postgresql+psycopg://trials:s3cret@127.0.0.1:{port}/trials",
        retry_max_attempts=3,
        retry_initial_backoff_seconds=0.01,
    )
    caplog.set_level(logging.WARNING, logger="airflow_trials.store")
    try:
        with pytest.raises(StoreError) as raised:
            add_results(store, "t1", results([1]))
    finally:
        store.dispose()
    message = str(raised.value)
    assert "could not record the progress of 1 trials (1 results)" in message
    assert f"postgresql+psycopg://trials:***@127.0.0.1:{port}/trials" in message
    assert "s3cret" not in message
    assert "3 attempts (2 retries) over" in message
    assert (
        "retry_timeout_seconds" in message
        and "Check that the database is up and reachable" in message
    )
    warnings = retry_warnings(caplog)
    assert len(warnings) == 2
    assert "progress of 1 trials (1 results) at attempt 1 of 3" in warnings[0]
    assert "at attempt 2 of 3" in warnings[1]


def test_retry_timeout_ends_the_retries_before_the_attempts_run_out(caplog):
    store = TrialStore(
        f"postgresql+psycopg://trials@127.0.0.1:{closed_port()}/trials",
        retry_max_attempts=1000,
        retry_timeout_seconds=0.2,
        retry_initial_backoff_seconds=0.02,
        retry_max_backoff_seconds=0.05,
    )
    caplog.set_level(logging.WARNING, logger="airflow_trials.store")
    try:
        with pytest.raises(
            StoreError, match=r"(?s)could not list trials: .* \d+ attempts"
        ) as raised:
            store.reader.list_trials()
    finally:
        store.dispose()
    attempts = len(retry_warnings(caplog)) + 1
    assert 1 < attempts < 1000
    assert f"{attempts} attempts ({attempts - 1} retries)" in str(raised.value)


@pytest.mark.postgres
def test_missing_database_is_not_retried(postgres_database: PostgresDatabase, caplog):
    url = postgres_database.url.replace(postgres_database.name, postgres_database.name + "_missing")
    store = TrialStore(url, retry_initial_backoff_seconds=0.001)
    caplog.set_level(logging.WARNING, logger="airflow_trials.store")
    try:
        with pytest.raises(StoreError, match="does not exist") as raised:
            store.reader.list_experiments()
    finally:
        store.dispose()
    assert retry_warnings(caplog) == []
    assert "attempts" not in str(raised.value)


# -- transient errors on PostgreSQL ----------------------------------------------------------


@pytest.mark.postgres
def test_connection_killed_between_ping_and_use_is_retried(postgres_database, caplog):
    store = TrialStore(postgres_database.url, create=True)
    register(store, "t1")
    killed: list[int] = []

    def kill_once(conn, cursor, statement, parameters, context, executemany):
        # The pool has just pinged this connection; kill it before the INSERT reaches it.
        if "INSERT INTO at_results" in statement and not killed:
            killed.append(postgres_database.terminate_backends())

    event.listen(store._engine, "before_cursor_execute", kill_once)
    caplog.set_level(logging.WARNING, logger="airflow_trials.store")
    try:
        assert add_results(store, "t1", results([1, 2, 3])) == 3
    finally:
        event.remove(store._engine, "before_cursor_execute", kill_once)
    assert killed == [1]
    [warning] = retry_warnings(caplog)
    assert "progress of 1 trials (3 results) at attempt 1 of 8" in warning
    assert [r["training_iteration"] for r in store.reader.get_results("t1")] == [1, 2, 3]
    assert store.reader.get_trial("t1").last_result["training_iteration"] == 3
    store.dispose()


@pytest.mark.postgres
@pytest.mark.parametrize(
    "sqlstate, transient",
    [("40001", True), ("40P01", True), ("57P01", True), ("23514", False), ("22003", False)],
    ids=[
        "serialization_failure",
        "deadlock_detected",
        "admin_shutdown",
        "check_violation",
        "numeric_out_of_range",
    ],
)
def test_sqlstates_are_retried_only_when_transient(
    postgres_schema_url, caplog, sqlstate, transient
):
    store = TrialStore(postgres_schema_url, create=True, retry_initial_backoff_seconds=0.001)
    register(store, "t1")
    with store._engine.begin() as connection:
        # A sequence counts attempts: nextval() is not rolled back with the failed transaction.
        connection.exec_driver_sql("CREATE SEQUENCE at_test_attempts")
        connection.exec_driver_sql(
            "CREATE FUNCTION at_test_fail_once() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            "IF nextval('at_test_attempts') = 1 THEN "
            f"RAISE EXCEPTION 'forced failure' USING ERRCODE = '{sqlstate}'; END IF; "
            "RETURN NULL; END $$"
        )
        connection.exec_driver_sql(
            "CREATE TRIGGER at_test_fail_once BEFORE INSERT ON at_results "
            "FOR EACH STATEMENT EXECUTE FUNCTION at_test_fail_once()"
        )
    caplog.set_level(logging.WARNING, logger="airflow_trials.store")
    try:
        if transient:
            assert add_results(store, "t1", results([1, 2])) == 2
        else:
            with pytest.raises(
                StoreError, match=r"progress of 1 trials \(2 results\).*forced failure"
            ):
                add_results(store, "t1", results([1, 2]))
        with store._engine.connect() as connection:
            attempts = connection.execute(
                text("SELECT last_value FROM at_test_attempts")
            ).scalar_one()
    finally:
        store.dispose()
    assert attempts == (2 if transient else 1)
    assert len(retry_warnings(caplog)) == (1 if transient else 0)
    assert count(store, ResultRow, trial_id="t1") == (2 if transient else 0)


@pytest.mark.postgres
def test_writes_survive_every_backend_being_killed_again_and_again(postgres_database, caplog):
    iterations, batch_size = 300, 3
    store = TrialStore(postgres_database.url, create=True)
    run = store.create_experiment_run("mnist", "r1", seed=2**32 - 1)
    store.ensure_experiment("mnist", metric="loss", mode="min")
    register(store, "t1", run)
    caplog.set_level(logging.WARNING, logger="airflow_trials.store")
    done = threading.Event()
    kills: list[int] = []

    def write() -> None:
        try:
            for start in range(1, iterations + 1, batch_size):
                add_results(
                    store, "t1", results(range(start, min(start + batch_size, iterations + 1)))
                )
                # Placed, then waiting again (as a paused trial waits), and so on.
                store.record_transition("t1", Transition.PLACED if start % 2 else Transition.QUEUED)
                update_trial(store, "t1", num_failures=start // 30)
                if start % 30 == 1:
                    add_checkpoint(store, "t1", f"/ckpt/t1/{start}", start, score=float(start))
                done.wait(0.005)  # spread the writes over a few kill rounds
        finally:
            done.set()

    def kill() -> None:
        rng = random.Random(7)
        while not done.wait(rng.uniform(0.1, 0.4)):
            kills.append(postgres_database.terminate_backends())

    assert run_in_threads([write, kill]) == []
    assert sum(kills) > 0, "the killer never found a connection to kill"
    stored = [r["training_iteration"] for r in store.reader.get_results("t1")]
    assert stored == list(range(1, iterations + 1))
    assert store.reader.get_trial("t1").last_result["training_iteration"] == iterations
    [best] = store.reader.leaderboard(run, "loss", "min")
    assert (best.best_value, best.best_iteration) == (10.0 - iterations, iterations)
    assert count(store, CheckpointRow, trial_id="t1") == 10
    logging.getLogger(__name__).info(
        "%d backends killed in %d rounds; %d retries",
        sum(kills),
        len(kills),
        len(retry_warnings(caplog)),
    )
    store.dispose()


@pytest.mark.postgres
def test_a_call_waits_out_a_short_outage(postgres_database, retry_log):
    store = TrialStore(postgres_database.url, create=True)
    register(store, "t1")
    postgres_database.allow_connections(False)
    postgres_database.terminate_backends()
    outcome: list[Any] = []
    writer = threading.Thread(
        target=lambda: outcome.append(add_results(store, "t1", results([1, 2])))
    )
    writer.start()
    try:
        # Let connections in again only once the store has seen the outage and is retrying.
        assert retry_log.retried.wait(timeout=30)
    finally:
        postgres_database.allow_connections(True)
    writer.join(timeout=60)
    assert outcome == [2]
    assert [r["training_iteration"] for r in store.reader.get_results("t1")] == [1, 2]
    store.dispose()


# -- SQLite ----------------------------------------------------------------------------------


def test_32_sqlite_writers_of_their_own_trials_all_finish(tmp_path, caplog):
    writers, per_writer, batch_size = 32, 100, 5
    url = f"sqlite:///{tmp_path / 'trials.db'}"
    TrialStore(url, create=True).dispose()
    caplog.set_level(logging.WARNING, logger="airflow_trials.store")
    barrier = threading.Barrier(writers, timeout=60)

    def write(w: int) -> None:
        store = TrialStore(url)
        try:
            register(store, f"t{w}")
            barrier.wait()
            for start in range(1, per_writer + 1, batch_size):
                add_results(store, f"t{w}", results(range(start, start + batch_size)))
                store.record_transition(f"t{w}", Transition.PLACED)
                update_trial(store, f"t{w}", num_failures=start)
        finally:
            store.dispose()

    assert run_in_threads([functools.partial(write, w) for w in range(writers)]) == []
    store = TrialStore(url)
    for w in range(writers):
        assert [r["training_iteration"] for r in store.reader.get_results(f"t{w}")] == list(
            range(1, per_writer + 1)
        )
    assert count(store, ResultRow) == writers * per_writer
    assert not any("database is locked" in message for message in retry_warnings(caplog))
    store.dispose()
