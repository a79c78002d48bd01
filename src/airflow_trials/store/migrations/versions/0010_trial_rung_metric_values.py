"""at_trial_rungs.metric_values: MOASHA's vector of metric values per trial and rung, as JSON.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-26
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision: str | None = "0009"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    # NULL on ASHA's rows, which keep their one value in ``value``.
    op.add_column("at_trial_rungs", sa.Column("metric_values", sa.Text(), nullable=True))


def downgrade() -> None:
    # In place, not batch mode: rebuilding the table on SQLite is not needed to drop a column.
    op.drop_column("at_trial_rungs", "metric_values")
