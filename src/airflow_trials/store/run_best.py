"""A run's best trial, as ``select_best`` picks it: the one answer the history, its trend, the
regression check and the dashboard's run page give.

The trials that count are those that ended TERMINATED
(:data:`~airflow_trials.core.constraints.COUNTED_STATUSES`, docs/store.md "Which trials count"),
feasible first with the experiment's constraints (:mod:`~airflow_trials.store.feasibility`):

- one metric: the first of them on the leaderboard's ranking with a value of the metric
  (:func:`~airflow_trials.store.ranked_page.best_query`): its best value, ties to the lowest
  trial id;
- several metrics: the best of the run's board (:mod:`~airflow_trials.store.board`), the trial
  ``select_best`` picks without a ``pick``: the best value of the first metric in its last result
  among the ranked trials (the feasible ones while there is one), ties to the lower Pareto rank,
  then the lower trial id (:meth:`~airflow_trials.core.pick.Pick.choose`).
"""

from __future__ import annotations

from sqlalchemy.orm import Session

from airflow_trials.store.board import read_board
from airflow_trials.store.feasibility import run_constraints
from airflow_trials.store.leaderboard import maintained_best_columns
from airflow_trials.store.mapping import experiment_record
from airflow_trials.store.models import ExperimentRow, ExperimentRunRow
from airflow_trials.store.ranked_page import Ranking, best_query

#: A run's best: (value, trial id), or None when no trial that counts has a value.
Best = tuple[float, str] | None


def run_best(session: Session, dialect_name: str, run: ExperimentRunRow) -> Best:
    """The run's best trial and its value of its experiment's (first) metric; None when the
    experiment has no metric and mode, or no trial that counts has a value."""
    experiment = experiment_record(session.get_one(ExperimentRow, run.experiment_id))
    if not experiment.metrics or experiment.modes[0] is None:
        return None
    if experiment.several_metrics:
        best = read_board(session, dialect_name, run, experiment.goal).best
        return None if best is None or best.value is None else (best.value, best.trial_id)
    # One metric: the board's best in one query (the first row of the same ranking that counts).
    constraints = run_constraints(session, run)
    metric, mode = experiment.metrics[0], experiment.modes[0]
    maintained = maintained_best_columns(session, run, metric, mode)
    ranking = Ranking(dialect_name, run.id, metric, mode, maintained, constraints)
    row = session.execute(best_query(ranking)).first()
    return None if row is None else (float(row.best_value), row.trial_id)
