"""A run's parallel coordinates and slice plot, a page and its JSON."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse
from markupsafe import Markup

from airflow_trials.plugins.charts.coordinates import parallel_coordinates_svg, slice_svg
from airflow_trials.plugins.data.queries import is_live
from airflow_trials.plugins.datamodels.coordinates import CoordinatesOut
from airflow_trials.plugins.services.coordinates import Param, coordinates
from airflow_trials.plugins.web.auth import UserDep
from airflow_trials.plugins.web.params import Metric, Mode, RunPk, StoreDep
from airflow_trials.plugins.web.render import REFRESH_SECONDS, Links, render_page

api = APIRouter(prefix="/api", tags=["Trials dashboard"])
pages = APIRouter(include_in_schema=False)


@pages.get("/runs/{run_pk}/coordinates", response_class=HTMLResponse)
def coordinates_page(
    request: Request,
    run_pk: RunPk,
    user: UserDep,
    store: StoreDep,
    metric: Metric = None,
    mode: Mode = None,
    param: Param = None,
) -> HTMLResponse:
    """Parallel coordinates of every trial of the run, and the metric against one config key."""
    found = coordinates(store, user, run_pk, metric, mode)
    run, links = found.run, Links(request)
    key = param or (found.axes[0].key if found.axes else None)
    return render_page(
        request,
        "coordinates.html",
        title=f"Parallel coordinates: {run.experiment_name} / {run.run_key}",
        found=found,
        chart=Markup(parallel_coordinates_svg(found)),
        param=key,
        slice=Markup(slice_svg(found, key)) if key is not None else None,
        refresh=REFRESH_SECONDS if is_live(run) else None,
        crumbs=[
            (run.experiment_name, links.experiment(run.experiment_name)),
            (run.run_key, links.run(run.id)),
        ],
    )


@api.get(
    "/runs/{run_pk}/coordinates",
    response_model=CoordinatesOut,
    summary="Every trial of a run on parallel coordinates: the axes and each trial's values",
)
def coordinates_api(
    request: Request,
    run_pk: RunPk,
    user: UserDep,
    store: StoreDep,
    metric: Metric = None,
    mode: Mode = None,
) -> CoordinatesOut:
    return CoordinatesOut.of(coordinates(store, user, run_pk, metric, mode), Links(request).trial)
