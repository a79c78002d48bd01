"""The dashboard's FastAPI app: server-rendered pages and a JSON API over the trials store.

Airflow's api-server mounts it under :data:`URL_PREFIX` (see :mod:`.dashboard`). Every route
needs an Airflow user (:mod:`.auth`); the pages' only JavaScript is a fixed line that follows the
Airflow UI's color mode, and every value from the store is escaped by Jinja's autoescape.
Handlers are plain functions, so FastAPI runs the store's blocking queries in its thread pool,
off the event loop. The routes are in :mod:`.routes`, one module per resource, their parameters
in :mod:`.params`, the reads they share in :mod:`.reads` and page rendering in :mod:`.render`.
"""

from __future__ import annotations

import logging
import secrets
import threading
from collections.abc import Callable
from importlib import resources
from typing import Any

from airflow.api_fastapi.app import get_auth_manager
from fastapi import FastAPI, HTTPException, Request, status
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.staticfiles import StaticFiles

from airflow_trials.exceptions import StoreError
from airflow_trials.plugins.data.queries import NotFoundError, TooManyTrialsError
from airflow_trials.plugins.routes import api, pages
from airflow_trials.plugins.web.render import THEME_SCRIPT_HASH, render_page
from airflow_trials.store import TrialReader

log = logging.getLogger(__name__)

URL_PREFIX = "/trials"
_SECURITY_HEADERS = {
    # No script may run on these pages, whatever a config value holds, but the theme script of
    # base.html, admitted by its hash.
    "Content-Security-Policy": (
        f"default-src 'none'; script-src '{THEME_SCRIPT_HASH}'; style-src 'self'; img-src 'self' "
        "data:; "
        "form-action 'self'; frame-ancestors 'self'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
}


class StoreProvider:
    """The dashboard's store, opened on first use (so importing the plugin touches no database).

    :param url: trials DB URL; default the ``trials_default`` connection, else
        ``AIRFLOW_TRIALS_DB_URL``, else the default SQLite file (resolved once: restart the
        api-server after changing the connection).
    """

    def __init__(self, url: str | None = None) -> None:
        self._url = url
        self._store: TrialReader | None = None
        self._lock = threading.Lock()

    def __call__(self) -> TrialReader:
        if self._store is None:
            with self._lock:
                if self._store is None:
                    url = self._url
                    if url is None:
                        from airflow_trials.hooks.trials import TrialsDbHook

                        url = TrialsDbHook().get_url()
                    self._store = TrialReader(url)
                    log.info("Trials dashboard reads %r", self._store)
        return self._store


def _wants_json(request: Request) -> bool:
    root = str(request.scope.get("root_path", ""))
    path = str(request.scope.get("path", ""))
    relative = path[len(root) :] if root and path.startswith(root) else path
    return relative.startswith("/api/") or relative.rstrip("/") == "/openapi.json"


def _error(
    request: Request, status_code: int, detail: Any, headers: dict[str, str] | None = None
) -> Response:
    if _wants_json(request):
        return JSONResponse({"detail": detail}, status_code=status_code, headers=headers)
    login_url = None
    if status_code == status.HTTP_401_UNAUTHORIZED:
        try:
            login_url = get_auth_manager().get_url_login()
        except Exception:  # no auth manager configured: the page still explains the 401
            log.debug("No login URL for the 401 page", exc_info=True)
    message = (
        detail
        if isinstance(detail, str)
        else "; ".join(
            f"{'.'.join(str(p) for p in d.get('loc', ()))}: {d.get('msg')}" for d in detail
        )
    )
    return render_page(
        request,
        "error.html",
        status_code=status_code,
        title=f"Error {status_code}",
        code=status_code,
        message=message,
        login_url=login_url,
    )


def create_app(store: str | Callable[[], TrialReader] | None = None) -> FastAPI:
    """The dashboard app, to be mounted under :data:`URL_PREFIX` by Airflow's api-server.

    :param store: the trials DB URL, or a callable returning the :class:`TrialReader`;
        default: resolved on the first request through ``TrialsDbHook`` (connection
        ``trials_default``, else ``AIRFLOW_TRIALS_DB_URL``, else the default SQLite file).
    """
    app = FastAPI(
        title="Airflow Trials dashboard",
        description="Experiments, leaderboards and learning curves from the trials store. Every "
        "endpoint "
        "needs an Airflow JWT (Authorization: Bearer, or the UI's _token cookie) and read "
        "access to the DAG that ran the experiment.",
        version="1",
        # Swagger UI and ReDoc load their assets from a CDN; the schema is /openapi.json.
        docs_url=None,
        redoc_url=None,
    )
    app.state.store_provider = store if callable(store) else StoreProvider(store)
    app.include_router(api)
    app.include_router(pages)
    app.mount(
        "/static",
        StaticFiles(directory=str(resources.files("airflow_trials.plugins") / "static")),
        name="static",
    )

    @app.middleware("http")
    async def security_headers(request: Request, call_next: Any) -> Response:
        response: Response = await call_next(request)
        for name, value in _SECURITY_HEADERS.items():
            response.headers.setdefault(name, value)
        return response

    _handle_errors(app)
    return app


def _handle_errors(app: FastAPI) -> None:
    """Errors as JSON under /api, as an error page elsewhere."""

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, e: HTTPException) -> Response:
        return _error(request, e.status_code, e.detail, getattr(e, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, e: RequestValidationError) -> Response:
        return _error(request, status.HTTP_422_UNPROCESSABLE_CONTENT, _plain(e.errors()))

    @app.exception_handler(NotFoundError)
    async def not_found(request: Request, e: NotFoundError) -> Response:
        return _error(request, status.HTTP_404_NOT_FOUND, str(e))

    @app.exception_handler(TooManyTrialsError)
    async def too_many_trials(request: Request, e: TooManyTrialsError) -> Response:
        return _error(request, status.HTTP_409_CONFLICT, str(e))

    @app.exception_handler(StoreError)
    async def store_error(request: Request, e: StoreError) -> Response:
        return _error(request, status.HTTP_503_SERVICE_UNAVAILABLE, _store_error_detail(e))


def _store_error_detail(error: StoreError) -> str:
    """What a dashboard user sees of a store error: an id and the fix. The whole error names the
    database's host, user and driver, so it goes to the api-server's log under that id."""
    error_id = secrets.token_hex(4)
    log.warning("Trials dashboard could not read the trials store (error %s): %s", error_id, error)
    fix = (
        error.fix
        or "Check that the trials DB is reachable and migrated (airflow-trials db upgrade)."
    )
    return (
        f"The trials DB could not answer (error {error_id}). {fix} The api-server's log has the "
        f"whole error under {error_id}."
    )


def _plain(errors: Any) -> list[dict[str, Any]]:
    """Validation errors without the raw input echoed back (it may be hostile)."""
    return [
        {"loc": list(d.get("loc", ())), "msg": str(d.get("msg", "")), "type": d.get("type")}
        for d in errors
    ]
