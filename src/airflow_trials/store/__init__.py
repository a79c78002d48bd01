"""The metadata store: experiments, runs, trials, results, checkpoints, rungs and exploits in SQLite or PostgreSQL.

Imports SQLAlchemy and Alembic, never Ray or Airflow. Its database is its own, never Airflow's.
Create or upgrade the schema with :func:`migrate` or ``python -m airflow_trials.store upgrade``.
"""

from __future__ import annotations

from airflow_trials.store.engine import default_store_url
from airflow_trials.store.migration import migrate
from airflow_trials.store.records import (
    CheckpointRecordRow,
    ExperimentRecord,
    ExperimentRunRecord,
    ExperimentRunStatus,
    ExploitRecord,
    LeaderboardRow,
    RungDecision,
    TrialRecord,
)
from airflow_trials.store.store import TrialStore

__all__ = [
    "CheckpointRecordRow",
    "ExperimentRecord",
    "ExperimentRunRecord",
    "ExperimentRunStatus",
    "ExploitRecord",
    "LeaderboardRow",
    "RungDecision",
    "TrialRecord",
    "TrialStore",
    "default_store_url",
    "migrate",
]
