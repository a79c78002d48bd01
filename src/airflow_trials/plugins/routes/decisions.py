"""A run's scheduler decisions (ASHA's rungs, PBT's lineage), a page and its JSON."""

from __future__ import annotations

import math

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse

from airflow_trials.plugins.charts.lineage_chart import change_text
from airflow_trials.plugins.data.queries import is_live
from airflow_trials.plugins.datamodels.decisions import (
    RunDecisionsOut,
    RunExploitOut,
    RungPointOut,
    RunRungOut,
)
from airflow_trials.plugins.datamodels.scheduler_steps import AT_END, config_changes
from airflow_trials.plugins.datamodels.trials import ConfigChangeOut
from airflow_trials.plugins.services.decisions import (
    EXPLOITS_LISTED,
    lineage_view,
    rung_metric,
    rung_summaries,
    rungs_view,
)
from airflow_trials.plugins.web import reads
from airflow_trials.plugins.web.auth import UserDep
from airflow_trials.plugins.web.params import RunPk, StoreDep
from airflow_trials.plugins.web.render import REFRESH_SECONDS, Links, render_page
from airflow_trials.store.run_decisions import RunRung

api = APIRouter(prefix="/api", tags=["Trials dashboard"])
pages = APIRouter(include_in_schema=False)


@pages.get("/runs/{run_pk}/decisions", response_class=HTMLResponse)
def decisions_page(request: Request, run_pk: RunPk, user: UserDep, store: StoreDep) -> HTMLResponse:
    run = reads.experiment_run(store, user, run_pk)
    links = Links(request)
    metric, metrics = rung_metric(store, run)
    records = store.run_rungs(run.id)
    exploits = store.run_exploits(run.id)
    return render_page(
        request,
        "decisions.html",
        title=f"Scheduler decisions: {run.experiment_name} / {run.run_key}",
        run=run,
        rungs=rungs_view(records, metric, links) if records else None,
        lineage=lineage_view(exploits, links) if exploits else None,
        metrics=metrics,
        exploits_listed=EXPLOITS_LISTED,
        change_text=change_text,
        json_url=f"{links.base}/api/runs/{run.id}/decisions",
        refresh=REFRESH_SECONDS if is_live(run) else None,
        crumbs=[
            (run.experiment_name, links.experiment(run.experiment_name)),
            (run.run_key, links.run(run.id)),
        ],
    )


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


@api.get(
    "/runs/{run_pk}/decisions",
    response_model=RunDecisionsOut,
    summary="A run's ASHA rungs (with cutoffs and stopped trials) and PBT exploits",
)
def decisions_api(
    request: Request, run_pk: RunPk, user: UserDep, store: StoreDep
) -> RunDecisionsOut:
    run = reads.experiment_run(store, user, run_pk)
    links = Links(request)
    records = store.run_rungs(run.id)
    by_rung: dict[tuple[int, float], list[RunRung]] = {}
    for r in records:
        by_rung.setdefault((r.bracket, r.milestone), []).append(r)
    return RunDecisionsOut(
        run_id=run.id,
        metric=rung_metric(store, run)[0],
        vector=any(r.values is not None for r in records),
        rungs=[
            RunRungOut(
                bracket=s.bracket,
                milestone=s.milestone,
                reached=s.reached,
                continued=s.continued,
                stopped=s.stopped,
                recorded_at_end=s.at_end,
                cutoff=s.cutoff,
                cutoff_min=s.cutoff_low,
                cutoff_max=s.cutoff_high,
                trials=[
                    RungPointOut(
                        trial_id=r.trial_id,
                        iteration=r.iteration,
                        value=_finite(r.value),
                        values=None if r.values is None else [_finite(v) for v in r.values],
                        decision=r.decision.value,
                        verdict=AT_END if r.at_end else r.decision.value,
                        reason=r.reason,
                    )
                    for r in by_rung[(s.bracket, s.milestone)]
                ],
            )
            for s in rung_summaries(records)
        ],
        exploits=[
            RunExploitOut(
                id=e.id,
                trial_id=e.trial_id,
                trial_url=links.trial(e.trial_id),
                donor_trial_id=e.donor_trial_id,
                donor_url=links.trial(e.donor_trial_id),
                iteration=e.iteration,
                donor_checkpoint=e.donor_checkpoint,
                changes=[
                    ConfigChangeOut(key=c.key, old=c.old, new=c.new, operation=c.operation)
                    for c in config_changes(e.old_config, e.new_config, e.operations)
                ],
                created_at=e.created_at,
            )
            for e in store.run_exploits(run.id)
        ],
    )
