"""How the store's SQLAlchemy engine is made: SQLite in WAL mode or PostgreSQL (which database:
:mod:`airflow_trials.trials_db_url`)."""

from __future__ import annotations

import os
import re
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, NoSuchModuleError
from sqlalchemy.pool import StaticPool

from airflow_trials.exceptions import StoreError

SQLITE_BUSY_TIMEOUT_SECONDS = 30.0

# Execution option that marks a connection as one that will write. On SQLite such a transaction
# starts with BEGIN IMMEDIATE, see _begin_sqlite_transaction.
WRITE_OPTION = "airflow_trials_write"
_MASK = "***"
# Query parameters whose value is a credential: password, sslpassword, pwd, token, api_key, ...
_SECRET_QUERY_KEY = re.compile(r"pass|pwd|secret|token|key|credential|signature", re.IGNORECASE)
_USER_INFO_PASSWORD = re.compile(r"(://[^/@:\s]*:)[^/@\s]*@")
_SECRET_QUERY_VALUE = re.compile(
    r"([?&][^=&\s]*(?:pass|pwd|secret|token|key|credential|signature)[^=&\s]*=)[^&\s#]*",
    re.IGNORECASE,
)


def is_memory_sqlite(url: str) -> bool:
    parsed = make_url(url)
    return parsed.get_backend_name() == "sqlite" and parsed.database in (None, "", ":memory:")


def check_store_url(url: str) -> URL:
    """The parsed URL, once it is known to be a SQLite or PostgreSQL URL whose driver is installed.

    Raises :class:`~airflow_trials.exceptions.StoreError` with a one-line message that says how to
    fix the URL: a plain path or other text that is no URL, a driver that is not installed, or a
    database other than SQLite and PostgreSQL.
    """
    try:
        parsed = make_url(url)
    except ArgumentError as e:
        hint = (
            f"sqlite:///{os.path.abspath(url)}"
            if ("/" in url or url.endswith(".db"))
            else "sqlite:////path/trials.db"
        )
        raise StoreError(
            f"{url!r} is not a database URL; give a SQLAlchemy URL such as {hint} (a SQLite file) "
            "or postgresql+psycopg://user@host/db."
        ) from e
    try:
        parsed.get_dialect().import_dbapi()
    except (NoSuchModuleError, ImportError) as e:
        raise StoreError(
            f"No database driver for {parsed.drivername!r} is installed ({type(e).__name__}: {e}), "
            "so "
            f"{safe_url(parsed)} cannot be opened; use sqlite:/// or "
            "postgresql+psycopg:// (the package's postgres extra: pip install -c constraints.txt "
            "'.[postgres]' in the airflow_trials checkout), or install that driver."
        ) from e
    if parsed.get_backend_name() not in ("sqlite", "postgresql"):
        raise StoreError(
            f"The trial store supports SQLite and PostgreSQL, not {parsed.get_backend_name()} "
            f"({safe_url(parsed)}); use a sqlite:/// or "
            "postgresql+psycopg:// URL."
        )
    return parsed


def safe_url(url: str | URL) -> str:
    """The URL with its passwords masked, for error messages, logs and reprs: the password of its
    user info, and the value of each query parameter that carries a credential (libpq's
    ``?password=`` and ``?sslpassword=``, a token). Any URL: a trials DB URL, an MLflow tracking
    URI; a name or a path that is no URL holds no password and is shown as given."""
    try:
        parsed = url if isinstance(url, URL) else make_url(url)
    except (ArgumentError, ValueError):
        return mask_passwords(str(url))
    secrets = {key: _MASK for key in parsed.query if _SECRET_QUERY_KEY.search(key)}
    masked = parsed.update_query_dict(secrets) if secrets else parsed
    # SQLAlchemy percent-encodes the mask in a query: show it as the password's mask is shown.
    return masked.render_as_string(hide_password=True).replace("%2A%2A%2A", _MASK)


def mask_passwords(text: str) -> str:
    """``text`` (an error message from a client library) with the password of every URL in it
    masked, as :func:`safe_url` masks one URL."""
    text = _USER_INFO_PASSWORD.sub(rf"\1{_MASK}@", text)
    return _SECRET_QUERY_VALUE.sub(rf"\1{_MASK}", text)


def create_store_engine(url: str, **kwargs: Any) -> Engine:
    """An engine for the store at ``url``, with the SQLite settings the store relies on.

    SQLite connections get ``busy_timeout`` (so concurrent writers wait instead of failing),
    ``journal_mode=WAL`` (readers never block the writer) with ``synchronous=NORMAL``, and
    ``foreign_keys=ON``. Transactions
    that write start with ``BEGIN IMMEDIATE``: a transaction that started as a reader cannot
    upgrade to a writer once another writer has committed, and SQLite reports that at once as
    "database is locked" without waiting for the busy timeout. In-memory SQLite (``sqlite://``)
    uses one shared connection, so every session sees the same database.

    :param url: SQLAlchemy URL, e.g. ``sqlite:////path/trials.db`` or
        ``postgresql+psycopg://user@host/db``.
    :param kwargs: passed on to :func:`sqlalchemy.create_engine`.
    """
    backend = make_url(url).get_backend_name()
    if backend != "sqlite":
        kwargs.setdefault("pool_pre_ping", True)
        return create_engine(url, **kwargs)

    connect_args = dict(kwargs.pop("connect_args", {}))
    connect_args.setdefault("check_same_thread", False)
    connect_args.setdefault("timeout", SQLITE_BUSY_TIMEOUT_SECONDS)
    if is_memory_sqlite(url):
        kwargs.setdefault("poolclass", StaticPool)
    engine = create_engine(url, connect_args=connect_args, **kwargs)
    event.listen(engine, "connect", _configure_sqlite_connection)
    event.listen(engine, "begin", _begin_sqlite_transaction)
    return engine


def _configure_sqlite_connection(dbapi_connection: Any, connection_record: Any) -> None:
    # pysqlite would otherwise emit its own deferred BEGIN (and none before DDL);
    # _begin_sqlite_transaction emits the right one instead.
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    try:
        # busy_timeout first: switching to WAL itself needs the lock another connection may hold.
        cursor.execute(f"PRAGMA busy_timeout = {int(SQLITE_BUSY_TIMEOUT_SECONDS * 1000)}")
        cursor.execute("PRAGMA journal_mode = WAL")
        # In WAL mode, NORMAL syncs at checkpoints rather than at every commit: a commit survives
        # the process being killed (the faults this store is tested against), only a power loss
        # or OS crash may take the last ones back, never corrupting the file. That makes a commit
        # about ten times cheaper, and a sweep commits four times per trial. Production runs on
        # PostgreSQL, which keeps its own durability settings.
        cursor.execute("PRAGMA synchronous = NORMAL")
        cursor.execute("PRAGMA foreign_keys = ON")
    finally:
        cursor.close()


def _begin_sqlite_transaction(connection: Connection) -> None:
    if connection.get_execution_options().get(WRITE_OPTION):
        connection.exec_driver_sql("BEGIN IMMEDIATE")
    else:
        connection.exec_driver_sql("BEGIN")
