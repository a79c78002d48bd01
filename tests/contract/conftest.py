"""Store fixtures: one TrialStore per test on in-memory SQLite, a SQLite file, or PostgreSQL.

PostgreSQL runs when AIRFLOW_TRIALS_TEST_POSTGRES_URL names a server (e.g.
``postgresql+psycopg://postgres@127.0.0.1:5432/test``); each test gets a schema of its own,
dropped afterwards, so tests never see each other's rows. Tests that cut connections get a
database of their own instead (``postgres_database``), so they only ever cut their own.

Migrating costs time per test (Alembic loads its revisions and runs them one by one: tenths of a
second on 2 cores, more under load), so a store is made from a trials DB migrated once per
session: on SQLite a copy of the migrated file, on PostgreSQL the statements the session's one
migration ran, recorded and replayed into the test's new schema in one transaction
(``test_store.py`` checks that a replayed schema equals a migrated one).
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import uuid
from collections.abc import Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.engine import make_url

from airflow_trials.store import TrialStore, migrate
from airflow_trials.store.engine import create_store_engine
from airflow_trials.store.migration import upgrade_engine

POSTGRES_URL_ENV = "AIRFLOW_TRIALS_TEST_POSTGRES_URL"

MEMORY = "sqlite-memory"
SQLITE_FILE = "sqlite-file"
POSTGRESQL = "postgresql"


def postgres_url() -> str:
    url = os.environ.get(POSTGRES_URL_ENV)
    if not url:
        pytest.skip(
            f"PostgreSQL tests need {POSTGRES_URL_ENV}, e.g. postgresql+psycopg://postgres@127.0.0.1:5432/test"
        )
    return url


def with_search_path(url: str, schema: str) -> str:
    """``url`` whose connections use ``schema`` (psycopg passes ``options`` to the server)."""
    separator = "&" if "?" in url else "?"
    return f"{url}{separator}options=-csearch_path%3D{schema}"


def fail_setting_last_result(store: TrialStore, backend: str) -> None:
    """From now on every write that changes a trial's last_result fails ('forced failure'), late
    in its transaction: the session updates the trial's row after the call's inserts and deletes."""
    with store._engine.begin() as connection:
        if backend == POSTGRESQL:
            connection.exec_driver_sql(
                "CREATE FUNCTION at_test_fail() RETURNS trigger LANGUAGE plpgsql AS "
                "$$ BEGIN RAISE EXCEPTION 'forced failure'; END $$"
            )
            connection.exec_driver_sql(
                "CREATE TRIGGER at_test_fail BEFORE UPDATE OF last_result ON at_trials "
                "FOR EACH ROW EXECUTE FUNCTION at_test_fail()"
            )
        else:
            connection.exec_driver_sql(
                "CREATE TRIGGER at_test_fail BEFORE UPDATE OF last_result ON at_trials "
                "BEGIN SELECT RAISE(ABORT, 'forced failure'); END"
            )


@pytest.fixture
def postgres_schema_url() -> Iterator[str]:
    """A URL on a fresh, empty PostgreSQL schema, dropped after the test."""
    with new_postgres_schema() as url:
        yield url


@contextmanager
def new_postgres_schema(prefix: str = "at_test") -> Iterator[str]:
    """A URL on a new, empty PostgreSQL schema ``<prefix>_<hex>`` of the test server (skips when
    AIRFLOW_TRIALS_TEST_POSTGRES_URL is unset), dropped afterwards."""
    base = postgres_url()
    schema = f"{prefix}_{uuid.uuid4().hex[:12]}"
    admin = create_engine(base)
    with admin.begin() as connection:
        connection.execute(text(f'CREATE SCHEMA "{schema}"'))
    try:
        yield with_search_path(base, schema)
    finally:
        with admin.begin() as connection:
            connection.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


@dataclass(frozen=True)
class PostgresDatabase:
    """A database created for one test; ``admin`` is connected to the server's own database."""

    name: str
    url: str
    admin: Engine

    def terminate_backends(self) -> int:
        """Kill every connection to this database (never the admin's); returns how many."""
        with self.admin.connect() as connection:
            killed = connection.execute(
                text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = :name AND pid <> pg_backend_pid()"
                ),
                {"name": self.name},
            ).scalars()
            return sum(bool(ok) for ok in killed)

    def allow_connections(self, allowed: bool) -> None:
        with self.admin.connect() as connection:
            connection.execute(
                text(f'ALTER DATABASE "{self.name}" ALLOW_CONNECTIONS {str(allowed).lower()}')
            )


@contextmanager
def new_postgres_database(prefix: str) -> Iterator[PostgresDatabase]:
    """A new PostgreSQL database ``<prefix>_<hex>`` on the test server (skips, with the reason,
    when AIRFLOW_TRIALS_TEST_POSTGRES_URL is unset), dropped with its connections afterwards."""
    base = postgres_url()
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    admin = create_engine(base, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        url = make_url(base).set(database=name).render_as_string(hide_password=False)
        yield PostgresDatabase(name=name, url=url, admin=admin)
    finally:
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture
def postgres_database() -> Iterator[PostgresDatabase]:
    """A fresh PostgreSQL database ``at_drop_<hex>``, dropped (with its connections) afterwards."""
    with new_postgres_database("at_drop") as database:
        yield database


@pytest.fixture(scope="session")
def migrated_sqlite_file(tmp_path_factory) -> Path:
    """A SQLite trials DB migrated to head once per session, copied for each test's ``store`` on
    SQLite (a file, or in memory)."""
    path = tmp_path_factory.mktemp("migrated_template") / "trials.db"
    migrate(f"sqlite:///{path}")
    return path


#: What a migration's statement starts with when it only reads (the lock, Alembic's and the
#: revisions' look-ups): left out of the recorded migration.
_READS = ("SELECT", "WITH", "SHOW")


@pytest.fixture(scope="session")
def postgres_migration_script() -> list[tuple[str, Any]]:
    """The statements (with their parameters) that migrating an empty PostgreSQL schema to head
    runs, recorded once per session from a real migration; reads left out."""
    statements: list[tuple[str, Any]] = []
    with new_postgres_schema("at_template") as url:
        engine = create_store_engine(url)

        def record(connection, cursor, statement, parameters, context, executemany) -> None:
            if not statement.lstrip().upper().startswith(_READS):
                statements.append((statement, parameters))

        event.listen(engine, "before_cursor_execute", record)
        try:
            upgrade_engine(engine)
        finally:
            engine.dispose()
    return statements


def replay_migration(url: str, statements: list[tuple[str, Any]]) -> None:
    """Run a recorded migration's statements on the empty schema behind ``url``, in one
    transaction."""
    engine = create_engine(url)
    try:
        with engine.begin() as connection:
            for statement, parameters in statements:
                connection.exec_driver_sql(statement, parameters or None)
    finally:
        engine.dispose()


@pytest.fixture
def store_url(request: pytest.FixtureRequest, tmp_path) -> str:
    """The URL of the store for the backend the test class names in ``backend``: empty, or, where
    the test uses the ``store`` fixture too, at head as migrated once per session: on a SQLite
    file a copy of the migrated file, on PostgreSQL a new schema with the recorded migration
    replayed (the schema ``TrialStore(url, create=True)`` makes; ``pytest tests/contract`` took
    228 s with a migration per test and 175 s this way, on the idle 2-core machine)."""
    backend = request.cls.backend
    migrated = "store" in request.fixturenames
    if backend == MEMORY:
        return "sqlite://"
    if backend == SQLITE_FILE:
        path = tmp_path / "trials.db"
        if migrated:
            shutil.copyfile(request.getfixturevalue("migrated_sqlite_file"), path)
        return f"sqlite:///{path}"
    if backend == POSTGRESQL:
        url = request.getfixturevalue("postgres_schema_url")
        if migrated:
            replay_migration(url, request.getfixturevalue("postgres_migration_script"))
        return url
    raise ValueError(f"unknown backend {backend!r}")


@pytest.fixture
def store(request: pytest.FixtureRequest, store_url: str) -> Iterator[TrialStore]:
    if request.cls.backend == MEMORY:
        # The session's migrated file copied into the store's one connection (in-memory SQLite
        # keeps one, a StaticPool), then the migration, which finds nothing left to do.
        trial_store = TrialStore(store_url)
        with closing(sqlite3.connect(request.getfixturevalue("migrated_sqlite_file"))) as source:
            with trial_store._engine.connect() as connection:
                source.backup(connection.connection.driver_connection)
        upgrade_engine(trial_store._engine)
    else:
        # store_url is already at head (a copy, or a replay, of the session's one migration).
        trial_store = TrialStore(store_url)
    yield trial_store
    trial_store.dispose()
