"""The metadata store: experiments, runs, trials, results, checkpoints, rungs and exploits in SQLite
or PostgreSQL.

Imports SQLAlchemy and Alembic, never Ray or Airflow. Its database is its own, never Airflow's.
Create or upgrade the schema with :func:`migrate` or ``python -m airflow_trials.store upgrade``.
:class:`TrialStore` reads and writes; :class:`TrialReader` (``TrialStore.reader``) only reads.
"""

from __future__ import annotations

from airflow_trials.store.migration import migrate
from airflow_trials.store.pareto_board import ParetoBoard, ParetoRow
from airflow_trials.store.reader import TrialReader
from airflow_trials.store.records import (
    CheckpointRecordRow,
    ExperimentRecord,
    ExperimentRunRecord,
    ExperimentRunStatus,
    ExploitRecord,
    LeaderboardRow,
    RankedTrial,
    RungDecision,
    TrialRecord,
)
from airflow_trials.store.store import TrialStore
from airflow_trials.store.transitions import (
    ContinueWithRaisedStop,
    Recorded,
    RestartFromScratch,
    StopForTry,
)
from airflow_trials.trials_db_url import default_store_url

__all__ = [
    "CheckpointRecordRow",
    "ExperimentRecord",
    "ExperimentRunRecord",
    "ExperimentRunStatus",
    "ExploitRecord",
    "LeaderboardRow",
    "ParetoBoard",
    "ParetoRow",
    "RankedTrial",
    "Recorded",
    "ContinueWithRaisedStop",
    "RestartFromScratch",
    "RungDecision",
    "StopForTry",
    "TrialReader",
    "TrialRecord",
    "TrialStore",
    "default_store_url",
    "migrate",
]
