"""A run's hyperparameter importances, a page and its JSON."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import HTMLResponse
from markupsafe import Markup

from airflow_trials.core.importances import DEFAULT_EVALUATOR, EVALUATORS
from airflow_trials.plugins.charts.importances import importances_svg
from airflow_trials.plugins.data.queries import is_live
from airflow_trials.plugins.datamodels.importances import ImportancesOut
from airflow_trials.plugins.services.importances import Evaluator, run_importances
from airflow_trials.plugins.web.auth import UserDep
from airflow_trials.plugins.web.params import Metric, Mode, RunPk, StoreDep
from airflow_trials.plugins.web.render import Links, render_page

# The page of a live run re-loads itself, less often than the run page: importances move slowly,
# and each load evaluates them again.
REFRESH_SECONDS = 30

api = APIRouter(prefix="/api", tags=["Trials dashboard"])
pages = APIRouter(include_in_schema=False)


@api.get(
    "/runs/{run_pk}/importances",
    response_model=ImportancesOut,
    summary="Hyperparameter importances of a run for one metric (Optuna's PED-ANOVA or fANOVA)",
    responses={
        409: {"description": "Too few trials with a value of the metric, or nothing varies."},
        501: {"description": "fanova without scikit-learn installed on the api-server."},
    },
)
def importances_api(
    request: Request,
    run_pk: RunPk,
    user: UserDep,
    store: StoreDep,
    metric: Metric = None,
    mode: Mode = None,
    evaluator: Evaluator = DEFAULT_EVALUATOR,
) -> ImportancesOut:
    found = run_importances(store, user, run_pk, metric, mode, evaluator)
    if found.problem is not None:
        raise HTTPException(found.status_code, found.problem)
    return ImportancesOut.of(found, Links(request).run(found.run.id))


@pages.get("/runs/{run_pk}/importances", response_class=HTMLResponse)
def importances_page(
    request: Request,
    run_pk: RunPk,
    user: UserDep,
    store: StoreDep,
    metric: Metric = None,
    mode: Mode = None,
    evaluator: Evaluator = DEFAULT_EVALUATOR,
) -> HTMLResponse:
    """The bar chart; the reason in its place when there is none."""
    found = run_importances(store, user, run_pk, metric, mode, evaluator)
    run, links = found.run, Links(request)
    result = found.importances
    chart = None
    if result is not None:
        chart = Markup(
            importances_svg(
                [(p.name, p.importance) for p in result.params],
                title=f"Hyperparameter importances of {found.mode} {found.metric}: "
                f"{run.experiment_name} / {run.run_key} ({found.evaluator})",
            )
        )

    def url(**changes: Any) -> str:
        """This page with ``changes`` to its query (a value of None drops that parameter)."""
        default = found.evaluator == DEFAULT_EVALUATOR
        query = {"metric": metric, "mode": mode, "evaluator": None if default else found.evaluator}
        return importances_url(links, run.id, **{**query, **changes})

    return render_page(
        request,
        "importances.html",
        title=f"Hyperparameter importances: {run.experiment_name} / {run.run_key}",
        found=found,
        result=result,
        chart=chart,
        evaluators=EVALUATORS,
        url=url,
        api_url=f"{links.base}/api/runs/{run.id}/importances?"
        + urlencode({"metric": found.metric, "mode": found.mode, "evaluator": found.evaluator}),
        refresh=REFRESH_SECONDS if is_live(run) else None,
        crumbs=[
            (run.experiment_name, links.experiment(run.experiment_name)),
            (run.run_key, links.run(run.id)),
        ],
    )


def importances_url(links: Links, run_pk: int, **query: Any) -> str:
    """The importances page of a run (its query without the parameters given as None)."""
    kept = {k: v for k, v in query.items() if v is not None}
    return f"{links.base}/runs/{run_pk}/importances" + (f"?{urlencode(kept)}" if kept else "")
