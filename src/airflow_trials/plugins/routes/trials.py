"""A trial: its page, its logs as downloads, its JSON and results, and the Airflow UI's
per-task-instance link."""

from __future__ import annotations

from typing import Literal
from urllib.parse import quote

from fastapi import APIRouter, Request, status
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from airflow_trials.plugins.data.logs import log_download, open_log, trial_logs
from airflow_trials.plugins.data.queries import NotFoundError, early_stopped
from airflow_trials.plugins.datamodels.trials import ExploitOut, ResultsOut, RungOut, TrialOut
from airflow_trials.plugins.services.trials import trial_page_view
from airflow_trials.plugins.web import reads
from airflow_trials.plugins.web.auth import UserDep
from airflow_trials.plugins.web.params import DagId, DagRunId, MapIndex, StoreDep, TaskId, TrialId
from airflow_trials.plugins.web.render import REFRESH_SECONDS, Links, render_page

# A trial page lists its newest results; the chart and the JSON API have all of them.
RESULTS_SHOWN = 200

api = APIRouter(prefix="/api", tags=["Trials dashboard"])
pages = APIRouter(include_in_schema=False)


@pages.get("/trials/{trial_id}", response_class=HTMLResponse)
def trial_page(request: Request, trial_id: TrialId, user: UserDep, store: StoreDep) -> HTMLResponse:
    links = Links(request)
    view = trial_page_view(store, user, links, trial_id)
    shown = {**vars(view), "results": view.results[-RESULTS_SHOWN:]}
    return render_page(
        request,
        "trial.html",
        title=f"Trial {trial_id}",
        **shown,
        num_results=len(view.results),
        results_url=f"{links.base}/api/trials/{quote(trial_id, safe='')}/results",
        logs_url=f"{links.trial(trial_id)}/logs",
        task_instance_url=Links.task_instance(view.trial),
        refresh=REFRESH_SECONDS if not view.trial.status.is_terminal() else None,
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


@api.get(
    "/trials/{trial_id}",
    response_model=TrialOut,
    summary="A trial: status, failures, checkpoints, ASHA rungs and PBT lineage",
)
def trial_api(request: Request, trial_id: TrialId, user: UserDep, store: StoreDep) -> TrialOut:
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
def results_api(trial_id: TrialId, user: UserDep, store: StoreDep) -> ResultsOut:
    reads.trial(store, user, trial_id)
    return ResultsOut(trial_id=trial_id, results=store.get_results(trial_id))
