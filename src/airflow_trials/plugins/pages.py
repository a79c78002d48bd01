"""The dashboard's HTML pages: experiments, a run's leaderboard and curves, a trial, and Airflow's
links."""

from __future__ import annotations

from typing import Any, Literal
from urllib.parse import quote

from fastapi import APIRouter, Request, status
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from markupsafe import Markup

from airflow_trials.core.result import AUTO_FIELDS, TRAINING_ITERATION
from airflow_trials.plugins import reads
from airflow_trials.plugins.auth import UserDep
from airflow_trials.plugins.coordinates import Param, coordinates
from airflow_trials.plugins.coordinates_svg import parallel_coordinates_svg, slice_svg
from airflow_trials.plugins.history import STOP_KIND_LABELS, Last, config_rows, history_view
from airflow_trials.plugins.logs import log_download, open_log, trial_logs
from airflow_trials.plugins.params import (
    DagId,
    DagRunId,
    ExperimentName,
    MapIndex,
    Metric,
    Mode,
    Order,
    Page,
    PageSize,
    RunPk,
    Sort,
    Stopped,
    StoreDep,
    TaskId,
    Top,
    TrialId,
)
from airflow_trials.plugins.pareto_svg import pareto_of_board
from airflow_trials.plugins.queries import (
    DEFAULT_CURVES,
    DEFAULT_PAGE_SIZE,
    NotFoundError,
    is_live,
)
from airflow_trials.plugins.render import Links, is_number, render_page
from airflow_trials.plugins.schemas import RunOut
from airflow_trials.plugins.svg import learning_curves_svg

# Pages of a run that is still going re-load themselves (a <meta> refresh: no script needed).
REFRESH_SECONDS = 10
# A trial page lists its newest results; the chart and the JSON API have all of them.
RESULTS_SHOWN = 200

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
    # Its runs with their history across runs (templates/history.html, plugins/history.py).
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
    board = reads.board(store, user, run_pk, metric, mode, sort, order, page, page_size, stopped)
    links = Links(request)
    # With several metrics: the Pareto scatter (?x=&y= pick two; default the first two).
    pareto = pareto_of_board(store, board.run, board.metrics, board.modes, x, y)
    chart = learning_curves_svg(
        store.metric_curves(board.leaders, board.metric),
        metric=board.metric,
        best_trial_id=board.best_trial_id,
    )

    def board_url(**changes: Any) -> str:
        query = {
            "metric": metric,
            "mode": mode,
            "sort": board.sort,
            "order": "desc" if board.descending else "asc",
            "page_size": board.page_size if board.page_size != DEFAULT_PAGE_SIZE else None,
            "stopped": board.stopped if board.stopped != "all" else None,
        }
        query.update(changes)
        return links.run(run_pk, **query)

    run = board.run
    # A config column of numbers only is right-aligned, heading included.
    numeric_config_keys = {
        key
        for key in board.config_keys
        if all(is_number(row.config[key]) for row in board.rows if key in row.config)
    }
    return render_page(
        request,
        "run.html",
        title=f"{run.experiment_name} / {run.run_key}",
        board=board,
        chart=Markup(chart),
        board_url=board_url,
        asked_mode=mode,  # the links to curves and importances keep the ?mode= asked for
        numeric_config_keys=numeric_config_keys,
        top=len(board.leaders),
        pareto=pareto,
        dag_run_url=Links.dag_run(run),
        decisions=store.run_decision_counts(run.id),  # templates/run_decisions.html
        extensions=store.list_run_extensions(run.id),  # templates/run_extensions.html
        approvals=store.run_approvals(run.id),  # templates/run_approvals.html
        refresh=REFRESH_SECONDS if is_live(run, board.status_counts) else None,
        crumbs=[(run.experiment_name, links.experiment(run.experiment_name))],
    )


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


@pages.get("/trials/{trial_id}", response_class=HTMLResponse)
def trial_page(request: Request, trial_id: TrialId, user: UserDep, store: StoreDep) -> HTMLResponse:
    trial, run = reads.trial(store, user, trial_id)
    links = Links(request)
    metric, mode, curve, best_iteration = reads.trial_curve(store, trial, run)
    checkpoints, best = reads.trial_checkpoints(store, trial, run)
    crumbs = []
    chart = None
    if run is not None and metric is not None:
        crumbs = [
            (run.experiment_name, links.experiment(run.experiment_name)),
            (run.run_key, links.run(run.id)),
        ]
        chart = Markup(
            learning_curves_svg(
                {trial_id: curve},
                metric=metric,
                best_trial_id=trial_id,
                title=f"{trial_id}: {metric}",
            )
        )
    rungs, lineage = reads.trial_decisions(store, trial)
    warm = reads.trial_shown(store, user, trial).warm_start
    if warm and warm.get("trial_id"):  # where it came from: links to the earlier run and its trial
        warm = {
            **warm,
            "run_url": links.run(warm["experiment_run_id"]),
            "trial_url": links.trial(warm["trial_id"]),
        }
    results = store.get_results(trial_id)
    # The trainable's own metrics first, then the fields the engine adds (timestamp, durations...).
    metric_keys = sorted(
        {k for r in results for k, v in r.items() if is_number(v)} - {TRAINING_ITERATION},
        key=lambda k: (k in AUTO_FIELDS, k),
    )
    return render_page(
        request,
        "trial.html",
        title=f"Trial {trial_id}",
        trial=trial,
        run=run,
        metric=metric,
        mode=mode,
        chart=chart,
        checkpoints=checkpoints,
        best=best,
        rungs=rungs,
        lineage=lineage,
        warm_start=warm,
        best_iteration=best_iteration,
        best_value=None if best_iteration is None else dict(curve).get(best_iteration),
        results=results[-RESULTS_SHOWN:],
        num_results=len(results),
        metric_keys=metric_keys,
        results_url=f"{links.base}/api/trials/{quote(trial_id, safe='')}/results",
        logs=trial_logs(trial, run, checkpoints),
        logs_url=f"{links.trial(trial_id)}/logs",
        task_instance_url=Links.task_instance(trial),
        refresh=REFRESH_SECONDS if not trial.status.is_terminal() else None,
        crumbs=crumbs,
    )


@pages.get("/trials/{trial_id}/logs/{stream}", response_model=None)
def trial_log_file(
    trial_id: TrialId, stream: Literal["stdout", "stderr"], user: UserDep, store: StoreDep
) -> Response:
    """The trial's whole stdout.log or stderr.log, as a download, when this process can read it."""
    trial, run = reads.trial(store, user, trial_id)
    checkpoints = store.checkpoints_of([trial_id]).get(trial_id, [])
    logs = trial_logs(trial, run, checkpoints)
    opened = open_log(trial_id, logs, stream)
    if opened is None:
        where = next(log.location for log in logs if log.stream == stream)
        raise NotFoundError(
            f"The {stream} of trial {trial_id} cannot be read from the dashboard's machine; it is "
            "kept at "
            f"{where} (on the experiment's storage once the trial ended; on the trial's Ray node "
            "while it runs). Only regular files under the dashboard's storage root are served."
        )
    return log_download(opened, f"{trial_id}-{stream}.log")


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


@pages.get("/task-instance", response_class=HTMLResponse, response_model=None)
def task_instance_page(
    request: Request,
    user: UserDep,
    store: StoreDep,
    dag_id: DagId,
    run_id: DagRunId,
    task_id: TaskId,
    map_index: MapIndex = "-1",
) -> Response:
    index = -1 if map_index == "{MAP_INDEX}" else int(map_index)
    trial_id = reads.trial_of_task(store, user, dag_id, run_id, task_id, index)
    if trial_id is None:
        raise NotFoundError(
            f"Task {task_id} (map index {index}) of DAG run {run_id} of DAG {dag_id} ran no trial; "
            f"trials run in the experiment's mapped trial tasks."
        )
    return RedirectResponse(Links(request).trial(trial_id), status_code=status.HTTP_303_SEE_OTHER)
