"""The Airflow plugin: mounts the trials dashboard in the api-server and links it into the UI.

Airflow loads a provider's declared plugins (``get_provider_info()["plugins"]``) only with
``[core] lazy_discover_providers = False``; by default it skips them. So the plugin is also
registered under the ``airflow.plugins`` entry point, whose target (``EntryPointPlugin``, see
:func:`__getattr__`) makes sure Airflow registers it only once.

Schedulers, dag-processors and workers load plugins too. Importing this module therefore pulls
in neither FastAPI nor the dashboard: :class:`LazyDashboardApp` builds it on the first request.
"""

from __future__ import annotations

import threading
from typing import Any
from urllib.parse import urlsplit

from airflow.configuration import conf
from airflow.plugins_manager import AirflowPlugin

URL_PREFIX = "/trials"  # same as airflow_trials.plugins.app.URL_PREFIX, kept import-free here


def _ui_base_path() -> str:
    """The path Airflow's UI and API are served under (``[api] base_url``), ending in ``/``."""
    path = urlsplit(conf.get("api", "base_url", fallback="") or "/").path or "/"
    return path if path.endswith("/") else path + "/"


class LazyDashboardApp:
    """An ASGI app that creates the dashboard's FastAPI app on its first request."""

    def __init__(self) -> None:
        self._app: Any = None
        self._lock = threading.Lock()

    def _get(self) -> Any:
        if self._app is None:
            with self._lock:
                if self._app is None:
                    from airflow_trials.plugins.app import create_app

                    self._app = create_app()
        return self._app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self._get()(scope, receive, send)


def external_views(base_path: str) -> list[dict[str, Any]]:
    """The UI entries: "Experiments" in the navigation, and a tab on DAG runs and task instances.

    The UI fills in ``{DAG_ID}``, ``{RUN_ID}``, ``{TASK_ID}`` and ``{MAP_INDEX}`` and shows the
    page in a frame under ``plugin/<url_route>``.
    """
    root = f"{base_path}{URL_PREFIX.lstrip('/')}"
    return [
        {
            "name": "Experiments",
            "href": f"{root}/",
            "destination": "nav",
            "url_route": "experiments",
            "nav_top_level": True,
            "icon": f"{root}/static/icon.svg",
        },
        {
            "name": "Experiment",
            "href": f"{root}/dag-run?dag_id={{DAG_ID}}&run_id={{RUN_ID}}",
            "destination": "dag_run",
            "url_route": "experiment-run",
        },
        {
            "name": "Trial",
            "href": f"{root}/task-instance?dag_id={{DAG_ID}}&run_id={{RUN_ID}}&task_id={{TASK_ID}}"
            f"&map_index={{MAP_INDEX}}",
            "destination": "task_instance",
            "url_route": "trial",
        },
    ]


class TrialsDashboardPlugin(AirflowPlugin):
    """Experiments, leaderboards and learning curves from the trials store, inside the Airflow UI.

    Pages and a JSON API under ``/trials`` (``/trials/openapi.json``); see docs/dashboard.md.
    """

    name = "airflow_trials_dashboard"
    fastapi_apps = [
        {"app": LazyDashboardApp(), "url_prefix": URL_PREFIX, "name": "Airflow Trials dashboard"}
    ]
    external_views = external_views(_ui_base_path())


_entry_point_lock = threading.Lock()
_entry_point_used = False


def __getattr__(name: str) -> Any:
    """``EntryPointPlugin``, the ``airflow.plugins`` entry point: the plugin once, then None.

    Airflow's plugins manager registers every entry point it finds and reports a second plugin
    of the same name as an import error (shown in the UI). It finds this one twice in an editable
    install (``src/`` is on ``sys.path``, so ``src/airflow_trials.egg-info`` is a second copy of
    the package's metadata), and the provider's declared plugin as well when
    ``[core] lazy_discover_providers = False``. None makes it skip the extra ones silently.
    """
    global _entry_point_used
    if name != "EntryPointPlugin":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from airflow import settings

    with _entry_point_lock:
        if _entry_point_used or not settings.LAZY_LOAD_PROVIDERS:
            return None
        _entry_point_used = True
        return TrialsDashboardPlugin
