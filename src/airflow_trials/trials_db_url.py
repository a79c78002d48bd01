"""Which trials DB: the one answer that every entry point gets, with Airflow installed or not.

With Airflow installed, :func:`airflow_trials.hooks.trials.resolve_trials_db_url` answers (the
``trials_default`` connection first). Without it (the engine alone), ``AIRFLOW_TRIALS_DB_URL``,
else the default SQLite file. Falling back to the default file is said once per process, in a
warning that names the file: a run written to another database than the one meant is otherwise
found out only by its missing rows.

Example::

    url, source = trials_db_url()     # ("postgresql+psycopg://...", "connection trials_default")
"""

from __future__ import annotations

import importlib.util
import os
import sys

from airflow_trials.store.engine import STORE_URL_ENV, default_store_url

DEFAULT_SOURCE = "the default SQLite file"
_said_default = False


def trials_db_url(trials_conn_id: str = "trials_default", *, create_dir: bool = True) -> tuple[str, str]:
    """``(url, source)`` of the trials DB, found as the DAGs find it (see the module's docstring).

    :param trials_conn_id: the Airflow connection to look for first; default ``trials_default``.
    :param create_dir: create the default SQLite file's directory when that is the answer; default True.
    """
    if importlib.util.find_spec("airflow") is not None:
        from airflow_trials.hooks.trials import resolve_trials_db_url

        return resolve_trials_db_url(trials_conn_id, create_dir=create_dir)
    return env_or_default_url(create_dir=create_dir, looked_for="Airflow is not installed")


def env_or_default_url(*, create_dir: bool = True, looked_for: str = "") -> tuple[str, str]:
    """``AIRFLOW_TRIALS_DB_URL``, else the default SQLite file (with the warning, once)."""
    global _said_default
    if os.environ.get(STORE_URL_ENV):
        return os.environ[STORE_URL_ENV], STORE_URL_ENV
    url = default_store_url(create_dir=create_dir)
    if not _said_default:
        _said_default = True
        # On stderr, not through logging: Airflow's logging writes to stdout, where a command's
        # JSON output goes; a task's and a trigger's stderr lands in the task log.
        print(
            f"airflow_trials: no trials DB is configured ({looked_for or 'no connection'}, and "
            f"{STORE_URL_ENV} is not set): using {DEFAULT_SOURCE}, {url}. Set {STORE_URL_ENV} or create "
            "the trials_default connection to use another database.",
            file=sys.stderr, flush=True,
        )
    return url, DEFAULT_SOURCE
