"""The indexes on ``at_trials`` that let an experiment's history read a year of nightly runs from
indexes alone (migration 0012), and the predicates their partial indexes share with the queries.

- ``ix_at_trials_run_best``: ``(experiment_run_id, best_metric, best_mode, best_value,
  trial_id)``: each run's best maintained value and the trial that reached it in one seek per run,
  and the trials whose best is not maintained in a few.
- ``ix_at_trials_run_status``: ``(experiment_run_id, status, num_failures)``, narrow: each run's
  trials per status and failed tries, counted from the index alone.
- ``ix_at_trials_run_stopped_early``: ``(experiment_run_id, status, stop_kind)`` of the trials
  their scheduler stopped early (stop kind ``scheduler``, migration 0017), a partial index; its
  predicate's columns are in it so that SQLite counts from the index alone.
- ``ix_at_trials_run_warm_started``: ``(experiment_run_id, trial_id, warm_start)`` of
  warm-started trials, a partial index (a few small rows per run).

A query uses a partial index only when its WHERE holds the index's predicate as written, so the
queries in :mod:`~airflow_trials.store.run_history` use the very SQL text of these constants.
"""

from __future__ import annotations

from sqlalchemy import Index, text

from airflow_trials.core.stop_kind import StopKind

#: The predicate of a TERMINATED trial stopped early: the partial index's (the same on every
#: dialect).
STOPPED_EARLY_SQL = f"status = 'TERMINATED' AND stop_kind = '{StopKind.SCHEDULER.value}'"
WARM_STARTED_SQL = "warm_start IS NOT NULL"

RUN_BEST_INDEX = "ix_at_trials_run_best"
RUN_STATUS_INDEX = "ix_at_trials_run_status"
RUN_STOPPED_EARLY_INDEX = "ix_at_trials_run_stopped_early"
RUN_WARM_STARTED_INDEX = "ix_at_trials_run_warm_started"
RUN_BEST_COLUMNS = (
    "experiment_run_id",
    "best_metric",
    "best_mode",
    "best_value",
    "trial_id",
)
RUN_STATUS_COLUMNS = ("experiment_run_id", "status", "num_failures")


def history_indexes() -> tuple[Index, Index, Index, Index]:
    """The four indexes, for ``TrialRow.__table_args__``."""
    return (
        Index(RUN_BEST_INDEX, *RUN_BEST_COLUMNS),
        Index(RUN_STATUS_INDEX, *RUN_STATUS_COLUMNS),
        Index(
            RUN_STOPPED_EARLY_INDEX,
            # The predicate's columns too: SQLite checks it again, and reads them from the index.
            "experiment_run_id",
            "status",
            "stop_kind",
            sqlite_where=text(STOPPED_EARLY_SQL),
            postgresql_where=text(STOPPED_EARLY_SQL),
        ),
        Index(
            RUN_WARM_STARTED_INDEX,
            "experiment_run_id",
            "trial_id",
            "warm_start",
            sqlite_where=text(WARM_STARTED_SQL),
            postgresql_where=text(WARM_STARTED_SQL),
        ),
    )
