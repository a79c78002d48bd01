"""The dashboard's JSON API: experiments, leaderboard pages, learning curves and trials."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from airflow_trials.plugins import params, reads
from airflow_trials.plugins.auth import UserDep
from airflow_trials.plugins.coordinates import CoordinatesOut, coordinates
from airflow_trials.plugins.history import HistoryOut, Last, history
from airflow_trials.plugins.pareto_svg import ParetoOut, pareto_view
from airflow_trials.plugins.queries import (
    DEFAULT_CURVES,
    DEFAULT_PAGE_SIZE,
    BoardPage,
    early_stopped,
)
from airflow_trials.plugins.render import Links
from airflow_trials.plugins.schemas import (
    CurvesOut,
    ExperimentOut,
    ExploitOut,
    LeaderboardOut,
    LeaderboardRowOut,
    ResultsOut,
    RungOut,
    RunOut,
    TrialOut,
)
from airflow_trials.store import ParetoRow

api = APIRouter(prefix="/api", tags=["Trials dashboard"])


@api.get("/experiments", response_model=list[ExperimentOut], summary="Experiments and their runs")
def list_experiments_api(
    request: Request, user: UserDep, store: params.StoreDep
) -> list[ExperimentOut]:
    return reads.experiments(store, user, Links(request))


@api.get(
    "/experiments/{experiment}", response_model=ExperimentOut, summary="One experiment and its runs"
)
def experiment_api(
    request: Request, experiment: params.ExperimentName, user: UserDep, store: params.StoreDep
) -> ExperimentOut:
    return reads.experiment(store, user, Links(request), experiment)


@api.get(
    "/experiments/{experiment}/history",
    response_model=HistoryOut,
    summary="An experiment's runs, each with its best, counts, stop kinds and best config",
)
def experiment_history_api(
    request: Request,
    experiment: params.ExperimentName,
    user: UserDep,
    store: params.StoreDep,
    last: Last = None,
) -> HistoryOut:
    return history(store, user, Links(request), experiment, last)[1]


@api.get(
    "/runs/{run_pk}/leaderboard",
    response_model=LeaderboardOut,
    summary="One page of a run's leaderboard",
)
def leaderboard_api(
    request: Request,
    run_pk: params.RunPk,
    user: UserDep,
    store: params.StoreDep,
    metric: params.Metric = None,
    mode: params.Mode = None,
    sort: params.Sort = "metric",
    order: params.Order = "asc",
    page: params.Page = 1,
    page_size: params.PageSize = DEFAULT_PAGE_SIZE,
    stopped: params.Stopped = "all",
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
    "/runs/{run_pk}/curves",
    response_model=CurvesOut,
    summary="Learning curves of a run's best trials",
)
def curves_api(
    run_pk: params.RunPk,
    user: UserDep,
    store: params.StoreDep,
    metric: params.Metric = None,
    mode: params.Mode = None,
    top: params.Top = DEFAULT_CURVES,
) -> CurvesOut:
    run, metric_, mode, best, curves = reads.curves(store, user, run_pk, metric, top, mode)
    return CurvesOut(run_id=run.id, metric=metric_, mode=mode, best_trial_id=best, curves=curves)


@api.get(
    "/runs/{run_pk}/coordinates",
    response_model=CoordinatesOut,
    summary="Every trial of a run on parallel coordinates: the axes and each trial's values",
)
def coordinates_api(
    request: Request,
    run_pk: params.RunPk,
    user: UserDep,
    store: params.StoreDep,
    metric: params.Metric = None,
    mode: params.Mode = None,
) -> CoordinatesOut:
    return CoordinatesOut.of(coordinates(store, user, run_pk, metric, mode), Links(request).trial)


@api.get(
    "/runs/{run_pk}/pareto",
    response_model=ParetoOut,
    summary="A run's trials on two of its metrics, and its Pareto front",
)
def pareto_api(
    request: Request,
    run_pk: params.RunPk,
    user: UserDep,
    store: params.StoreDep,
    x: params.Metric = None,
    y: params.Metric = None,
) -> ParetoOut:
    return ParetoOut.of(pareto_view(store, user, run_pk, x, y), Links(request).trial)


@api.get(
    "/trials/{trial_id}",
    response_model=TrialOut,
    summary="A trial: status, failures, checkpoints, ASHA rungs and PBT lineage",
)
def trial_api(
    request: Request, trial_id: params.TrialId, user: UserDep, store: params.StoreDep
) -> TrialOut:
    trial, run = reads.trial(store, user, trial_id)
    *_, best_iteration = reads.trial_curve(store, trial, run)
    checkpoints, best = reads.trial_checkpoints(store, trial, run)
    rungs, lineage = reads.trial_decisions(store, trial)
    links = Links(request)
    return TrialOut(
        trial=reads.trial_shown(store, user, trial),
        early_stopped=early_stopped(trial.stop_kind),
        checkpoints=checkpoints,
        best_checkpoint=best,
        best_iteration=best_iteration,
        task_instance_url=Links.task_instance(trial),
        rungs=[RungOut.of(r) for r in rungs],
        lineage=[ExploitOut.of(step, links.trial(step.exploit.donor_trial_id)) for step in lineage],
    )


@api.get(
    "/trials/{trial_id}/results", response_model=ResultsOut, summary="Every result a trial reported"
)
def results_api(trial_id: params.TrialId, user: UserDep, store: params.StoreDep) -> ResultsOut:
    reads.trial(store, user, trial_id)
    return ResultsOut(trial_id=trial_id, results=store.get_results(trial_id))
