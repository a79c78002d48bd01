"""at_experiment_runs.end_reason: why a run was ended by hand (``airflow-trials db end-run``),
as the person who ended it said it.

NULL for every run that ended on its own (``select_best``), that runs, and for the rows already
there.

Revision ID: 0019
Revises: 0018
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0019"
down_revision: str | None = "0018"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    # In place, not batch mode: rebuilding at_experiment_runs on SQLite would fire its trials'
    # ON DELETE SET NULL.
    op.add_column("at_experiment_runs", sa.Column("end_reason", sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column("at_experiment_runs", "end_reason")
