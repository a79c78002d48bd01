"""at_experiments.constraints: the experiment's constraints on reported metrics, as JSON.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-26
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision: str | None = "0010"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    # NULL for an experiment without constraints (every trial is feasible), as before 0011.
    op.add_column("at_experiments", sa.Column("constraints", sa.Text(), nullable=True))


def downgrade() -> None:
    # In place, not batch mode: rebuilding the table on SQLite is not needed to drop a column.
    op.drop_column("at_experiments", "constraints")
