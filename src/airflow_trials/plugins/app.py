"""The dashboard's FastAPI app: server-rendered pages and a JSON API over the trials store.

Airflow's api-server mounts it under :data:`URL_PREFIX` (see :mod:`.dashboard`). Every route
needs an Airflow user (:mod:`.auth`); pages carry no JavaScript, and every value from the store
is escaped by Jinja's autoescape. Handlers are plain functions, so FastAPI runs the store's
blocking queries in its thread pool, off the event loop.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from importlib import resources
from typing import Annotated, Any
from urllib.parse import quote, urlencode

import jinja2
from airflow.api_fastapi.app import API_ROOT_PATH, get_auth_manager
from fastapi import APIRouter, Depends, FastAPI, HTTPException, Path, Query, Request, status
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from markupsafe import Markup

from airflow_trials.core.trial import validate_name
from airflow_trials.exceptions import StoreError, TrialNotFoundError
from airflow_trials.plugins.auth import RUN_ACCESS, TRIAL_ACCESS, UserDep, may_read, require_read
from airflow_trials.plugins.queries import (
    DEFAULT_CURVES,
    DEFAULT_PAGE_SIZE,
    MAX_CURVES,
    MAX_PAGE_SIZE,
    SORT_KEYS,
    BoardPage,
    DashboardStore,
    NotFoundError,
    best_checkpoint,
    best_point,
    is_live,
    leaderboard_page,
)
from airflow_trials.plugins.schemas import (
    CurvesOut,
    ExperimentOut,
    LeaderboardOut,
    LeaderboardRowOut,
    ResultsOut,
    RunOut,
    TrialOut,
)
from airflow_trials.plugins.svg import learning_curves_svg
from airflow_trials.store import ExperimentRunRecord, TrialRecord

log = logging.getLogger(__name__)

URL_PREFIX = "/trials"
# Pages of a run that is still going re-load themselves (a <meta> refresh: no script needed).
REFRESH_SECONDS = 10
# A trial page lists its newest results; the chart and the JSON API have all of them.
RESULTS_SHOWN = 200
# Experiment names and trial ids follow core.trial.validate_name; the handlers also run it.
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
# Airflow's own rule for dag_id and task_id (KEY_REGEX; a task in a group has dots).
AIRFLOW_KEY_PATTERN = r"^[A-Za-z0-9_.-]{1,250}$"
# run_ids are free text in Airflow (manual__2026-01-01T00:00:00+00:00): no control characters.
AIRFLOW_RUN_ID_PATTERN = r"^[^\x00-\x1f\x7f]{1,250}$"
# The UI leaves "{MAP_INDEX}" in the link of a task instance that is not mapped.
MAP_INDEX_PATTERN = r"^(-1|[0-9]{1,9}|\{MAP_INDEX\})$"
METRIC_PATTERN = r'^[^"\x00-\x1f]{1,250}$'

_TEMPLATES = jinja2.Environment(
    loader=jinja2.PackageLoader("airflow_trials.plugins", "templates"),
    autoescape=True,  # every config value, trial id and traceback is escaped
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)


def _short(value: Any) -> str:
    """A config or metric value for a table cell (the template escapes it)."""
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True)
    return str(value)


_TEMPLATES.filters["short"] = _short
_SECURITY_HEADERS = {
    # No script may run on these pages, whatever a config value holds.
    "Content-Security-Policy": (
        "default-src 'none'; style-src 'self'; img-src 'self' data:; form-action 'self'; "
        "frame-ancestors 'self'; base-uri 'none'"
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
        self._store: DashboardStore | None = None
        self._lock = threading.Lock()

    def __call__(self) -> DashboardStore:
        if self._store is None:
            with self._lock:
                if self._store is None:
                    url = self._url
                    if url is None:
                        from airflow_trials.hooks.trials import TrialsDbHook

                        url = TrialsDbHook().get_url()
                    self._store = DashboardStore(url)
                    log.info("Trials dashboard reads %r", self._store)
        return self._store


def _store(request: Request) -> DashboardStore:
    provider: Callable[[], DashboardStore] = request.app.state.store_provider
    return provider()


StoreDep = Annotated[DashboardStore, Depends(_store)]
RunPk = Annotated[int, Path(ge=1, le=2**31 - 1, description="The experiment run's id.")]
ExperimentName = Annotated[str, Path(pattern=NAME_PATTERN, description="The experiment's name.")]
TrialId = Annotated[str, Path(pattern=NAME_PATTERN, description="The trial's id.")]
Metric = Annotated[str | None, Query(pattern=METRIC_PATTERN, description="Default: the experiment's metric.")]
Mode = Annotated[str | None, Query(pattern="^(min|max)$", description="Default: the experiment's mode.")]
Sort = Annotated[str, Query(pattern=f"^({'|'.join(SORT_KEYS)})$", description="Column to sort the page by.")]
Order = Annotated[str, Query(pattern="^(asc|desc)$")]
Page = Annotated[int, Query(ge=1, le=1_000_000)]
PageSize = Annotated[int, Query(ge=1, le=MAX_PAGE_SIZE, description=f"Rows per page, 1 to {MAX_PAGE_SIZE}.")]
Top = Annotated[int, Query(ge=1, le=MAX_CURVES, description="How many of the best trials to draw.")]


def _checked_name(kind: str, value: str) -> str:
    try:
        return validate_name(kind, value)
    except ValueError as e:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, str(e)) from e


class Links:
    """URLs of the dashboard's pages (under its mount point) and of Airflow's UI."""

    def __init__(self, request: Request) -> None:
        self.base = str(request.scope.get("root_path", "")).rstrip("/")

    def home(self) -> str:
        return f"{self.base}/"

    def static(self, name: str) -> str:
        return f"{self.base}/static/{quote(name)}"

    def experiment(self, name: str) -> str:
        return f"{self.base}/experiments/{quote(name, safe='')}"

    def run(self, run_pk: int, **query: Any) -> str:
        return f"{self.base}/runs/{run_pk}" + _query(query)

    def curves(self, run_pk: int, **query: Any) -> str:
        return f"{self.base}/runs/{run_pk}/curves" + _query(query)

    def trial(self, trial_id: str) -> str:
        return f"{self.base}/trials/{quote(trial_id, safe='')}"

    @staticmethod
    def task_instance(trial: TrialRecord) -> str | None:
        """The Airflow UI page of the trial's task instance; it opens on the logs."""
        if not (trial.dag_id and trial.run_id and trial.task_id):
            return None
        url = (f"{API_ROOT_PATH}dags/{quote(trial.dag_id, safe='')}/runs/{quote(trial.run_id, safe='')}"
               f"/tasks/{quote(trial.task_id, safe='')}")
        if trial.map_index >= 0:
            url += f"/mapped/{trial.map_index}"
        return url + (f"?try_number={trial.try_number}" if trial.try_number else "")

    @staticmethod
    def dag_run(run: ExperimentRunRecord) -> str | None:
        if not (run.dag_id and run.run_id):
            return None
        return f"{API_ROOT_PATH}dags/{quote(run.dag_id, safe='')}/runs/{quote(run.run_id, safe='')}"


def _query(values: dict[str, Any]) -> str:
    kept = {k: v for k, v in values.items() if v is not None}
    return f"?{urlencode(kept)}" if kept else ""


def _page(request: Request, template: str, *, status_code: int = 200, **context: Any) -> HTMLResponse:
    context.setdefault("refresh", None)
    context.setdefault("crumbs", [])
    html = _TEMPLATES.get_template(template).render(links=Links(request), **context)
    return HTMLResponse(html, status_code=status_code)


# -- reading, with the checks every page and endpoint share ---------------------------------------

def _readable_runs(user: Any, runs: list[ExperimentRunRecord]) -> list[ExperimentRunRecord]:
    allowed: dict[str | None, bool] = {}
    for run in runs:
        if run.dag_id not in allowed:
            allowed[run.dag_id] = may_read(user, run.dag_id, RUN_ACCESS)
    return [run for run in runs if allowed[run.dag_id]]


def _experiments(store: DashboardStore, user: Any, links: Links) -> list[ExperimentOut]:
    runs = _readable_runs(user, store.list_experiment_runs())
    counts = store.trial_counts()
    by_experiment: dict[str, list[RunOut]] = {}
    for run in runs:
        by_experiment.setdefault(run.experiment_name, []).append(
            RunOut.of(run, counts.get(run.id, 0), links.run(run.id))
        )
    return [
        ExperimentOut(name=e.name, metric=e.metric, mode=e.mode, created_at=e.created_at,
                      runs=by_experiment[e.name])
        for e in store.list_experiments()
        if e.name in by_experiment
    ]


def _experiment(store: DashboardStore, user: Any, links: Links, name: str) -> ExperimentOut:
    _checked_name("Experiment name", name)
    found = [e for e in _experiments(store, user, links) if e.name == name]
    if not found:
        # Also when every run is on DAGs the user may not read: do not tell them it exists.
        raise NotFoundError(
            f"Experiment {name} has no runs you may read in the trials store; pick one from the "
            f"experiments list."
        )
    return found[0]


def _run(store: DashboardStore, user: Any, run_pk: int) -> ExperimentRunRecord:
    run = store.get_experiment_run(run_pk)
    require_read(user, run.dag_id, RUN_ACCESS, f"experiment run {run_pk} of experiment {run.experiment_name}")
    return run


def _goal(store: DashboardStore, run: ExperimentRunRecord, metric: str | None, mode: str | None) -> tuple[str, str]:
    experiment = next((e for e in store.list_experiments() if e.name == run.experiment_name), None)
    metric = metric or (experiment.metric if experiment else None)
    if not metric:
        raise HTTPException(
            status.HTTP_422_UNPROCESSABLE_CONTENT,
            f"Experiment {run.experiment_name} records no metric to rank run {run.id} by; add ?metric=NAME.",
        )
    return metric, mode or (experiment.mode if experiment else None) or "min"


def _board(store: DashboardStore, user: Any, run_pk: int, metric: str | None, mode: str | None,
           sort: str, order: str, page: int, page_size: int) -> BoardPage:
    run = _run(store, user, run_pk)
    metric, mode = _goal(store, run, metric, mode)
    return leaderboard_page(store, run, metric, mode, sort=sort, descending=order == "desc",
                            page=page, page_size=page_size)


def _curves(store: DashboardStore, user: Any, run_pk: int, metric: str | None, top: int,
            ) -> tuple[ExperimentRunRecord, str, str, str | None, dict[str, list[tuple[int, float]]]]:
    run = _run(store, user, run_pk)
    metric, mode = _goal(store, run, metric, None)
    board = store.leaderboard(run.id, metric, mode, limit=top)
    best = board[0].trial_id if board and board[0].best_value is not None else None
    return run, metric, mode, best, store.metric_curves([row.trial_id for row in board], metric)


def _trial(store: DashboardStore, user: Any, trial_id: str) -> tuple[TrialRecord, ExperimentRunRecord | None]:
    _checked_name("Trial id", trial_id)
    try:
        trial = store.get_trial(trial_id)
    except TrialNotFoundError as e:
        raise NotFoundError(f"Trial {trial_id} is not in the trials store; pick one from a leaderboard.") from e
    run = store.get_experiment_run(trial.experiment_run_id) if trial.experiment_run_id is not None else None
    dag_id = trial.dag_id or (run.dag_id if run else None)
    require_read(user, dag_id, TRIAL_ACCESS, f"trial {trial_id}")
    return trial, run


def _board_out(board: BoardPage, links: Links) -> LeaderboardOut:
    return LeaderboardOut(
        run=RunOut.of(board.run, board.total, links.run(board.run.id)), metric=board.metric, mode=board.mode,
        sort=board.sort, order="desc" if board.descending else "asc", page=board.page,
        page_size=board.page_size, pages=board.pages, total=board.total, best_trial_id=board.best_trial_id,
        status_counts=board.status_counts, config_keys=board.config_keys,
        rows=[
            LeaderboardRowOut(
                rank=r.rank, trial_id=r.trial.trial_id, status=r.trial.status.value,
                num_failures=r.trial.num_failures, config=r.config, best_value=r.trial.best_value,
                best_iteration=r.trial.best_iteration, best_checkpoint=r.checkpoint, url=links.trial(r.trial.trial_id),
            )
            for r in board.rows
        ],
    )


# -- JSON API ---------------------------------------------------------------------------------------

api = APIRouter(prefix="/api", tags=["Trials dashboard"])


@api.get("/experiments", response_model=list[ExperimentOut], summary="Experiments and their runs")
def list_experiments_api(request: Request, user: UserDep, store: StoreDep) -> list[ExperimentOut]:
    return _experiments(store, user, Links(request))


@api.get("/experiments/{experiment}", response_model=ExperimentOut, summary="One experiment and its runs")
def experiment_api(request: Request, experiment: ExperimentName, user: UserDep, store: StoreDep) -> ExperimentOut:
    return _experiment(store, user, Links(request), experiment)


@api.get("/runs/{run_pk}/leaderboard", response_model=LeaderboardOut, summary="One page of a run's leaderboard")
def leaderboard_api(
    request: Request, run_pk: RunPk, user: UserDep, store: StoreDep, metric: Metric = None, mode: Mode = None,
    sort: Sort = "metric", order: Order = "asc", page: Page = 1, page_size: PageSize = DEFAULT_PAGE_SIZE,
) -> LeaderboardOut:
    board = _board(store, user, run_pk, metric, mode, sort, order, page, page_size)
    return _board_out(board, Links(request))


@api.get("/runs/{run_pk}/curves", response_model=CurvesOut, summary="Learning curves of a run's best trials")
def curves_api(run_pk: RunPk, user: UserDep, store: StoreDep, metric: Metric = None,
               top: Top = DEFAULT_CURVES) -> CurvesOut:
    run, metric_, mode, best, curves = _curves(store, user, run_pk, metric, top)
    return CurvesOut(run_id=run.id, metric=metric_, mode=mode, best_trial_id=best, curves=curves)


@api.get("/trials/{trial_id}", response_model=TrialOut, summary="A trial: status, failures, checkpoints")
def trial_api(request: Request, trial_id: TrialId, user: UserDep, store: StoreDep) -> TrialOut:
    trial, run = _trial(store, user, trial_id)
    checkpoints = store.checkpoints_of([trial_id]).get(trial_id, [])
    best_iteration = _trial_curve(store, trial, run)[3]
    return TrialOut(trial=trial, checkpoints=checkpoints, best_checkpoint=best_checkpoint(checkpoints, best_iteration),
                    best_iteration=best_iteration, task_instance_url=Links.task_instance(trial))


@api.get("/trials/{trial_id}/results", response_model=ResultsOut, summary="Every result a trial reported")
def results_api(trial_id: TrialId, user: UserDep, store: StoreDep) -> ResultsOut:
    _trial(store, user, trial_id)
    return ResultsOut(trial_id=trial_id, results=store.get_results(trial_id))


def _trial_curve(store: DashboardStore, trial: TrialRecord, run: ExperimentRunRecord | None,
                 ) -> tuple[str | None, str | None, list[tuple[int, float]], int | None]:
    """The trial's metric, mode, curve of that metric, and the iteration of its best value."""
    if run is None:
        return None, None, [], None
    metric, mode = _goal(store, run, None, None)
    curve = store.metric_curves([trial.trial_id], metric)[trial.trial_id]
    best = best_point(curve, mode)
    return metric, mode, curve, best[0] if best else None


# -- pages ------------------------------------------------------------------------------------------

pages = APIRouter(include_in_schema=False)


@pages.get("/", response_class=HTMLResponse)
def experiments_page(request: Request, user: UserDep, store: StoreDep) -> HTMLResponse:
    return _page(request, "experiments.html", title="Experiments",
                 experiments=_experiments(store, user, Links(request)))


@pages.get("/experiments/{experiment}", response_class=HTMLResponse)
def experiment_page(request: Request, experiment: ExperimentName, user: UserDep, store: StoreDep) -> HTMLResponse:
    found = _experiment(store, user, Links(request), experiment)
    live = any(run.status == "RUNNING" for run in found.runs)
    return _page(request, "experiment.html", title=found.name, experiment=found,
                 refresh=REFRESH_SECONDS if live else None)


@pages.get("/runs/{run_pk}", response_class=HTMLResponse)
def run_page(
    request: Request, run_pk: RunPk, user: UserDep, store: StoreDep, metric: Metric = None, mode: Mode = None,
    sort: Sort = "metric", order: Order = "asc", page: Page = 1, page_size: PageSize = DEFAULT_PAGE_SIZE,
) -> HTMLResponse:
    board = _board(store, user, run_pk, metric, mode, sort, order, page, page_size)
    links = Links(request)
    chart = learning_curves_svg(store.metric_curves(board.leaders, board.metric), metric=board.metric,
                                best_trial_id=board.best_trial_id)

    def board_url(**changes: Any) -> str:
        query = {"metric": metric, "mode": mode, "sort": board.sort, "order": "desc" if board.descending else "asc",
                 "page_size": board.page_size if board.page_size != DEFAULT_PAGE_SIZE else None}
        query.update(changes)
        return links.run(run_pk, **query)

    run = board.run
    return _page(
        request, "run.html", title=f"{run.experiment_name} / {run.run_key}", board=board, chart=Markup(chart),
        board_url=board_url, top=len(board.leaders), dag_run_url=Links.dag_run(run),
        refresh=REFRESH_SECONDS if is_live(run, board.status_counts) else None,
        crumbs=[(run.experiment_name, links.experiment(run.experiment_name))],
    )


@pages.get("/runs/{run_pk}/curves", response_class=HTMLResponse)
def curves_page(request: Request, run_pk: RunPk, user: UserDep, store: StoreDep, metric: Metric = None,
                top: Top = DEFAULT_CURVES) -> HTMLResponse:
    run, metric_, mode, best, curves = _curves(store, user, run_pk, metric, top)
    links = Links(request)
    chart = learning_curves_svg(curves, metric=metric_, best_trial_id=best,
                                title=f"{run.experiment_name} / {run.run_key}: {metric_} ({mode})")
    return _page(
        request, "curves.html", title=f"Learning curves: {run.experiment_name} / {run.run_key}", run=run,
        metric=metric_, mode=mode, top=top, shown=len(curves), chart=Markup(chart), best=best,
        refresh=REFRESH_SECONDS if is_live(run) else None,
        crumbs=[(run.experiment_name, links.experiment(run.experiment_name)),
                (run.run_key, links.run(run.id))],
    )


@pages.get("/trials/{trial_id}", response_class=HTMLResponse)
def trial_page(request: Request, trial_id: TrialId, user: UserDep, store: StoreDep) -> HTMLResponse:
    trial, run = _trial(store, user, trial_id)
    links = Links(request)
    checkpoints = store.checkpoints_of([trial_id]).get(trial_id, [])
    metric, mode, curve, best_iteration = _trial_curve(store, trial, run)
    crumbs = []
    chart = None
    if run is not None and metric is not None:
        crumbs = [(run.experiment_name, links.experiment(run.experiment_name)), (run.run_key, links.run(run.id))]
        chart = Markup(learning_curves_svg({trial_id: curve}, metric=metric, best_trial_id=trial_id,
                                           title=f"{trial_id}: {metric}"))
    results = store.get_results(trial_id)
    metric_keys = sorted({k for r in results for k, v in r.items()
                          if isinstance(v, (int, float)) and not isinstance(v, bool)} - {"training_iteration"})
    return _page(
        request, "trial.html", title=f"Trial {trial_id}", trial=trial, run=run, metric=metric, mode=mode,
        chart=chart, checkpoints=checkpoints, best=best_checkpoint(checkpoints, best_iteration),
        best_iteration=best_iteration, best_value=dict(curve).get(best_iteration),
        results=results[-RESULTS_SHOWN:], num_results=len(results), metric_keys=metric_keys,
        results_url=f"{links.base}/api/trials/{quote(trial_id, safe='')}/results",
        task_instance_url=Links.task_instance(trial),
        refresh=REFRESH_SECONDS if not trial.status.is_terminal() else None, crumbs=crumbs,
    )


# The per-DAG-run and per-task-instance links of the Airflow UI (external_views) land here.

@pages.get("/dag-run", response_class=HTMLResponse, response_model=None)
def dag_run_page(
    request: Request, user: UserDep, store: StoreDep,
    dag_id: Annotated[str, Query(pattern=AIRFLOW_KEY_PATTERN)],
    run_id: Annotated[str, Query(pattern=AIRFLOW_RUN_ID_PATTERN)],
) -> Response:
    runs = _readable_runs(user, store.runs_of_dag_run(dag_id, run_id))
    links = Links(request)
    if len(runs) == 1:
        return RedirectResponse(links.run(runs[0].id), status_code=status.HTTP_303_SEE_OTHER)
    if not runs:
        raise NotFoundError(f"DAG run {run_id} of DAG {dag_id} started no experiment run you may read.")
    counts = store.trial_counts()
    return _page(request, "dag_run.html", title=f"{dag_id} / {run_id}",
                 runs=[RunOut.of(r, counts.get(r.id, 0), links.run(r.id)) for r in runs])


@pages.get("/task-instance", response_class=HTMLResponse, response_model=None)
def task_instance_page(
    request: Request, user: UserDep, store: StoreDep,
    dag_id: Annotated[str, Query(pattern=AIRFLOW_KEY_PATTERN)],
    run_id: Annotated[str, Query(pattern=AIRFLOW_RUN_ID_PATTERN)],
    task_id: Annotated[str, Query(pattern=AIRFLOW_KEY_PATTERN)],
    map_index: Annotated[str, Query(pattern=MAP_INDEX_PATTERN)] = "-1",
) -> Response:
    index = -1 if map_index == "{MAP_INDEX}" else int(map_index)
    trial_id = store.trial_of_task(dag_id, run_id, task_id, index)
    if trial_id is None:
        raise NotFoundError(
            f"Task {task_id} (map index {index}) of DAG run {run_id} of DAG {dag_id} ran no trial; "
            f"trials run in the experiment's mapped trial tasks."
        )
    return RedirectResponse(Links(request).trial(trial_id), status_code=status.HTTP_303_SEE_OTHER)


# -- the app ----------------------------------------------------------------------------------------

def _wants_json(request: Request) -> bool:
    root = str(request.scope.get("root_path", ""))
    path = str(request.scope.get("path", ""))
    relative = path[len(root):] if root and path.startswith(root) else path
    return relative.startswith("/api/") or relative.rstrip("/") == "/openapi.json"


def _error(request: Request, status_code: int, detail: Any, headers: dict[str, str] | None = None) -> Response:
    if _wants_json(request):
        return JSONResponse({"detail": detail}, status_code=status_code, headers=headers)
    login_url = None
    if status_code == status.HTTP_401_UNAUTHORIZED:
        try:
            login_url = get_auth_manager().get_url_login()
        except Exception:  # no auth manager configured: the page still explains the 401
            log.debug("No login URL for the 401 page", exc_info=True)
    message = detail if isinstance(detail, str) else "; ".join(
        f"{'.'.join(str(p) for p in d.get('loc', ()))}: {d.get('msg')}" for d in detail
    )
    return _page(request, "error.html", status_code=status_code, title=f"Error {status_code}",
                 code=status_code, message=message, login_url=login_url)


def create_app(store: str | Callable[[], DashboardStore] | None = None) -> FastAPI:
    """The dashboard app, to be mounted under :data:`URL_PREFIX` by Airflow's api-server.

    :param store: the trials DB URL, or a callable returning the :class:`DashboardStore`;
        default: resolved on the first request through ``TrialsDbHook`` (connection
        ``trials_default``, else ``AIRFLOW_TRIALS_DB_URL``, else the default SQLite file).
    """
    app = FastAPI(
        title="Airflow Trials dashboard",
        description="Experiments, leaderboards and learning curves from the trials store. Every endpoint "
                    "needs an Airflow JWT (Authorization: Bearer, or the UI's _token cookie) and read "
                    "access to the DAG that ran the experiment.",
        version="1",
        docs_url=None,  # Swagger UI and ReDoc load their assets from a CDN; the schema is /openapi.json
        redoc_url=None,
    )
    app.state.store_provider = store if callable(store) else StoreProvider(store)
    app.include_router(api)
    app.include_router(pages)
    app.mount("/static", StaticFiles(directory=str(resources.files("airflow_trials.plugins") / "static")),
              name="static")

    @app.middleware("http")
    async def security_headers(request: Request, call_next: Any) -> Response:
        response: Response = await call_next(request)
        for name, value in _SECURITY_HEADERS.items():
            response.headers.setdefault(name, value)
        return response

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, e: HTTPException) -> Response:
        return _error(request, e.status_code, e.detail, getattr(e, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, e: RequestValidationError) -> Response:
        return _error(request, status.HTTP_422_UNPROCESSABLE_CONTENT, _plain(e.errors()))

    @app.exception_handler(NotFoundError)
    async def not_found(request: Request, e: NotFoundError) -> Response:
        return _error(request, status.HTTP_404_NOT_FOUND, str(e))

    @app.exception_handler(StoreError)
    async def store_error(request: Request, e: StoreError) -> Response:
        log.warning("Trials dashboard could not read the trials store: %s", e)
        return _error(request, status.HTTP_503_SERVICE_UNAVAILABLE, str(e))

    return app


def _plain(errors: Any) -> list[dict[str, Any]]:
    """Validation errors without the raw input echoed back (it may be hostile)."""
    return [{"loc": list(d.get("loc", ())), "msg": str(d.get("msg", "")), "type": d.get("type")} for d in errors]
