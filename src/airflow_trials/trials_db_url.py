"""Which trials DB: the one answer that every entry point gets, with Airflow installed or not.

With Airflow installed, :func:`resolve_trials_db_url` answers (the ``trials_default`` connection
first; :mod:`airflow_trials.hooks.trials` uses it too, and re-exports it). It imports Airflow only
when called, so this module sits below the hooks, beside the store. Without it (the engine alone),
``AIRFLOW_TRIALS_DB_URL``, else the default SQLite file (:func:`default_store_url`, which the
store also takes when given no URL). Falling back to the default file is said once per process,
in a warning that names the file: a run written to another database than the one meant is
otherwise found out only by its missing rows.

Example::

    url, source = trials_db_url()     # ("postgresql+psycopg://...", "connection trials_default")
"""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
from typing import Any

from airflow_trials.provider_config import SECTION, setting, setting_source

STORE_HOME_ENV = "AIRFLOW_TRIALS_HOME"
STORE_URL_ENV = "AIRFLOW_TRIALS_DB_URL"
DEFAULT_SOURCE = "the default SQLite file"
log = logging.getLogger(__name__)
_said_default = False


def trials_db_url(
    trials_conn_id: str = "trials_default", *, create_dir: bool = True
) -> tuple[str, str]:
    """``(url, source)`` of the trials DB, found as the DAGs find it (see the module's docstring).

    :param trials_conn_id: the Airflow connection to look for first; default ``trials_default``.
    :param create_dir: create the default SQLite file's directory when that is the answer; default
        True.
    """
    if importlib.util.find_spec("airflow") is not None:
        return resolve_trials_db_url(trials_conn_id, create_dir=create_dir)
    return env_or_default_url(create_dir=create_dir, looked_for="Airflow is not installed")


def default_store_url(create_dir: bool = True, home: str | None = None) -> str:
    """``sqlite:///<home, else $AIRFLOW_TRIALS_HOME, else ~/airflow_trials>/trials.db``.

    :param create_dir: create the directory when missing; default True. Readers that must not
        create anything (the ``airflow-trials`` read commands) pass False.
    :param home: the directory; default none (``$AIRFLOW_TRIALS_HOME``, else ``~/airflow_trials``).
    """
    home = (
        home
        or os.environ.get(STORE_HOME_ENV)
        or os.path.join(os.path.expanduser("~"), "airflow_trials")
    )
    home = os.path.abspath(os.path.expanduser(home))
    if create_dir:
        os.makedirs(home, exist_ok=True)
    return f"sqlite:///{os.path.join(home, 'trials.db')}"


def env_or_default_url(*, create_dir: bool = True, looked_for: str = "") -> tuple[str, str]:
    """``AIRFLOW_TRIALS_DB_URL``, else ``[airflow_trials] db_url`` (with Airflow installed), else
    the default SQLite file in ``[airflow_trials] home`` (with the warning, once); see
    :mod:`airflow_trials.provider_config`."""
    global _said_default
    configured = setting("db_url")
    if configured:
        return configured, setting_source("db_url")
    url = default_store_url(create_dir=create_dir, home=setting("home"))
    if not _said_default:
        _said_default = True
        # On stderr, not through logging: Airflow's logging writes to stdout, where a command's
        # JSON output goes; a task's and a trigger's stderr lands in the task log.
        print(
            f"airflow_trials: no trials DB is configured ({looked_for or 'no connection'}, and "
            f"{STORE_URL_ENV} is not set): using {DEFAULT_SOURCE}, {url}. Set {STORE_URL_ENV} or "
            f"[{SECTION}] db_url, or create the trials_default connection, to use another "
            "database.",
            file=sys.stderr,
            flush=True,
        )
    return url, DEFAULT_SOURCE


def resolve_trials_db_url(
    trials_conn_id: str = "trials_default", *, create_dir: bool = True
) -> tuple[str, str]:
    """The trials DB URL, and where it came from, as every reader and writer of the trials DB
    finds it.

    Tasks, triggers, the dashboard (through
    :meth:`~airflow_trials.hooks.trials.TrialsDbHook.get_url`), the ``airflow-trials``
    command, ``python -m airflow_trials.store``, :class:`~airflow_trials.results.ResultGrid` and
    :class:`~airflow_trials.TrialsDbCallback` all call this (the last three through
    :func:`trials_db_url`), in this order:

    1. the ``trials_conn_id`` connection, as Airflow finds it for the calling process (in a task,
       through the execution API; elsewhere ``AIRFLOW_CONN_<ID>`` and the configured secrets
       backends);
    2. outside a task and a trigger (a command, a notebook), a connection made with ``airflow
       connections add``, from Airflow's metadata DB, as Airflow's own CLI reads it (Airflow 3
       forbids only task and trigger code to read that DB);
    3. ``AIRFLOW_TRIALS_DB_URL``, else ``[airflow_trials] db_url`` (Airflow's configuration:
       ``AIRFLOW__AIRFLOW_TRIALS__DB_URL`` or ``airflow.cfg``);
    4. the default SQLite file (in ``[airflow_trials] home``), said once per process in a
       warning, since a database other than the one meant is otherwise found out only by its
       missing rows.

    :param trials_conn_id: the connection id; default ``trials_default``.
    :param create_dir: create the default SQLite file's directory when that is the answer; default
        True (readers that must create nothing pass False).
    :return: ``(url, source)``; the source reads "connection trials_default", "connection
        trials_default (Airflow's metadata DB)", "AIRFLOW_TRIALS_DB_URL", "[airflow_trials] db_url"
        or "the default SQLite file".
    """
    from airflow.sdk import BaseHook
    from airflow.sdk.exceptions import AirflowNotFoundException

    try:
        found = BaseHook.get_connection(trials_conn_id)
        return _connection_url(found), f"connection {trials_conn_id}"
    except AirflowNotFoundException:
        pass
    conn = _from_airflow_metadata_db(trials_conn_id)
    if conn is not None:
        return _connection_url(conn), f"connection {trials_conn_id} (Airflow's metadata DB)"
    return env_or_default_url(create_dir=create_dir, looked_for=f"no connection {trials_conn_id}")


def _in_task_or_trigger() -> bool:
    """Is this a task's or the triggerer's process, which may not read Airflow's metadata DB?"""
    runner = sys.modules.get("airflow.sdk.execution_time.task_runner")
    return (
        getattr(runner, "SUPERVISOR_COMMS", None) is not None
        or os.environ.get("_AIRFLOW_PROCESS_CONTEXT") == "client"
    )


def _from_airflow_metadata_db(conn_id: str) -> Any:
    """The connection from Airflow's metadata DB, outside a task and a trigger; None when there is
    no such connection, or no such DB (a SQLite metadata DB file that does not exist is not
    created)."""
    from airflow.sdk.exceptions import AirflowNotFoundException

    if _in_task_or_trigger():
        return None
    try:
        from airflow.configuration import conf
        from sqlalchemy.engine import make_url

        metadata = make_url(conf.get("database", "sql_alchemy_conn"))
        if metadata.get_backend_name() == "sqlite" and not os.path.isfile(metadata.database or ""):
            return None
        from airflow.models.connection import Connection

        return Connection.get_connection_from_secrets(conn_id)
    except AirflowNotFoundException:
        return None
    except Exception as e:  # noqa: BLE001 - an unreachable or never-migrated metadata DB: no connection there
        log.debug("Could not read connection %s from Airflow's metadata DB: %s", conn_id, e)
        return None


def _connection_url(conn: Any) -> str:
    """The SQLAlchemy URL of a trials DB connection: its ``url`` extra; a SQLite connection's file
    (in ``host``, as the connection form writes it, or in ``schema``, as Airflow parses
    ``sqlite:////abs/path.db``); else PostgreSQL from host, login, password, port and schema."""
    extra = dict(conn.extra_dejson or {})
    if extra.get("url"):
        return str(extra["url"])
    path = conn.host or conn.schema or ""
    if conn.conn_type == "sqlite" or path.endswith(".db"):
        if not path:
            raise ValueError(
                f"Connection {conn.conn_id} is a SQLite connection without a file; give it one, "
                "e.g. AIRFLOW_CONN_TRIALS_DEFAULT=sqlite:////abs/path/trials.db or --conn-host "
                "/abs/path/trials.db."
            )
        return f"sqlite:///{path}"
    from sqlalchemy.engine import URL

    # URL.create escapes what a password may hold ("@", ":", "/") that a formatted string would not.
    url = URL.create(
        "postgresql+psycopg",
        username=conn.login or None,
        password=conn.password or None,
        host=conn.host or None,
        port=conn.port or None,
        database=conn.schema or None,
    )
    return url.render_as_string(hide_password=False)
