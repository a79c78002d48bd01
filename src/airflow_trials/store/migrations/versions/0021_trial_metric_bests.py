"""at_trials.metric_bests: for a trial of an experiment of several metrics, its best of each
metric in both modes, ``{metric: {"min": [value, iteration], "max": [value, iteration]}}``, so
that a ranking by one of them reads one row per trial, as the kept best of a one-metric
experiment does (``store/trial_best.py``).

NULL for every trial already there: their bests are not kept (``best_metric`` NULL), and the
leaderboard reads their results, as before, until ``TrialStore.recompute_best``.

Revision ID: 0021
Revises: 0020
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0021"
down_revision: str | None = "0020"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    json = sa.JSON(none_as_null=True).with_variant(
        postgresql.JSONB(none_as_null=True), "postgresql"
    )
    # In place, not batch mode: rebuilding at_trials on SQLite is not needed to add a column.
    op.add_column("at_trials", sa.Column("metric_bests", json, nullable=True))
    # Bests kept for several metrics (best_mode NULL) without their values (a database
    # downgraded and upgraded again): not kept, so the leaderboard reads their results.
    op.execute("UPDATE at_trials SET best_metric = NULL WHERE best_mode IS NULL")


def downgrade() -> None:
    op.drop_column("at_trials", "metric_bests")
