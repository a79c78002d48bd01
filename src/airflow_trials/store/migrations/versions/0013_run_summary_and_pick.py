"""at_experiment_runs.summary and .picked_trial_id: a run's history line as computed when it ended,
and the trial select_best picked (``store/run_summaries.py``).

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0013"
down_revision: str | None = "0012"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    # NULL for the runs that ended before 0013: the history computes their lines as before.
    summary = sa.JSON(none_as_null=True).with_variant(
        postgresql.JSONB(none_as_null=True), "postgresql"
    )
    op.add_column("at_experiment_runs", sa.Column("summary", summary, nullable=True))
    # No foreign key: a pick names a trial of the run, checked when it is recorded.
    op.add_column("at_experiment_runs", sa.Column("picked_trial_id", sa.String(128), nullable=True))


def downgrade() -> None:
    # In place, not batch mode: rebuilding the table on SQLite is not needed to drop a column.
    op.drop_column("at_experiment_runs", "picked_trial_id")
    op.drop_column("at_experiment_runs", "summary")
