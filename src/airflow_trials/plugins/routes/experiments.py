"""The experiments: the list and one experiment's history across runs, pages and JSON."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse
from markupsafe import Markup

from airflow_trials.plugins.datamodels.experiments import ExperimentOut, HistoryOut
from airflow_trials.plugins.services.history import (
    STOP_KIND_LABELS,
    Last,
    config_rows,
    history,
    history_view,
)
from airflow_trials.plugins.web import reads
from airflow_trials.plugins.web.auth import UserDep
from airflow_trials.plugins.web.params import ExperimentName, StoreDep
from airflow_trials.plugins.web.render import REFRESH_SECONDS, Links, render_page

api = APIRouter(prefix="/api", tags=["Trials dashboard"])
pages = APIRouter(include_in_schema=False)


@pages.get("/", response_class=HTMLResponse)
def experiments_page(request: Request, user: UserDep, store: StoreDep) -> HTMLResponse:
    return render_page(
        request,
        "experiments.html",
        title="Experiments",
        experiments=reads.experiments(store, user, Links(request)),
    )


@pages.get("/experiments/{experiment}", response_class=HTMLResponse)
def experiment_page(
    request: Request, experiment: ExperimentName, user: UserDep, store: StoreDep, last: Last = None
) -> HTMLResponse:
    # Its runs with their history across runs (templates/history.html, plugins/services/history.py).
    view = history_view(store, user, Links(request), experiment, last)
    found = view.experiment
    live = any(run.status == "RUNNING" for run in found.runs)
    return render_page(
        request,
        "experiment.html",
        title=found.name,
        experiment=found,
        history=view.history,
        chart=Markup(view.chart),
        config_rows=config_rows(view.history),
        num_runs=view.num_runs,
        stop_kind_labels=STOP_KIND_LABELS,
        last=last,
        refresh=REFRESH_SECONDS if live else None,
    )


@api.get("/experiments", response_model=list[ExperimentOut], summary="Experiments and their runs")
def list_experiments_api(request: Request, user: UserDep, store: StoreDep) -> list[ExperimentOut]:
    return reads.experiments(store, user, Links(request))


@api.get(
    "/experiments/{experiment}", response_model=ExperimentOut, summary="One experiment and its runs"
)
def experiment_api(
    request: Request, experiment: ExperimentName, user: UserDep, store: StoreDep
) -> ExperimentOut:
    return reads.experiment(store, user, Links(request), experiment)


@api.get(
    "/experiments/{experiment}/history",
    response_model=HistoryOut,
    summary="An experiment's runs, each with its best, counts, stop kinds and best config",
)
def experiment_history_api(
    request: Request,
    experiment: ExperimentName,
    user: UserDep,
    store: StoreDep,
    last: Last = None,
) -> HistoryOut:
    return history(store, user, Links(request), experiment, last)[1]
