"""at_trials.warm_start: the earlier run and trial a warm-started trial came from.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0008"
down_revision: str | None = "0007"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    # Trials from before this revision were not warm-started: NULL.
    json = sa.JSON(none_as_null=True).with_variant(
        postgresql.JSONB(none_as_null=True), "postgresql"
    )
    op.add_column("at_trials", sa.Column("warm_start", json, nullable=True))


def downgrade() -> None:
    # In place, not batch mode: rebuilding at_trials on SQLite would cascade-delete its results.
    op.drop_column("at_trials", "warm_start")
