"""Hooks: the Ray connection, the trials-DB connection, and TrialsHook (actor client, store,
stops)."""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseHook
from airflow.sdk.exceptions import AirflowNotFoundException

from airflow_trials.exceptions import RayUnavailableError, StoreError
from airflow_trials.provider_config import setting
from airflow_trials.trials_db_url import resolve_trials_db_url

if TYPE_CHECKING:
    from airflow_trials.execution.driver.actor_client import TrialActorClient
    from airflow_trials.store import TrialStore

log = logging.getLogger(__name__)

DEFAULT_RAY_CONN_ID = "ray_default"
# Many triggers in one triggerer connect at once, each from a worker thread; ray.init is not
# safe to race, so connecting is serialised per process.
_RAY_INIT_LOCK = threading.Lock()
DEFAULT_TRIALS_CONN_ID = "trials_default"
# What a trial stopped from Airflow keeps as its error message (its record says so in
# ``stopped_from_airflow``, which is what the next try reads; no code decides on this text).
STOPPED_FROM_AIRFLOW = (
    "Stopped from Airflow: its task was cleared or marked, or its process killed."
)
# When this process last made sure its Ray connection is to the cluster now at that address.
_verified_at = float("-inf")
_VERIFY_PERIOD_SECONDS = 10.0


def _extra(conn: Any) -> dict[str, Any]:
    extra = conn.extra_dejson if conn is not None else {}
    return dict(extra or {})


class RayHook(BaseHook):
    """Connects to Ray as a ``ray`` connection says.

    Connection fields: *host* is the Ray address (``ray://head:10001``, ``auto``,
    ``127.0.0.1:6379``);
    extras ``namespace`` (default ``airflow_trials``), ``runtime_env`` (JSON object) and
    ``storage_path`` (where checkpoints go; a path every Ray node reaches, or an fsspec URL).
    Without the connection, the address comes from ``RAY_ADDRESS``, else a local Ray is used
    (started if none runs on this machine). Without ``storage_path``, checkpoints go where
    ``AIRFLOW_TRIALS_STORAGE``, else ``[airflow_trials] storage_path``, says, else to
    ``~/airflow_trials_results``.

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
                "extra": '{"namespace": "airflow_trials", "storage_path": "s3://bucket/trials", '
                '"runtime_env": {}}',
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
            "address": (
                (conn.host if conn is not None and conn.host else None)
                or os.environ.get("RAY_ADDRESS")
            ),
            "namespace": extra.get("namespace") or "airflow_trials",
            "runtime_env": runtime_env,
            "storage_path": extra.get("storage_path") or setting("storage_path"),
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
                gcs.address,
                current.hex()[:12],
                gcs.cluster_id.hex()[:12],
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
            for attempt in range(1, CLIENT_SERVER_ATTEMPTS + 1):
                try:
                    _probe_gcs(kwargs.get("address"))
                    ray.init(**kwargs)
                    return
                except (ConnectionError, TimeoutError, RuntimeError) as e:
                    if attempt < CLIENT_SERVER_ATTEMPTS and _client_server_died(e):
                        self.log.warning(
                            "Ray Client's server for this connection to %s died as it started "
                            "(a fork race in Ray's client proxy, ray-project/ray#63202): "
                            "connecting again (attempt %d of %d).",
                            kwargs.get("address"),
                            attempt + 1,
                            CLIENT_SERVER_ATTEMPTS,
                        )
                        ray.shutdown()
                        continue
                    raise RayUnavailableError(
                        f"Could not connect to Ray at {kwargs.get('address')} "
                        f"({type(e).__name__}: {e}). The Ray head is down, restarting or "
                        f"elsewhere; check connection {self.ray_conn_id!r} "
                        "or RAY_ADDRESS and the head's health. Airflow retries the task."
                    ) from e


#: Connections through Ray Client (``ray://``) tried when the client proxy's server for the
#: connection dies as it starts: the proxy forks it while its own gRPC threads run, and the child
#: sometimes aborts (ray-project/ray#63202, open: about 7% of connections); a new connection gets
#: a new server.
CLIENT_SERVER_ATTEMPTS = 3


def _client_server_died(error: BaseException) -> bool:
    """Did ``ray.init(ray://...)`` fail because the proxy's server for it died at start? The
    proxy says so in the error it sends, or its check of the dead process's command line failed
    (``start_specific_server`` in its traceback)."""
    seen: BaseException | None = error
    while seen is not None:
        text = str(seen)
        if "Starting Ray client server failed" in text or "in start_specific_server" in text:
            return True
        seen = seen.__cause__ or seen.__context__
    return False


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
    URL comes from ``AIRFLOW_TRIALS_DB_URL``, else ``[airflow_trials] db_url``, else the default
    SQLite file.

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
        """The trials DB URL: the connection, else ``AIRFLOW_TRIALS_DB_URL``, else the default
        file."""
        return resolve_trials_db_url(self.trials_conn_id)[0]

    def get_conn(self) -> TrialStore:
        from airflow_trials.store import TrialStore

        return TrialStore(self.get_url())


class TrialsHook(BaseHook):
    """Builds the trial actor client (Ray) and the trials store from their connections: what
    operators, sensors and triggers use, as Databricks' triggers use their hook's client.

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

    def get_actor_client(self, verify: bool = False) -> TrialActorClient:
        """A TrialActorClient on this Ray, with detached named actors other processes can find (no
        runner's executor: a task or a trigger launches, watches and ends one trial's actor).

        :param verify: make sure now that the connection is to the cluster at Ray's address (see
            :meth:`RayHook.get_conn`); default False.
        """
        from airflow_trials.execution.driver.actor_client import TrialActorClient

        settings = self.ray_hook.get_conn(verify)
        return TrialActorClient(
            settings["storage_path"], namespace=settings["namespace"], detached=True
        )

    def get_store(self) -> TrialStore:
        return self.db_hook.get_conn()

    def get_conn(self) -> tuple[TrialActorClient, TrialStore]:
        return self.get_actor_client(), self.get_store()

    @staticmethod
    def record_stop_from_airflow(store: TrialStore, trial_id: str, try_number: int | None) -> bool:
        """Record that Airflow stopped the trial (its task was cleared, marked or killed):
        TERMINATED, ``stopped_from_airflow``; whether it did. The one writer of that stop.

        Fenced by ``try_number``: Airflow may start the task's next try before the old try's
        ``on_kill`` runs, and a stop sent by try N never ends the trial that try N+1 took over
        (False; the caller leaves the actor alone). None stops it whatever try registered it.
        """
        from airflow_trials.store.transitions import StopForTry

        stop = StopForTry(STOPPED_FROM_AIRFLOW, try_number)
        return store.record_transition(trial_id, stop).applied

    def stop_from_airflow(
        self, experiment_name: str, trial_id: str, try_number: int | None
    ) -> bool:
        """From a task's process: record the stop (:meth:`record_stop_from_airflow`), then kill the
        trial's actor and remove its placement groups; whether it did. (The triggerer records it
        the same way but releases only the actor it watched, with calls that survive a GCS
        restart.)"""
        store = self.get_store()
        try:
            stopped = self.record_stop_from_airflow(store, trial_id, try_number)
        except StoreError:
            # The user asked for the stop: a trials DB that cannot record it does not keep the
            # trial running on Ray (the next try finds no actor and reads the stored trial).
            self.get_actor_client().terminate(experiment_name, trial_id)
            raise
        finally:
            store.dispose()
        if stopped:
            self.get_actor_client().terminate(experiment_name, trial_id)
        return stopped
