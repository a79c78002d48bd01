"""A run's hyperparameter importances on the dashboard: Optuna's evaluators over the run's trials
that count (ended TERMINATED, docs/store.md "Which trials count", as Optuna takes its COMPLETE
trials only): their configs and their best values of the metric, as the leaderboard ranks them;
a page with a bar chart, and its JSON.

The importances are on a page of their own (``/runs/{run}/importances``, linked from the run
page), not on the run page: at 1,000 trials building Optuna's study and evaluating it takes from
0.7 to 1.5 s on a loaded 2-core machine (docs/dashboard.md, "Performance"), which the run page
(refreshed every 10 s while the run is live) should not pay.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any
from urllib.parse import urlencode

from fastapi import APIRouter, HTTPException, Query, Request, status
from fastapi.responses import HTMLResponse
from markupsafe import Markup
from pydantic import BaseModel, Field

from airflow_trials.core.constraints import counted_values
from airflow_trials.core.importances import (
    DEFAULT_EVALUATOR,
    EVALUATORS,
    EvaluatorUnavailableError,
    Importances,
    ImportancesError,
    prepare_importances,
)
from airflow_trials.plugins import reads
from airflow_trials.plugins.auth import UserDep
from airflow_trials.plugins.params import Metric, Mode, RunPk, StoreDep
from airflow_trials.plugins.queries import is_live
from airflow_trials.plugins.render import Links, render_page
from airflow_trials.plugins.schemas import RunOut
from airflow_trials.plugins.svg import importances_svg
from airflow_trials.searchers.optuna_importances import evaluate_importances
from airflow_trials.store import ExperimentRunRecord, TrialReader

# The page of a live run re-loads itself, less often than the run page: importances move slowly,
# and each load evaluates them again.
REFRESH_SECONDS = 30

Evaluator = Annotated[
    str,
    Query(
        pattern=f"^({'|'.join(EVALUATORS)})$",
        description="ped-anova (default; Optuna's default evaluator) or fanova (needs "
        "scikit-learn on the api-server).",
    ),
]


@dataclass(frozen=True)
class RunImportances:
    """A run's importances for one metric, or why there are none.

    :param run: the experiment run.
    :param metric: the metric they are of.
    :param mode: ``"min"`` or ``"max"``.
    :param metrics: the experiment's metrics (a choice with several), the metric first if not
        recorded.
    :param evaluator: ``"ped-anova"`` or ``"fanova"``.
    :param num_trials: the run's trials, usable or not.
    :param importances: the ranking; None when it cannot be computed.
    :param problem: why not (too few trials, scikit-learn missing); None when computed.
    :param status_code: the API's answer for ``problem``: 409 (the run's trials cannot tell yet)
        or 501 (fANOVA without scikit-learn on the api-server); 200 with importances.
    """

    run: ExperimentRunRecord
    metric: str
    mode: str
    metrics: list[str]
    evaluator: str
    num_trials: int
    importances: Importances | None
    problem: str | None
    status_code: int


def run_subject(run: ExperimentRunRecord) -> str:
    """How messages name a run: ``run manual__1 (id 3) of experiment mnist``."""
    return f"run {run.run_key} (id {run.id}) of experiment {run.experiment_name}"


def run_importances(
    store: TrialReader,
    user: Any,
    run_pk: int,
    metric: str | None,
    mode: str | None,
    evaluator: str = DEFAULT_EVALUATOR,
) -> RunImportances:
    """The importances of the run's hyperparameters for ``metric`` (default the experiment's;
    the first of several), from each trial's best value as the leaderboard ranks it, of the
    trials that count only (ended TERMINATED, as Optuna's COMPLETE trials)."""
    run = reads.experiment_run(store, user, run_pk)
    metric_, mode_ = reads.goal(store, run, metric, mode)
    metrics = list(reads.run_goal(store, run).metrics)
    if metric_ not in metrics:
        metrics = [metric_, *metrics]
    board = store.leaderboard(run.id, metric_, mode_)
    importances, problem, code = None, None, status.HTTP_200_OK
    try:
        data = prepare_importances(
            [row.config for row in board],
            # Only the trials that count (docs/store.md "Which trials count"), as Optuna.
            counted_values([row.status for row in board], [row.best_value for row in board]),
            metric=metric_,
            mode=mode_,
            subject=run_subject(run),
            search_space=run.search_space,
            trial_ids=[row.trial_id for row in board],
        )
        importances = evaluate_importances(data, evaluator)
    except EvaluatorUnavailableError as e:
        problem, code = str(e), status.HTTP_501_NOT_IMPLEMENTED
    except ImportancesError as e:
        problem, code = str(e), status.HTTP_409_CONFLICT
    return RunImportances(
        run=run,
        metric=metric_,
        mode=mode_,
        metrics=metrics,
        evaluator=evaluator,
        num_trials=len(board),
        importances=importances,
        problem=problem,
        status_code=code,
    )


# -- the JSON ----------------------------------------------------------------------------------


class ParamImportanceOut(BaseModel):
    """One hyperparameter's share of the importance, and the distribution it was evaluated on."""

    name: str = Field(description="The config key; nested keys joined with '/'.")
    importance: float = Field(description="Its share, 0 to 1; the shares sum to 1.")
    kind: str = Field(description="float, int or categorical.")
    low: float | None = Field(description="The smallest value (numbers); null for categories.")
    high: float | None = Field(description="The largest value (numbers); null for categories.")
    log: bool = Field(description="Evaluated on a log scale.")
    choices: list[Any] = Field(description="The categories; empty for numbers.")
    from_search_space: bool = Field(
        description="The run's recorded search space gave the distribution; false: inferred "
        "from the values the trials took."
    )


class ImportancesOut(BaseModel):
    """A run's hyperparameter importances for one metric, most important first."""

    run: RunOut
    metric: str
    mode: str
    metrics: list[str] = Field(description="The experiment's metrics; ?metric= picks one.")
    evaluator: str = Field(description="ped-anova or fanova.")
    trials: int = Field(description="Trials the importances were computed from.")
    skipped: int = Field(
        description="Trials left out: no value of the metric (failed, or not reported yet)."
    )
    constant: list[str] = Field(description="Config keys left out: one value in every trial.")
    notes: list[str] = Field(description="What the evaluator warned about.")
    importances: list[ParamImportanceOut]

    @classmethod
    def of(cls, found: RunImportances, run_url: str) -> ImportancesOut:
        result = found.importances
        if result is None:  # the route answers found.problem instead
            raise ValueError(f"No importances for {run_subject(found.run)}: {found.problem}")
        return cls(
            run=RunOut.of(found.run, found.num_trials, run_url),
            metric=found.metric,
            mode=found.mode,
            metrics=found.metrics,
            evaluator=found.evaluator,
            trials=result.num_trials,
            skipped=result.num_skipped,
            constant=result.constant,
            notes=result.notes,
            importances=[
                ParamImportanceOut(
                    name=p.name,
                    importance=p.importance,
                    kind=p.spec.kind,
                    low=p.spec.low,
                    high=p.spec.high,
                    log=p.spec.log,
                    choices=list(p.spec.choices),
                    from_search_space=p.spec.from_search_space,
                )
                for p in result.params
            ],
        )


# -- the routes --------------------------------------------------------------------------------

insights_api = APIRouter(prefix="/api", tags=["Trials dashboard"])
insights_pages = APIRouter(include_in_schema=False)


@insights_api.get(
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


@insights_pages.get("/runs/{run_pk}/importances", response_class=HTMLResponse)
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
