"""at_trials.stop_reason: why a trial ended TERMINATED, for the CLI and the dashboard.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-25
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision: str | None = "0004"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    # Trials that ended before this revision keep NULL: nobody recorded why they stopped.
    op.add_column("at_trials", sa.Column("stop_reason", sa.Text(), nullable=True))


def downgrade() -> None:
    # Not batch mode: rebuilding at_trials on SQLite drops the old table, and with foreign_keys
    # on that deletes every result, checkpoint and rung of every trial (ON DELETE CASCADE).
    # SQLite drops a column in place since 3.35.
    op.drop_column("at_trials", "stop_reason")
