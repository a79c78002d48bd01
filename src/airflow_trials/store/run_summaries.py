"""A run's stored history line: written in the transaction that ends the run, forgotten in every
transaction that writes one of its trials afterwards, so a stored line is never stale.

:func:`~airflow_trials.store.run_history.experiment_history` reads an ended run's line from
``at_experiment_runs.summary`` (migration 0013) instead of aggregating its trials again. The line
is computed by the history's own :func:`~airflow_trials.store.run_history.run_lines`, never a copy.

Why a line cannot go stale: a trial of a run changes only through a store method (registration,
status, fields, results, a restart, a PBT exploit, recomputed bests), and each calls
:func:`trials_written` in its transaction. That takes a FOR KEY SHARE lock on the run's row and
clears its line. Ending the run takes FOR UPDATE on the same row before it reads the trials, so
on PostgreSQL the two wait for each other: a trial write that committed first is in the line, one
that commits after clears it (key-share locks do not block each other, so trial writes of one run
still run side by side). SQLite runs one writer at a time (BEGIN IMMEDIATE). A line also records
the metric and mode its best is of: after the experiment changes them, the history recomputes it.
"""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import null, select
from sqlalchemy.orm import Session

from airflow_trials.store.mapping import experiment_record, experiment_run_record
from airflow_trials.store.models import ExperimentRow, ExperimentRunRow
from airflow_trials.store.run_history import history_goal, run_lines, summary_of_line

_RUNS = ExperimentRunRow.__table__


def store_summary(session: Session, dialect_name: str, run: ExperimentRunRow) -> None:
    """Compute the ended run's history line and store it in its row; the caller holds the row
    locked (``find_run(..., lock=True)``) so no trial write of the run interleaves."""
    experiment = experiment_record(session.get_one(ExperimentRow, run.experiment_id))
    metric, mode = history_goal(experiment)
    record = experiment_run_record(run, experiment.name)
    line = run_lines(session, dialect_name, [record], metric, mode)[run.id]
    run.summary = summary_of_line(line, metric, mode)


def trials_written(session: Session, run_pks: Iterable[int | None]) -> None:
    """Forget the stored lines of the runs whose trials this transaction writes (None: a trial
    outside any run), holding their rows key-share locked until commit (see the module)."""
    pks = sorted({pk for pk in run_pks if pk is not None})
    if not pks:
        return
    query = (
        select(_RUNS.c.id, _RUNS.c.summary.is_not(None))
        .where(_RUNS.c.id.in_(pks))
        .order_by(_RUNS.c.id)
        .with_for_update(read=True, key_share=True)
    )
    stored = [run_pk for run_pk, has_summary in session.execute(query) if has_summary]
    if stored:
        session.execute(_RUNS.update().where(_RUNS.c.id.in_(stored)).values(summary=null()))


__all__ = ["store_summary", "trials_written"]
