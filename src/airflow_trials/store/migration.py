"""Applies the store's Alembic revisions, configured in code: ``migrate(url)`` needs no
alembic.ini. Alembic is imported only to migrate: a reader checks the schema's revision with
SQLAlchemy alone (:func:`schema_revision` against :data:`HEAD_REVISION`), so a command that only
reads does not pay Alembic's import (about 0.15 s)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, Engine, inspect, text
from sqlalchemy.exc import SQLAlchemyError

from airflow_trials.exceptions import StoreError
from airflow_trials.store.engine import WRITE_OPTION, create_store_engine, safe_url
from airflow_trials.store.leaderboard import METRIC_INDEX_PREFIX

if TYPE_CHECKING:
    from alembic.config import Config

MIGRATIONS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "migrations")
VERSION_TABLE = "at_alembic_version"
HEAD = "head"
#: The newest revision this airflow_trials ships (the head of migrations/versions), known when it
#: is built: what :func:`migrate` brings a database to and what a reader expects. A test checks it
#: against Alembic's own head (tests/contract/test_store_schema_revision.py).
HEAD_REVISION = "0021"
# pg_advisory_xact_lock key held while migrating, so concurrent migrate() calls run one at a time.
_MIGRATION_LOCK_KEY = 0x61745F6D6967  # "at_mig"


def alembic_config(connection: Connection | None = None) -> Config:
    """An Alembic config for the shipped revisions; ``connection`` is the one env.py migrates."""
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", MIGRATIONS_DIR.replace("%", "%%"))
    config.set_main_option("path_separator", "os")
    if connection is not None:
        config.attributes["connection"] = connection
    return config


def include_object(
    obj: Any, name: str | None, type_: str, reflected: bool, compare_to: Any
) -> bool:
    """Leave the per-metric leaderboard indexes out of autogenerate: they are made at run time."""
    return not (type_ == "index" and reflected and (name or "").startswith(METRIC_INDEX_PREFIX))


def upgrade_engine(engine: Engine) -> None:
    """Apply every revision not yet applied to the database behind ``engine``, in one
    transaction."""
    from alembic import command
    from alembic.util import CommandError

    try:
        with engine.execution_options(**{WRITE_OPTION: True}).begin() as connection:
            if connection.dialect.name == "postgresql":
                connection.execute(
                    text("SELECT pg_advisory_xact_lock(:key)"), {"key": _MIGRATION_LOCK_KEY}
                )
            command.upgrade(alembic_config(connection), HEAD)
    except (SQLAlchemyError, CommandError) as e:
        raise StoreError(
            f"Could not migrate the trial store at {safe_url(str(engine.url))} to the latest "
            "schema: "
            f"{type(e).__name__}: {_one_line(e)}. Nothing was changed; check that the database is "
            "reachable, "
            f"that its user may create tables, and that it was not migrated by a newer "
            f"airflow_trials."
        ) from e


def migrate(url: str) -> None:
    """Create or upgrade the store's tables at ``url`` to the latest revision; safe to run again.

    :param url: SQLAlchemy URL of the store, e.g. ``sqlite:////path/trials.db``.
    """
    engine = create_store_engine(url)
    try:
        upgrade_engine(engine)
    finally:
        engine.dispose()


def current_revision(engine: Engine) -> str | None:
    """The revision the database is at, or None when it was never migrated: the row of Alembic's
    version table, read with SQLAlchemy alone (the table Alembic keeps, one row per head; the
    store's revisions are one line, so one row)."""
    with engine.connect() as connection:
        if not inspect(connection).has_table(VERSION_TABLE):
            return None
        versions = connection.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).scalars()
        found = sorted(versions)
    if len(found) > 1:
        raise StoreError(
            f"The trials DB at {safe_url(str(engine.url))} has {len(found)} schema revisions "
            f"({', '.join(found)}) in {VERSION_TABLE}, where airflow_trials keeps one; it was "
            "migrated by something else. Restore it from a backup or migrate a new trials DB."
        )
    return found[0] if found else None


def head_revision() -> str:
    """The newest revision this airflow_trials ships (:data:`HEAD_REVISION`): what
    :func:`migrate` brings a database to."""
    return HEAD_REVISION


def schema_revision(url: str, connect_timeout_seconds: int = 10) -> str | None:
    """The revision of the database at ``url`` (None: never migrated), read in one attempt.

    Unlike :class:`~airflow_trials.store.TrialStore`, this neither retries nor changes the
    database (no WAL switch on SQLite), so a reader can check a store before it opens it.
    Raises :class:`~airflow_trials.exceptions.StoreError`, on one line, when the database does not
    answer.

    :param url: SQLAlchemy URL of the store.
    :param connect_timeout_seconds: PostgreSQL's connect timeout; default 10.
    """
    from sqlalchemy import create_engine
    from sqlalchemy.engine import make_url
    from sqlalchemy.pool import NullPool

    connect_args = (
        {"connect_timeout": connect_timeout_seconds}
        if make_url(url).get_backend_name() == "postgresql"
        else {}
    )
    engine = create_engine(url, poolclass=NullPool, connect_args=connect_args)
    try:
        return current_revision(engine)
    except SQLAlchemyError as e:
        raise StoreError(
            f"Could not read the trials DB at {safe_url(url)} ({type(e).__name__}: "
            f"{_one_line(e)}). Check "
            "that the database server is up and that the URL (host, port, user, database) is right."
        ) from e
    finally:
        engine.dispose()


def _one_line(error: BaseException) -> str:
    """The driver's message when there is one, on one line (libpq puts its hint on a second)."""
    return " ".join(str(getattr(error, "orig", None) or error).split()).rstrip(".")
