"""Alembic environment of the store; run through airflow_trials.store.migrate, no alembic.ini needed."""

from __future__ import annotations

from alembic import context

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
    connection = config.attributes["connection"]
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
