"""An experiment's trend: each run's best alone, oldest run first, for the history's chart.

Each run's best is its history line's (:mod:`~airflow_trials.store.run_history`): an ended run's
from its stored line, the others' as ``select_best`` picks it; no counts are read.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session, undefer

from airflow_trials.store.mapping import experiment_run_record
from airflow_trials.store.models import ExperimentRunRow
from airflow_trials.store.records import ExperimentRecord, ExperimentRunRecord
from airflow_trials.store.run_history import history_goal, run_bests, valid_summary

__all__ = ["TrendPoint", "experiment_trend"]


@dataclass(frozen=True)
class TrendPoint:
    """One run's best, for a trend over time.

    :param run: the run.
    :param best_value: its best value of the history's metric; None when no trial reported it.
    """

    run: ExperimentRunRecord
    best_value: float | None


def experiment_trend(
    session: Session, dialect_name: str, experiment: ExperimentRecord
) -> list[TrendPoint]:
    """Every run of the experiment, oldest first, with its best on the metric of
    :func:`~airflow_trials.store.run_history.history_goal` (None without one): an ended run's from
    its stored line, the others' as ``select_best`` picks it
    (:func:`~airflow_trials.store.run_best.run_best`); no counts."""
    metric, mode = history_goal(experiment)
    runs_query = (
        select(ExperimentRunRow)
        .options(undefer(ExperimentRunRow.summary))
        .where(ExperimentRunRow.experiment_id == experiment.id)
        .order_by(ExperimentRunRow.created_at, ExperimentRunRow.id)
    )
    runs = []
    stored: dict[int, float | None] = {}
    for row in session.scalars(runs_query):
        run = experiment_run_record(row, experiment.name)
        runs.append(run)
        summary = valid_summary(run, row.summary, metric, mode)
        if summary is not None:
            value = summary["best_value"]
            stored[run.id] = None if value is None else float(value)
    bests: dict[int, tuple[float, str]] = {}
    live = [run.id for run in runs if run.id not in stored]
    if metric is not None and mode is not None and live:
        bests = run_bests(session, dialect_name, live)
    return [
        TrendPoint(
            run,
            stored[run.id] if run.id in stored else bests[run.id][0] if run.id in bests else None,
        )
        for run in runs
    ]
