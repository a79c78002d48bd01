"""Each trial's best value of its experiment's metric, maintained on write for the leaderboard.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-21
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision: str | None = "0001"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    # Existing trials keep NULL best_metric: the leaderboard scans their results, as before.
    op.add_column("at_trials", sa.Column("best_metric", sa.String(250), nullable=True))
    op.add_column("at_trials", sa.Column("best_mode", sa.String(8), nullable=True))
    op.add_column("at_trials", sa.Column("best_value", sa.Float(), nullable=True))
    op.add_column("at_trials", sa.Column("best_iteration", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("at_trials") as batch:
        for column in ("best_iteration", "best_value", "best_mode", "best_metric"):
            batch.drop_column(column)
