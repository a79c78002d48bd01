"""Alembic environment of the store: run by airflow_trials.store.migrate (no alembic.ini needed)."""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection

from airflow_trials.store.engine import create_store_engine
from airflow_trials.store.migration import VERSION_TABLE, include_object
from airflow_trials.store.models import Base

config = context.config


def run_migrations_offline() -> None:
    context.configure(
        url=config.get_main_option("sqlalchemy.url"),
        target_metadata=Base.metadata,
        version_table=VERSION_TABLE,
        include_object=include_object,
        literal_binds=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    # migrate() hands over a connection already inside its transaction (and, on PostgreSQL,
    # holding the migration lock), so the whole upgrade commits or rolls back as one.
    connection = config.attributes.get("connection")
    if connection is None:
        # Run by the alembic command line, with sqlalchemy.url in its alembic.ini.
        url = config.get_main_option("sqlalchemy.url")
        if not url:
            raise RuntimeError(
                "The airflow_trials store migrations need a database: run "
                "`python -m airflow_trials.store upgrade --url URL` or "
                "airflow_trials.store.migrate(url)."
            )
        engine = create_store_engine(url)
        try:
            with engine.begin() as new_connection:
                _configure_and_run(new_connection)
        finally:
            engine.dispose()
        return
    _configure_and_run(connection)


def _configure_and_run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=Base.metadata,
        version_table=VERSION_TABLE,
        include_object=include_object,
        render_as_batch=connection.dialect.name == "sqlite",
    )
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
