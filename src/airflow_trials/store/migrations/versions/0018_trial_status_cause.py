"""at_trials.status_cause: why a trial's status last changed, as a value
(``core/status_cause.py``), written by the store's one status setter with every change.

The rows already there keep NULL: their last change was recorded before anyone said why.

Revision ID: 0018
Revises: 0017
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision: str | None = "0017"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    # In place, not batch mode: rebuilding at_trials on SQLite would cascade-delete its results.
    op.add_column("at_trials", sa.Column("status_cause", sa.String(24), nullable=True))


def downgrade() -> None:
    op.drop_column("at_trials", "status_cause")
