"""The reads every dashboard page and API endpoint share, each with the user's access checked."""

from __future__ import annotations

import dataclasses
from typing import Any

from fastapi import HTTPException, status

from airflow_trials.core.goal import API_FLAGS, Goal, GoalError
from airflow_trials.exceptions import TrialNotFoundError
from airflow_trials.plugins.data.queries import (
    BoardPage,
    NotFoundError,
    best_checkpoint,
    best_point,
    get_experiment_run,
    leaderboard_page,
    pareto_page,
)
from airflow_trials.plugins.datamodels.experiments import ExperimentOut, RunOut
from airflow_trials.plugins.datamodels.scheduler_steps import LineageStep, lineage_steps
from airflow_trials.plugins.web.auth import RUN_ACCESS, TRIAL_ACCESS, may_read, require_read
from airflow_trials.plugins.web.params import checked_name
from airflow_trials.plugins.web.render import Links
from airflow_trials.store import (
    CheckpointRecordRow,
    ExperimentRunRecord,
    RungDecision,
    TrialReader,
    TrialRecord,
)

# A run's learning curves: the run, metric, mode, best trial id (None while no trial has a value)
# and (iteration, value) points per trial.
Curves = tuple[ExperimentRunRecord, str, str, str | None, dict[str, list[tuple[int, float]]]]
# A trial's metric, mode, curve of that metric, and the iteration of its best value.
TrialCurve = tuple[str | None, str | None, list[tuple[int, float]], int | None]


def readable_runs(user: Any, runs: list[ExperimentRunRecord]) -> list[ExperimentRunRecord]:
    """The runs on DAGs the user may read."""
    allowed: dict[str | None, bool] = {}
    for run in runs:
        if run.dag_id not in allowed:
            allowed[run.dag_id] = may_read(user, run.dag_id, RUN_ACCESS)
    return [run for run in runs if allowed[run.dag_id]]


def experiments(store: TrialReader, user: Any, links: Links) -> list[ExperimentOut]:
    """Every experiment with a run the user may read, with those runs."""
    runs = readable_runs(user, store.list_experiment_runs())
    counts = store.trial_counts()
    by_experiment: dict[str, list[RunOut]] = {}
    for run in runs:
        by_experiment.setdefault(run.experiment_name, []).append(
            RunOut.of(run, counts.get(run.id, 0), links.run(run.id))
        )
    found = []
    for e in store.list_experiments():
        if e.name not in by_experiment:
            continue
        goal = e.goal
        several = goal.several
        found.append(
            ExperimentOut(
                name=e.name,
                metric=None if several else e.metric,
                mode=None if several else e.mode,
                metrics=list(goal.metrics) if several else None,
                modes=[m or "min" for m in goal.modes] if several else None,
                constraints=e.constraint_spec,
                created_at=e.created_at,
                runs=by_experiment[e.name],
            )
        )
    return found


def experiment(store: TrialReader, user: Any, links: Links, name: str) -> ExperimentOut:
    checked_name("Experiment name", name)
    found = [e for e in experiments(store, user, links) if e.name == name]
    if not found:
        # Also when every run is on DAGs the user may not read: do not tell them it exists.
        raise NotFoundError(
            f"Experiment {name} has no runs you may read in the trials store; pick one from the "
            f"experiments list."
        )
    return found[0]


def experiment_run(store: TrialReader, user: Any, run_pk: int) -> ExperimentRunRecord:
    run = get_experiment_run(store, run_pk)
    require_read(
        user, run.dag_id, RUN_ACCESS, f"experiment run {run_pk} of experiment {run.experiment_name}"
    )
    return run


def run_goal(store: TrialReader, run: ExperimentRunRecord) -> Goal:
    """The run's experiment's :class:`~airflow_trials.core.goal.Goal` as recorded."""
    experiment = next((e for e in store.list_experiments() if e.name == run.experiment_name), None)
    return experiment.goal if experiment is not None else Goal((), ())


def several_goals(
    store: TrialReader, run: ExperimentRunRecord, metric: str | None, mode: str | None
) -> tuple[list[str], list[str]] | None:
    """The experiment's several metrics and modes when it records several and no ``?metric=``
    picks one; None otherwise (then :func:`goal`)."""
    recorded = run_goal(store, run)
    if metric or not recorded.several:
        return None
    if mode is not None:
        raise HTTPException(
            status.HTTP_422_UNPROCESSABLE_CONTENT,
            f"?mode={mode} goes with ?metric=: experiment {run.experiment_name} ranks run "
            f"{run.id} by several metrics ({', '.join(recorded.metrics)}) at once; add ?metric= "
            "with one of them to rank by it alone, or leave out ?mode=.",
        )
    return list(recorded.metrics), [m or "min" for m in recorded.modes]


def goal(
    store: TrialReader, run: ExperimentRunRecord, metric: str | None, mode: str | None
) -> tuple[str, str]:
    """The metric and mode to rank by: those asked for, else the experiment's (mode default min).
    Of an experiment with several metrics, the first unless ``metric`` names another; a metric
    of its own gets its own mode, any other needs ``?mode=`` (a 400 that says so,
    :meth:`~airflow_trials.core.goal.Goal.pick`)."""
    recorded = run_goal(store, run)
    try:
        chosen = (recorded if metric else recorded.first()).pick(metric, mode, API_FLAGS)
    except GoalError as e:
        raise HTTPException(status.HTTP_400_BAD_REQUEST, str(e)) from None
    if chosen.metric is None:
        raise HTTPException(
            status.HTTP_422_UNPROCESSABLE_CONTENT,
            f"Experiment {run.experiment_name} records no metric to rank run {run.id} by; add "
            "?metric=NAME.",
        )
    return chosen.metric, chosen.mode


def board(
    store: TrialReader,
    user: Any,
    run_pk: int,
    metric: str | None,
    mode: str | None,
    sort: str,
    order: str,
    page: int,
    page_size: int,
    stopped: str = "all",
) -> BoardPage:
    run = experiment_run(store, user, run_pk)
    several = several_goals(store, run, metric, mode)
    if several is not None:
        return pareto_page(
            store,
            run,
            *several,
            sort=sort,
            descending=order == "desc",
            page=page,
            page_size=page_size,
            stopped=stopped,
        )
    metric, mode = goal(store, run, metric, mode)
    return leaderboard_page(
        store,
        run,
        metric,
        mode,
        sort=sort,
        descending=order == "desc",
        page=page,
        page_size=page_size,
        stopped=stopped,
    )


def curves(
    store: TrialReader,
    user: Any,
    run_pk: int,
    metric: str | None,
    top: int,
    mode: str | None = None,
) -> Curves:
    """The learning curves of the run's ``top`` best trials."""
    run = experiment_run(store, user, run_pk)
    metric, mode = goal(store, run, metric, mode)
    ranking = store.leaderboard(run.id, metric, mode, limit=top)
    best = ranking[0].trial_id if ranking and ranking[0].best_value is not None else None
    return run, metric, mode, best, store.metric_curves([row.trial_id for row in ranking], metric)


def trial(
    store: TrialReader, user: Any, trial_id: str
) -> tuple[TrialRecord, ExperimentRunRecord | None]:
    """The trial and its experiment run (None when it ran outside one)."""
    checked_name("Trial id", trial_id)
    try:
        found = store.get_trial(trial_id)
    except TrialNotFoundError as e:
        raise NotFoundError(
            f"Trial {trial_id} is not in the trials store; pick one from a leaderboard."
        ) from e
    run_pk = found.experiment_run_id
    run = get_experiment_run(store, run_pk) if run_pk is not None else None
    dag_id = found.dag_id or (run.dag_id if run else None)
    require_read(user, dag_id, TRIAL_ACCESS, f"trial {trial_id}")
    return found, run


def trial_of_task(
    store: TrialReader, user: Any, dag_id: str, run_id: str, task_id: str, map_index: int
) -> str | None:
    """The trial a task instance ran, when the user may read its DAG (the store matched the
    trial's own ``dag_id``); None both when it ran none and when the user may not read the DAG,
    so that a link tells nothing of a DAG the user may not read."""
    trial_id = store.trial_of_task(dag_id, run_id, task_id, map_index)
    if trial_id is None or not may_read(user, dag_id, TRIAL_ACCESS):
        return None
    return trial_id


def trial_shown(store: TrialReader, user: Any, trial: TrialRecord) -> TrialRecord:
    """The trial as the user may see it: a warm start's source (run, trial, value, checkpoint)
    named only when the user may read the source's DAG; else every field of it null (the trial
    was warm-started, from a run not named), as when the source run was deleted."""
    origin = trial.warm_start
    if not origin:
        return trial
    source_pk = origin.get("experiment_run_id")
    source = store.find_experiment_run(source_pk) if isinstance(source_pk, int) else None
    if source is not None and may_read(user, source.dag_id, TRIAL_ACCESS):
        return trial
    return dataclasses.replace(trial, warm_start=dict.fromkeys(origin))


def trial_curve(
    store: TrialReader, trial: TrialRecord, run: ExperimentRunRecord | None
) -> TrialCurve:
    """The trial's metric, mode, curve of that metric, and the iteration of its best value."""
    if run is None:
        return None, None, [], None
    metric, mode = goal(store, run, None, None)
    curve = store.metric_curves([trial.trial_id], metric)[trial.trial_id]
    best = best_point(curve, mode)
    return metric, mode, curve, best[0] if best else None


def trial_checkpoints(
    store: TrialReader, trial: TrialRecord, run: ExperimentRunRecord | None
) -> tuple[list[CheckpointRecordRow], CheckpointRecordRow | None]:
    """Every recorded checkpoint of the trial, and the one its run's board hands on
    (:class:`~airflow_trials.store.board.BoardRow`'s ``best_checkpoint``, as ``select_best``
    does): with one metric the kept one whose result scored best, with several (or none) the
    newest kept one."""
    checkpoints = store.checkpoints_of([trial.trial_id]).get(trial.trial_id, [])
    recorded = run_goal(store, run) if run is not None else Goal((), ())
    if len(recorded.metrics) != 1 or recorded.several:
        kept = [c for c in checkpoints if not c.deleted]
        return checkpoints, kept[-1] if kept else None
    metric, mode = recorded.metrics[0], recorded.mode
    best_path = store.best_checkpoint_paths([trial.trial_id], metric, mode).get(trial.trial_id)
    return checkpoints, best_checkpoint(checkpoints, best_path)


def trial_decisions(
    store: TrialReader, trial: TrialRecord
) -> tuple[list[RungDecision], list[LineageStep]]:
    """What the schedulers decided for the trial: its ASHA rungs, lowest milestone first, and its
    PBT lineage, oldest exploit first (both empty for a trial no such scheduler judged)."""
    return store.trial_rungs(trial.trial_id), lineage_steps(store.lineage(trial.trial_id))
