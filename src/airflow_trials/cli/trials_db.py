"""Which trials DB a command uses, found as the DAGs find it, and opening it without creating it."""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING

import typer

from airflow_trials.cli.common import CliError

if TYPE_CHECKING:
    from airflow_trials.store import TrialReader

UPGRADE_HINT = (
    "run 'airflow-trials db upgrade' to create it there, or pass --db-url with the trials DB's URL"
)


def resolve_db_url(
    ctx: typer.Context, db_url: str | None, *, create_dir: bool = False
) -> tuple[str, str]:
    """``(url, source)``: the command's --db-url, else the one before the command, else as the DAGs
    find it (:func:`airflow_trials.hooks.trials.resolve_trials_db_url`: the ``trials_default``
    connection, else ``AIRFLOW_TRIALS_DB_URL``, else the default SQLite file)."""
    given = db_url or (ctx.obj or {}).get("db_url")
    if given:
        return given, "--db-url"
    # Imports Airflow (about a second), so only here: `airflow-trials --help` stays fast.
    from airflow_trials.hooks.trials import resolve_trials_db_url

    found = resolve_trials_db_url(create_dir=create_dir)
    # Airflow's logging setup prints INFO records on stdout; Alembic's ("Context impl SQLiteImpl")
    # would land in the rows a script reads.
    logging.getLogger("alembic").setLevel(logging.WARNING)
    return found


def checked_url(url: str, source: str) -> str:
    """``url`` once it is a SQLite or PostgreSQL URL whose driver is installed, else a CliError."""
    from airflow_trials.exceptions import StoreError
    from airflow_trials.store.engine import check_store_url

    try:
        check_store_url(url)
    except StoreError as e:
        raise CliError(f"Trials DB URL from {source}: {e}") from e
    return url


def open_for_reading(ctx: typer.Context, db_url: str | None) -> TrialReader:
    """The trials store, read-only (a TrialReader), once it is known to exist and to have this
    version's schema.

    Creates nothing: a missing SQLite file, or a database never migrated, is a CliError that says
    to run ``airflow-trials db upgrade``; a database that does not answer is one that says why.
    """
    from sqlalchemy.engine import make_url

    from airflow_trials.exceptions import StoreError
    from airflow_trials.store import TrialReader
    from airflow_trials.store.engine import is_memory_sqlite, safe_url
    from airflow_trials.store.migration import head_revision, schema_revision

    url, source = resolve_db_url(ctx, db_url)
    parsed = make_url(checked_url(url, source))
    where = f"{safe_url(url)} (from {source})"
    if parsed.get_backend_name() == "sqlite" and not is_memory_sqlite(url):
        path = os.path.abspath(parsed.database or "")
        if not os.path.isfile(path):
            raise CliError(f"No trials DB at {where}: {path} does not exist; {UPGRADE_HINT}.")
    try:
        revision = schema_revision(url)
    except StoreError as e:
        came_from = (
            ""
            if source == "--db-url"
            else f" The URL came from {source}; pass --db-url for another."
        )
        raise CliError(f"{e}{came_from}") from e
    if revision is None:
        raise CliError(
            f"The trials DB at {where} has no trials schema (never migrated); {UPGRADE_HINT}."
        )
    if revision != head_revision():
        raise CliError(
            f"The trials DB at {where} has schema revision {revision}, not this airflow_trials' "
            f"{head_revision()}; run 'airflow-trials db upgrade' (or upgrade airflow_trials if a "
            "newer "
            "one migrated it)."
        )
    return TrialReader(url)
