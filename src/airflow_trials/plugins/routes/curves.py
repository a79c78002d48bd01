"""A run's learning curves: the best trials' metric per iteration, a page and its JSON."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse
from markupsafe import Markup

from airflow_trials.plugins.charts.curves import learning_curves_svg
from airflow_trials.plugins.data.queries import DEFAULT_CURVES, is_live
from airflow_trials.plugins.datamodels.curves import CurvesOut
from airflow_trials.plugins.web import reads
from airflow_trials.plugins.web.auth import UserDep
from airflow_trials.plugins.web.params import Metric, Mode, RunPk, StoreDep, Top
from airflow_trials.plugins.web.render import REFRESH_SECONDS, Links, render_page

api = APIRouter(prefix="/api", tags=["Trials dashboard"])
pages = APIRouter(include_in_schema=False)


@pages.get("/runs/{run_pk}/curves", response_class=HTMLResponse)
def curves_page(
    request: Request,
    run_pk: RunPk,
    user: UserDep,
    store: StoreDep,
    metric: Metric = None,
    mode: Mode = None,
    top: Top = DEFAULT_CURVES,
) -> HTMLResponse:
    run, metric_, mode_, best, curves = reads.curves(store, user, run_pk, metric, top, mode)
    links = Links(request)
    chart = learning_curves_svg(
        curves,
        metric=metric_,
        best_trial_id=best,
        title=f"{run.experiment_name} / {run.run_key}: {metric_} ({mode_})",
    )
    return render_page(
        request,
        "curves.html",
        title=f"Learning curves: {run.experiment_name} / {run.run_key}",
        run=run,
        metric=metric_,
        mode=mode_,
        asked_mode=mode,  # the page's links keep the ?mode= asked for
        top=top,
        shown=len(curves),
        chart=Markup(chart),
        best=best,
        refresh=REFRESH_SECONDS if is_live(run) else None,
        crumbs=[
            (run.experiment_name, links.experiment(run.experiment_name)),
            (run.run_key, links.run(run.id)),
        ],
    )


@api.get(
    "/runs/{run_pk}/curves",
    response_model=CurvesOut,
    summary="Learning curves of a run's best trials",
)
def curves_api(
    run_pk: RunPk,
    user: UserDep,
    store: StoreDep,
    metric: Metric = None,
    mode: Mode = None,
    top: Top = DEFAULT_CURVES,
) -> CurvesOut:
    run, metric_, mode, best, curves = reads.curves(store, user, run_pk, metric, top, mode)
    return CurvesOut(run_id=run.id, metric=metric_, mode=mode, best_trial_id=best, curves=curves)
