"""Hooks: the Ray connection, the trials-DB connection, and TrialsHook that builds the executor and store."""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseHook
from airflow.sdk.exceptions import AirflowNotFoundException

from airflow_trials.exceptions import RayUnavailableError

if TYPE_CHECKING:
    from airflow_trials.execution.driver.executor import RayTrialExecutor
    from airflow_trials.store import TrialStore

log = logging.getLogger(__name__)

DEFAULT_RAY_CONN_ID = "ray_default"
# Many triggers in one triggerer connect at once, each from a worker thread; ray.init is not
# safe to race, so connecting is serialised per process.
_RAY_INIT_LOCK = threading.Lock()
DEFAULT_TRIALS_CONN_ID = "trials_default"
# When this process last made sure its Ray connection is to the cluster now at that address.
_verified_at = float("-inf")
_VERIFY_PERIOD_SECONDS = 10.0


def _extra(conn: Any) -> dict[str, Any]:
    extra = conn.extra_dejson if conn is not None else {}
    return dict(extra or {})


class RayHook(BaseHook):
    """Connects to Ray as a ``ray`` connection says.

    Connection fields: *host* is the Ray address (``ray://head:10001``, ``auto``, ``127.0.0.1:6379``);
    extras ``namespace`` (default ``airflow_trials``), ``runtime_env`` (JSON object) and
    ``storage_path`` (where checkpoints go; a path every Ray node reaches, or an fsspec URL).
    Without the connection, the address comes from ``RAY_ADDRESS``, else a local Ray is used
    (started if none runs on this machine).

    :param ray_conn_id: the connection id; default ``ray_default``.
    """

    conn_name_attr = "ray_conn_id"
    default_conn_name = DEFAULT_RAY_CONN_ID
    conn_type = "ray"
    hook_name = "Ray (airflow_trials)"

    @classmethod
    def get_ui_field_behaviour(cls) -> dict[str, Any]:
        return {
            "hidden_fields": ["schema", "login", "password", "port"],
            "relabeling": {"host": "Ray address"},
            "placeholders": {
                "host": "ray://ray-head:10001 (empty: RAY_ADDRESS, else a local Ray)",
                "extra": '{"namespace": "airflow_trials", "storage_path": "s3://bucket/trials", "runtime_env": {}}',
            },
        }

    def __init__(self, ray_conn_id: str = DEFAULT_RAY_CONN_ID, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.ray_conn_id = ray_conn_id

    def _connection(self) -> Any:
        try:
            return self.get_connection(self.ray_conn_id)
        except AirflowNotFoundException:
            self.log.info("No connection %s; using RAY_ADDRESS or a local Ray.", self.ray_conn_id)
            return None

    def settings(self) -> dict[str, Any]:
        """address, namespace, runtime_env and storage_path after the fallbacks."""
        conn = self._connection()
        extra = _extra(conn)
        runtime_env = extra.get("runtime_env") or None
        if isinstance(runtime_env, str):
            runtime_env = json.loads(runtime_env)
        return {
            "address": (conn.host if conn is not None and conn.host else None) or os.environ.get("RAY_ADDRESS"),
            "namespace": extra.get("namespace") or "airflow_trials",
            "runtime_env": runtime_env,
            "storage_path": extra.get("storage_path") or None,
        }

    def get_conn(self, verify: bool = False) -> dict[str, Any]:
        """Connect this process to Ray and return the settings used.

        Connects once per process, and again when the cluster at that address is a new one (the
        Ray head restarted): the old connection would fail every call. That is checked at most
        every 10 s, or now with ``verify``. Raises
        :class:`~airflow_trials.exceptions.RayUnavailableError` when Ray does not answer.
        """
        settings = self.settings()
        with _RAY_INIT_LOCK:
            self._drop_stale_connection(verify)
            self._init_ray(settings)
        return settings

    def _drop_stale_connection(self, verify: bool) -> None:
        import ray

        global _verified_at
        recently = time.monotonic() - _verified_at < _VERIFY_PERIOD_SECONDS
        if not ray.is_initialized() or (recently and not verify):
            return
        from ray.util.client import ray as ray_client

        if ray_client.is_connected():
            return  # Ray Client reconnects by itself, or its calls fail with ConnectionError
        from ray._raylet import GcsClient  # type: ignore[attr-defined]  # not in ray's stubs

        gcs = ray._private.worker.global_worker.gcs_client  # type: ignore[attr-defined]
        try:
            # A fresh client asks the GCS now serving this address for its cluster id; it blocks
            # (about 40 s) while no GCS answers there.
            current = GcsClient(address=gcs.address).cluster_id
        except Exception as e:
            raise RayUnavailableError(
                f"Ray at {gcs.address} does not answer ({type(e).__name__}: {e}). The Ray head is "
                "down or restarting; Airflow retries the task. Check the head's health."
            ) from e
        if current != gcs.cluster_id:
            self.log.warning(
                "The Ray cluster at %s restarted (cluster id %s, was %s): reconnecting. Trials of "
                "the old cluster are gone; their tasks resume them from their latest checkpoints.",
                gcs.address, current.hex()[:12], gcs.cluster_id.hex()[:12],
            )
            ray.shutdown()
        _verified_at = time.monotonic()

    def _init_ray(self, settings: dict[str, Any]) -> None:
        import ray

        if not ray.is_initialized():
            kwargs: dict[str, Any] = {"namespace": settings["namespace"], "log_to_driver": False}
            if settings["runtime_env"]:
                kwargs["runtime_env"] = settings["runtime_env"]
            if settings["address"]:
                kwargs["address"] = settings["address"]
            else:
                # Join a Ray already running on this machine, else start one.
                kwargs["address"] = "auto" if local_ray_running() else None
                kwargs["include_dashboard"] = False
            os.environ.setdefault("RAY_AUTH_MODE", "disabled")
            self.log.info("Connecting to Ray at %s", kwargs.get("address") or "a new local cluster")
            try:
                _probe_gcs(kwargs.get("address"))
                ray.init(**kwargs)
            except (ConnectionError, TimeoutError, RuntimeError) as e:
                raise RayUnavailableError(
                    f"Could not connect to Ray at {kwargs.get('address')} ({type(e).__name__}: {e}). The "
                    f"Ray head is down, restarting or elsewhere; check connection {self.ray_conn_id!r} "
                    "or RAY_ADDRESS and the head's health. Airflow retries the task."
                ) from e


def _probe_gcs(address: str | None) -> None:
    """Fail within about 40 s when no GCS answers at a plain ``host:port`` address: ``ray.init``
    itself waits minutes there, holding a worker slot while the Ray head is down."""
    if not address or "://" in address or address in ("auto", "local"):
        return
    from ray._raylet import GcsClient  # type: ignore[attr-defined]  # not in ray's stubs

    try:
        GcsClient(address=address).cluster_id  # noqa: B018 (connecting is the check)
    except Exception as e:  # Ray's RpcError, which it does not export
        raise ConnectionError(f"no Ray GCS answers at {address}: {e}") from e


def local_ray_running() -> bool:
    """Is a Ray cluster running on this machine (one started with `ray start`, say)?"""
    from ray._private.services import find_gcs_addresses

    return bool(find_gcs_addresses())


class TrialsDbHook(BaseHook):
    """Points at the trials metadata database (never Airflow's own).

    Connection: extra ``{"url": "postgresql+psycopg://user:pw@host/db"}``, or a ``postgres``-style
    connection (host, login, password, port, schema as the database). Without the connection, the
    URL comes from ``AIRFLOW_TRIALS_DB_URL``, else the default SQLite file.

    :param trials_conn_id: the connection id; default ``trials_default``.
    """

    conn_name_attr = "trials_conn_id"
    default_conn_name = DEFAULT_TRIALS_CONN_ID
    conn_type = "trials_db"
    hook_name = "Trials metadata DB (airflow_trials)"

    @classmethod
    def get_ui_field_behaviour(cls) -> dict[str, Any]:
        return {
            "hidden_fields": [],
            "relabeling": {"schema": "Database"},
            "placeholders": {"extra": '{"url": "postgresql+psycopg://airflow@postgres/trials"}'},
        }

    def __init__(self, trials_conn_id: str = DEFAULT_TRIALS_CONN_ID, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.trials_conn_id = trials_conn_id

    def get_url(self) -> str:
        """The trials DB URL: the connection, else ``AIRFLOW_TRIALS_DB_URL``, else the default file."""
        return resolve_trials_db_url(self.trials_conn_id)[0]

    def get_conn(self) -> TrialStore:
        from airflow_trials.store import TrialStore

        return TrialStore(self.get_url())


def resolve_trials_db_url(
    trials_conn_id: str = DEFAULT_TRIALS_CONN_ID, *, create_dir: bool = True
) -> tuple[str, str]:
    """The trials DB URL, and where it came from, as every reader and writer of the trials DB finds it.

    Tasks, triggers, the dashboard (through :meth:`TrialsDbHook.get_url`), the ``airflow-trials``
    command, ``python -m airflow_trials.store``, :class:`~airflow_trials.results.ResultGrid` and
    :class:`~airflow_trials.TrialsDbCallback` all call this (the last three through
    :func:`airflow_trials.trials_db_url.trials_db_url`), in this order:

    1. the ``trials_conn_id`` connection, as Airflow finds it for the calling process (in a task, through
       the execution API; elsewhere ``AIRFLOW_CONN_<ID>`` and the configured secrets backends);
    2. outside a task and a trigger (a command, a notebook), a connection made with ``airflow
       connections add``, from Airflow's metadata DB, as Airflow's own CLI reads it (Airflow 3 forbids
       only task and trigger code to read that DB);
    3. ``AIRFLOW_TRIALS_DB_URL``;
    4. the default SQLite file, said once per process in a warning, since a database other than the
       one meant is otherwise found out only by its missing rows.

    :param trials_conn_id: the connection id; default ``trials_default``.
    :param create_dir: create the default SQLite file's directory when that is the answer; default
        True (readers that must create nothing pass False).
    :return: ``(url, source)``; the source reads "connection trials_default", "connection
        trials_default (Airflow's metadata DB)", "AIRFLOW_TRIALS_DB_URL" or "the default SQLite file".
    """
    from airflow_trials.trials_db_url import env_or_default_url

    try:
        return _connection_url(BaseHook.get_connection(trials_conn_id)), f"connection {trials_conn_id}"
    except AirflowNotFoundException:
        pass
    conn = _from_airflow_metadata_db(trials_conn_id)
    if conn is not None:
        return _connection_url(conn), f"connection {trials_conn_id} (Airflow's metadata DB)"
    return env_or_default_url(create_dir=create_dir, looked_for=f"no connection {trials_conn_id}")


def _in_task_or_trigger() -> bool:
    """Is this a task's or the triggerer's process, which may not read Airflow's metadata DB?"""
    runner = sys.modules.get("airflow.sdk.execution_time.task_runner")
    return getattr(runner, "SUPERVISOR_COMMS", None) is not None or os.environ.get(
        "_AIRFLOW_PROCESS_CONTEXT") == "client"


def _from_airflow_metadata_db(conn_id: str) -> Any:
    """The connection from Airflow's metadata DB, outside a task and a trigger; None when there is no
    such connection, or no such DB (a SQLite metadata DB file that does not exist is not created)."""
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
    extra = _extra(conn)
    if extra.get("url"):
        return str(extra["url"])
    path = conn.host or conn.schema or ""
    if conn.conn_type == "sqlite" or path.endswith(".db"):
        if not path:
            raise ValueError(
                f"Connection {conn.conn_id} is a SQLite connection without a file; give it one, e.g. "
                "AIRFLOW_CONN_TRIALS_DEFAULT=sqlite:////abs/path/trials.db or --conn-host /abs/path/trials.db."
            )
        return f"sqlite:///{path}"
    from sqlalchemy.engine import URL

    # URL.create escapes what a password may hold ("@", ":", "/") that a formatted string would not.
    url = URL.create(
        "postgresql+psycopg", username=conn.login or None, password=conn.password or None,
        host=conn.host or None, port=conn.port or None, database=conn.schema or None,
    )
    return url.render_as_string(hide_password=False)


class TrialsHook(BaseHook):
    """Builds the trial executor (Ray) and the trials store from their connections.

    :param ray_conn_id: Ray connection; default ``ray_default``.
    :param trials_conn_id: trials DB connection; default ``trials_default``.
    """

    hook_name = "airflow_trials"

    def __init__(
        self,
        ray_conn_id: str = DEFAULT_RAY_CONN_ID,
        trials_conn_id: str = DEFAULT_TRIALS_CONN_ID,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.ray_hook = RayHook(ray_conn_id)
        self.db_hook = TrialsDbHook(trials_conn_id)

    def get_executor(self, verify: bool = False) -> RayTrialExecutor:
        """A RayTrialExecutor on this Ray, with detached named actors other processes can find.

        :param verify: make sure now that the connection is to the cluster at Ray's address (see
            :meth:`RayHook.get_conn`); default False.
        """
        from airflow_trials.execution.driver.executor import RayTrialExecutor

        settings = self.ray_hook.get_conn(verify)
        return RayTrialExecutor(
            settings["storage_path"], namespace=settings["namespace"], detached=True
        )

    def get_store(self) -> TrialStore:
        return self.db_hook.get_conn()

    def get_conn(self) -> tuple[RayTrialExecutor, TrialStore]:
        return self.get_executor(), self.get_store()
