"""The trial page's view: the trial and its run, its metric's curve, checkpoints, the
schedulers' decisions, where it was warm-started from, its results and its logs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from markupsafe import Markup

from airflow_trials.core.result import AUTO_FIELDS, TRAINING_ITERATION
from airflow_trials.plugins.charts.curves import learning_curves_svg
from airflow_trials.plugins.data.logs import TrialLog, trial_logs
from airflow_trials.plugins.datamodels.scheduler_steps import LineageStep
from airflow_trials.plugins.web import reads
from airflow_trials.plugins.web.render import Links, is_number
from airflow_trials.store import ExperimentRunRecord, RungDecision, TrialReader, TrialRecord
from airflow_trials.store.records import CheckpointRecordRow


@dataclass(frozen=True)
class TrialPage:
    """What the trial page shows (``templates/trial.html``); ``results`` are all of them."""

    trial: TrialRecord
    run: ExperimentRunRecord | None
    metric: str | None
    mode: str | None
    chart: Markup | None
    checkpoints: list[CheckpointRecordRow]
    best: CheckpointRecordRow | None
    rungs: list[RungDecision]
    lineage: list[LineageStep]
    warm_start: dict[str, Any] | None
    best_iteration: int | None
    best_value: float | None
    results: list[dict[str, Any]]
    metric_keys: list[str]
    logs: list[TrialLog]
    crumbs: list[tuple[str, str]]


def trial_page_view(store: TrialReader, user: Any, links: Links, trial_id: str) -> TrialPage:
    """The page of ``trial_id`` for ``user`` (a 404 for a trial the user may not read)."""
    trial, run = reads.trial(store, user, trial_id)
    metric, mode, curve, best_iteration = reads.trial_curve(store, trial, run)
    checkpoints, best = reads.trial_checkpoints(store, trial, run)
    crumbs = []
    chart = None
    if run is not None and metric is not None:
        crumbs = [
            (run.experiment_name, links.experiment(run.experiment_name)),
            (run.run_key, links.run(run.id)),
        ]
        title = f"{trial_id}: {metric}"
        chart = Markup(
            learning_curves_svg(
                {trial_id: curve}, metric=metric, best_trial_id=trial_id, title=title
            )
        )
    rungs, lineage = reads.trial_decisions(store, trial)
    results = store.get_results(trial_id)
    return TrialPage(
        trial=trial,
        run=run,
        metric=metric,
        mode=mode,
        chart=chart,
        checkpoints=checkpoints,
        best=best,
        rungs=rungs,
        lineage=lineage,
        warm_start=_warm_start(store, user, links, trial),
        best_iteration=best_iteration,
        best_value=None if best_iteration is None else dict(curve).get(best_iteration),
        results=results,
        metric_keys=metric_keys(results),
        logs=trial_logs(trial, run, checkpoints),
        crumbs=crumbs,
    )


def _warm_start(
    store: TrialReader, user: Any, links: Links, trial: TrialRecord
) -> dict[str, Any] | None:
    """Where the trial was warm-started from, with links to the earlier run and its trial."""
    warm = reads.trial_shown(store, user, trial).warm_start
    if warm and warm.get("trial_id"):
        return {
            **warm,
            "run_url": links.run(warm["experiment_run_id"]),
            "trial_url": links.trial(warm["trial_id"]),
        }
    return warm


def metric_keys(results: list[dict[str, Any]]) -> list[str]:
    """The results' numeric keys: the trainable's own metrics first, then the fields the engine
    adds (timestamp, durations...)."""
    return sorted(
        {k for r in results for k, v in r.items() if is_number(v)} - {TRAINING_ITERATION},
        key=lambda k: (k in AUTO_FIELDS, k),
    )
