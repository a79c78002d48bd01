"""An experiment run: its page (leaderboard, learning curves, Pareto scatter), its leaderboard and
Pareto front as JSON, and the Airflow UI's per-DAG-run link."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, status
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from airflow_trials.plugins.data.queries import DEFAULT_PAGE_SIZE, BoardPage, NotFoundError, is_live
from airflow_trials.plugins.datamodels.experiments import RunOut
from airflow_trials.plugins.datamodels.runs import LeaderboardOut, LeaderboardRowOut, ParetoOut
from airflow_trials.plugins.services.pareto_front import pareto_view
from airflow_trials.plugins.services.runs import BoardQuery, run_page_view
from airflow_trials.plugins.web import reads
from airflow_trials.plugins.web.auth import UserDep
from airflow_trials.plugins.web.params import (
    DagId,
    DagRunId,
    Metric,
    Mode,
    Order,
    Page,
    PageSize,
    RunPk,
    Sort,
    Stopped,
    StoreDep,
)
from airflow_trials.plugins.web.render import REFRESH_SECONDS, Links, render_page
from airflow_trials.store import ParetoRow

api = APIRouter(prefix="/api", tags=["Trials dashboard"])
pages = APIRouter(include_in_schema=False)


@pages.get("/runs/{run_pk}", response_class=HTMLResponse)
def run_page(
    request: Request,
    run_pk: RunPk,
    user: UserDep,
    store: StoreDep,
    metric: Metric = None,
    mode: Mode = None,
    sort: Sort = "metric",
    order: Order = "asc",
    page: Page = 1,
    page_size: PageSize = DEFAULT_PAGE_SIZE,
    stopped: Stopped = "all",
    x: Metric = None,
    y: Metric = None,
) -> HTMLResponse:
    links = Links(request)
    query = BoardQuery(metric, mode, sort, order, page, page_size, stopped, x, y)
    view = run_page_view(store, user, links, run_pk, query)
    board, run = view.board, view.board.run
    return render_page(
        request,
        "run.html",
        title=f"{run.experiment_name} / {run.run_key}",
        board=board,
        chart=view.chart,
        board_url=view.board_url,
        asked_mode=mode,  # the links to curves and importances keep the ?mode= asked for
        numeric_config_keys=view.numeric_config_keys,
        top=len(board.leaders),
        pareto=view.pareto,
        dag_run_url=Links.dag_run(run),
        decisions=view.decisions,  # templates/run_decisions.html
        extensions=view.extensions,  # templates/run_extensions.html
        approvals=view.approvals,  # templates/run_approvals.html
        refresh=REFRESH_SECONDS if is_live(run, board.status_counts) else None,
        crumbs=[(run.experiment_name, links.experiment(run.experiment_name))],
    )


# The per-DAG-run and per-task-instance links of the Airflow UI (external_views) land here.


@pages.get("/dag-run", response_class=HTMLResponse, response_model=None)
def dag_run_page(
    request: Request, user: UserDep, store: StoreDep, dag_id: DagId, run_id: DagRunId
) -> Response:
    runs = reads.readable_runs(user, store.runs_of_dag_run(dag_id, run_id))
    links = Links(request)
    if len(runs) == 1:
        return RedirectResponse(links.run(runs[0].id), status_code=status.HTTP_303_SEE_OTHER)
    if not runs:
        raise NotFoundError(
            f"DAG run {run_id} of DAG {dag_id} started no experiment run you may read."
        )
    counts = store.trial_counts()
    return render_page(
        request,
        "dag_run.html",
        title=f"{dag_id} / {run_id}",
        runs=[RunOut.of(r, counts.get(r.id, 0), links.run(r.id)) for r in runs],
    )


@api.get(
    "/runs/{run_pk}/leaderboard",
    response_model=LeaderboardOut,
    summary="One page of a run's leaderboard",
)
def leaderboard_api(
    request: Request,
    run_pk: RunPk,
    user: UserDep,
    store: StoreDep,
    metric: Metric = None,
    mode: Mode = None,
    sort: Sort = "metric",
    order: Order = "asc",
    page: Page = 1,
    page_size: PageSize = DEFAULT_PAGE_SIZE,
    stopped: Stopped = "all",
) -> LeaderboardOut:
    board = reads.board(store, user, run_pk, metric, mode, sort, order, page, page_size, stopped)
    return _board_out(board, Links(request))


def _board_out(board: BoardPage, links: Links) -> LeaderboardOut:
    return LeaderboardOut(
        run=RunOut.of(board.run, board.num_trials, links.run(board.run.id)),
        metric=board.metric,
        mode=board.mode,
        metrics=board.metrics,
        modes=board.modes,
        front_trial_ids=board.front_trial_ids if board.metrics is not None else None,
        constraints=board.constraints,
        sort=board.sort,
        order="desc" if board.descending else "asc",
        stopped=board.stopped,
        page=board.page,
        page_size=board.page_size,
        pages=board.pages,
        total=board.total,
        best_trial_id=board.best_trial_id,
        status_counts=board.status_counts,
        config_keys=board.config_keys,
        rows=[
            LeaderboardRowOut(
                rank=r.rank,
                trial_id=r.trial.trial_id,
                status=r.trial.status.value,
                num_failures=r.trial.num_failures,
                config=r.config,
                best_value=r.trial.best_value,
                best_iteration=r.trial.best_iteration,
                best_checkpoint=r.checkpoint,
                stop_reason=r.stop_reason,
                stop_kind=r.stop_kind,
                early_stopped=r.early_stopped,
                url=links.trial(r.trial.trial_id),
                feasible=r.trial.feasible,
                violations=r.trial.violations,
                **_pareto_fields(r.pareto),
            )
            for r in board.rows
        ],
    )


def _pareto_fields(place: ParetoRow | None) -> dict[str, Any]:
    """A row's fields of the leaderboard of several metrics; none with one metric."""
    if place is None:
        return {}
    return {
        "values": place.values,
        "iteration": place.iteration,
        "pareto_rank": place.pareto_rank,
        "on_front": place.on_front,
    }


@api.get(
    "/runs/{run_pk}/pareto",
    response_model=ParetoOut,
    summary="A run's trials on two of its metrics, and its Pareto front",
)
def pareto_api(
    request: Request,
    run_pk: RunPk,
    user: UserDep,
    store: StoreDep,
    x: Metric = None,
    y: Metric = None,
) -> ParetoOut:
    return ParetoOut.of(pareto_view(store, user, run_pk, x, y), Links(request).trial)
