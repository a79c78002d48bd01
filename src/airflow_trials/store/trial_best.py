"""Each trial's maintained best of its experiment's metric, in both modes, folded in on write.

``at_trials`` keeps, per trial, the metric and mode the best is kept for (``best_metric``,
``best_mode``), the best value in that mode and the first iteration that reached it
(``best_value``, ``best_iteration``), and the best in the other mode with its iteration
(``other_mode_best_value``, ``other_mode_best_iteration``, migration 0015). The four values are
kept together and are valid together: the leaderboard ranks in either mode from one row per trial
(:func:`~airflow_trials.store.leaderboard.maintained_best_columns`). A trial of an experiment of
several metrics keeps, instead, the best of each of them in both modes in ``metric_bests``
(migration 0021), kept for the experiment's stored metrics (``best_metric``; ``best_mode`` NULL).
:func:`fold_best` is the one place that decides which of a trial's results is its best in a
mode; the SQL counterpart, for results written around
:meth:`~airflow_trials.store.ingest.IngestWriter.add_results`, is the leaderboard's probe
(:func:`~airflow_trials.store.leaderboard.leaderboard_query`).
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable, Mapping
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from airflow_trials.core.pareto import decode_metrics
from airflow_trials.store.models import ExperimentRow, ExperimentRunRow, ResultRow, TrialRow

#: A best: (value, first iteration that reached it), or None when no result had the metric.
Best = tuple[float, int] | None


def other_mode(mode: str) -> str:
    """``"max"`` for ``"min"`` and ``"min"`` for ``"max"``."""
    return "max" if mode == "min" else "min"


def fold_best(best: Best, rows: Iterable[Mapping[str, Any]], metric: str, mode: str) -> Best:
    """``best`` with ``rows`` (``{"iteration", "metrics"}``) folded in: the lowest value of
    ``metric`` for ``"min"``, the highest for ``"max"``, the earliest iteration on ties. A value
    that is not a number (a string, a bool, None: NaN and inf are stored as None) is skipped."""
    sign = 1.0 if mode == "min" else -1.0
    for row in rows:
        value = row["metrics"].get(metric)
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            continue
        if best is None or (sign * float(value), row["iteration"]) < (sign * best[0], best[1]):
            best = (float(value), row["iteration"])
    return best


def forget_best(trial: TrialRow, *, goal: tuple[str, str | None] | None) -> None:
    """Set the trial's maintained bests to "no result has the metric", kept for ``goal``
    (``(metric, mode)``); with None, to "not kept" (the leaderboard then reads its results)."""
    trial.best_metric, trial.best_mode = goal if goal is not None else (None, None)
    trial.best_value = trial.best_iteration = None
    trial.other_mode_best_value = trial.other_mode_best_iteration = None
    trial.metric_bests = None


def update_best(
    session: Session,
    trial: TrialRow,
    new_rows: list[dict[str, Any]],
    had_results: bool,
    goals: dict[int, Any] | None = None,
) -> None:
    """Fold the new results into the trial's bests of its experiment's metric, in both modes;
    ``goals`` caches each run's metric and mode within one transaction."""
    goal = None
    run_id = trial.experiment_run_id
    if run_id is not None and goals is not None and run_id in goals:
        goal = goals[run_id]
    elif run_id is not None:
        goal = session.execute(
            select(ExperimentRow.metric, ExperimentRow.mode)
            .join(ExperimentRunRow, ExperimentRunRow.experiment_id == ExperimentRow.id)
            .where(ExperimentRunRow.id == run_id)
        ).one_or_none()
        if goals is not None:
            goals[run_id] = goal
    if goal is None or goal.metric is None:
        return
    several, _ = decode_metrics(goal.metric, goal.mode)
    if goal.mode is None and not isinstance(several, list):
        return
    if (trial.best_metric, trial.best_mode) != (goal.metric, goal.mode):
        # Earlier results were ranked for another metric or mode (or not at all): unknown now.
        forget_best(trial, goal=None if had_results else (goal.metric, goal.mode))
        if had_results:
            return
    if isinstance(several, list):
        _fold_several(trial, new_rows, several)
        return
    for mode, value_column, iteration_column in (
        (goal.mode, "best_value", "best_iteration"),
        (other_mode(goal.mode), "other_mode_best_value", "other_mode_best_iteration"),
    ):
        value, iteration = getattr(trial, value_column), getattr(trial, iteration_column)
        best = fold_best(
            None if value is None else (value, iteration or 0), new_rows, goal.metric, mode
        )
        if best is not None:
            setattr(trial, value_column, best[0])
            setattr(trial, iteration_column, best[1])


def _fold_several(trial: TrialRow, new_rows: list[dict[str, Any]], metrics: list[str]) -> None:
    """Fold the new results into the trial's ``metric_bests``: each metric, both modes."""
    kept = trial.metric_bests or {}
    bests: dict[str, dict[str, list[float | int]]] = {}
    for metric in metrics:
        bests[metric] = {}
        for mode in ("min", "max"):
            old = kept.get(metric, {}).get(mode)
            best = fold_best(None if old is None else (old[0], old[1]), new_rows, metric, mode)
            if best is not None:
                bests[metric][mode] = [best[0], best[1]]
    # A new object, not the old one changed in place: the ORM writes a JSON column it sees set.
    trial.metric_bests = bests


def refold_results(session: Session, trial: TrialRow) -> None:
    """Set the locked trial's ``last_result`` and maintained bests to what
    :meth:`~airflow_trials.store.ingest.IngestWriter.add_results` leaves when only the results
    now stored were ingested (``record_exploit`` took some away)."""
    rows = [
        {"iteration": iteration, "metrics": metrics}
        for iteration, metrics in session.execute(
            select(ResultRow.iteration, ResultRow.metrics)
            .where(ResultRow.trial_id == trial.trial_id)
            .order_by(ResultRow.iteration)
        )
    ]
    trial.last_result = rows[-1]["metrics"] if rows else None
    forget_best(trial, goal=None)
    if rows:
        update_best(session, trial, rows, had_results=False)
