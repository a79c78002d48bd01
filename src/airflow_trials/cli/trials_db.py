"""Which trials DB a command uses, found as the DAGs find it, and opening it without creating it."""

from __future__ import annotations

import logging
import os
import shlex
from typing import TYPE_CHECKING

import typer

from airflow_trials.cli.common import CliError
from airflow_trials.trials_db_url import DEFAULT_SOURCE

if TYPE_CHECKING:
    from airflow_trials.store import TrialReader


def upgrade_command(url: str, source: str) -> str:
    """The ``db upgrade`` line that migrates the DB at ``url``, found from ``source``: with its
    ``--db-url`` when one named it (a password is never printed: then "with the same --db-url").
    Said only as the way to a new, empty trials DB: a user looking for a run's results who
    creates one where the CLI looked finds an empty DB, not the run (the main job keeps its own
    in its state directory)."""
    from airflow_trials.store.engine import mask_passwords

    if source != "--db-url":
        return "airflow-trials db upgrade"
    if mask_passwords(url) == url:  # no password, in its user info or its query
        return shlex.join(["airflow-trials", "--db-url", url, "db", "upgrade"])
    return "airflow-trials db upgrade with the same --db-url"


def how_found(source: str) -> str:
    """How the URL from ``source`` was found, in a few words: its source; for the default SQLite
    file, what named its folder and that nothing named another trials DB."""
    if source != DEFAULT_SOURCE:
        return f"from {source}"
    from airflow_trials.provider_config import setting, setting_source

    folder = (
        f"in {setting_source('home')}"
        if setting("home")
        else "in ~/airflow_trials: no AIRFLOW_TRIALS_HOME or [airflow_trials] home"
    )
    return (
        f"from {DEFAULT_SOURCE} {folder}, no --db-url, no trials_default connection, no "
        "AIRFLOW_TRIALS_DB_URL or [airflow_trials] db_url"
    )


def main_job_hint(path: str | None = None) -> str:
    """Where a main job's trials DB is, when one exists here (``./.state/trials.db``,
    ``$AIRFLOW_TRIALS_STATE/trials.db``; not ``path``, the one being reported), with the exact
    ``--db-url`` that reads it; else how to name another."""
    from airflow_trials.mainjob import state_trials_dbs

    found = [p for p in state_trials_dbs() if str(p) != path]
    if not found:
        return "To read another trials DB, pass its URL with --db-url"
    urls = " or ".join(f"--db-url sqlite:///{p}" for p in found)
    return (
        "The main job (airflow-trials run, ./scripts/run.sh) keeps its trials DB in its state "
        f"directory; to read it, pass {urls}"
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
    """``url`` once it is a SQLite or PostgreSQL URL whose driver is installed, and not an
    in-memory SQLite database (``sqlite://``: every process opens its own, empty, so it holds no
    DAG's trials, and ``db upgrade`` would migrate one that is gone when it ends); else a
    CliError."""
    from airflow_trials.exceptions import StoreError
    from airflow_trials.store.engine import check_store_url, is_memory_sqlite, mask_passwords

    try:
        check_store_url(url)
    except StoreError as e:
        raise CliError(f"Trials DB URL from {source}: {e}") from e
    if is_memory_sqlite(url):
        raise CliError(
            f"Trials DB URL from {source}: {mask_passwords(url)} names no SQLite file (an "
            "in-memory database, which every process opens empty and which keeps nothing), so no "
            "DAG's trials are in it; give the file's URL, e.g. sqlite:////abs/path/trials.db."
        )
    return url


def open_for_reading(ctx: typer.Context, db_url: str | None) -> TrialReader:
    """The trials store, read-only (a TrialReader), once it is known to exist and to have this
    version's schema.

    Creates nothing: a missing SQLite file, or a database never migrated, is a CliError that says
    how the URL was found and names a main job's trials DB when one is here (``db upgrade`` only
    as the way to a new, empty one); a database that does not answer is one that says why.
    """
    from sqlalchemy.engine import make_url

    from airflow_trials.exceptions import StoreError
    from airflow_trials.store import TrialReader
    from airflow_trials.store.engine import is_memory_sqlite, safe_url
    from airflow_trials.store.migration import head_revision, schema_revision

    url, source = resolve_db_url(ctx, db_url)
    parsed = make_url(checked_url(url, source))
    where = f"{safe_url(url)} (from {source})"
    path = None
    if parsed.get_backend_name() == "sqlite" and not is_memory_sqlite(url):
        path = os.path.abspath(parsed.database or "")
        if not os.path.isfile(path):
            raise CliError(
                f"No trials DB at {safe_url(url)} ({how_found(source)}): {path} does not exist. "
                f"{main_job_hint(path)}; to start a new, empty trials DB there: "
                f"{upgrade_command(url, source)}."
            )
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
            f"The trials DB at {where} has no trials schema (never migrated). "
            f"{main_job_hint(path)}; to create the trials schema in it (a new, empty trials DB): "
            f"{upgrade_command(url, source)}."
        )
    if revision != head_revision():
        raise CliError(
            f"The trials DB at {where} has schema revision {revision}, not this airflow_trials' "
            f"{head_revision()}; run 'airflow-trials db upgrade' (or upgrade airflow_trials if a "
            "newer "
            "one migrated it)."
        )
    return TrialReader(url)
