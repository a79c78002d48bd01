"""Applies the store's Alembic revisions, configured in code: ``migrate(url)`` needs no alembic.ini."""

from __future__ import annotations

import os
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.util import CommandError
from sqlalchemy import Connection, Engine, text
from sqlalchemy.exc import SQLAlchemyError

from airflow_trials.exceptions import StoreError
from airflow_trials.store.engine import WRITE_OPTION, create_store_engine, safe_url
from airflow_trials.store.leaderboard import METRIC_INDEX_PREFIX

MIGRATIONS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "migrations")
VERSION_TABLE = "at_alembic_version"
HEAD = "head"
# pg_advisory_xact_lock key held while migrating, so concurrent migrate() calls run one at a time.
_MIGRATION_LOCK_KEY = 0x61745F6D6967  # "at_mig"


def alembic_config(connection: Connection | None = None) -> Config:
    """An Alembic config for the shipped revisions; ``connection`` is the one env.py migrates."""
    config = Config()
    config.set_main_option("script_location", MIGRATIONS_DIR.replace("%", "%%"))
    config.set_main_option("path_separator", "os")
    if connection is not None:
        config.attributes["connection"] = connection
    return config


def include_object(obj: Any, name: str | None, type_: str, reflected: bool, compare_to: Any) -> bool:
    """Leave the per-metric leaderboard indexes out of autogenerate: they are made at run time."""
    return not (type_ == "index" and reflected and (name or "").startswith(METRIC_INDEX_PREFIX))


def upgrade_engine(engine: Engine) -> None:
    """Apply every revision not yet applied to the database behind ``engine``, in one transaction."""
    try:
        with engine.execution_options(**{WRITE_OPTION: True}).begin() as connection:
            if connection.dialect.name == "postgresql":
                connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _MIGRATION_LOCK_KEY})
            command.upgrade(alembic_config(connection), HEAD)
    except (SQLAlchemyError, CommandError) as e:
        raise StoreError(
            f"Could not migrate the trial store at {safe_url(str(engine.url))} to the latest schema: "
            f"{type(e).__name__}: {e}. Nothing was changed; check that the database is reachable, "
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
    """The revision the database is at, or None when it was never migrated."""
    with engine.connect() as connection:
        context = MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE})
        return context.get_current_revision()
