"""at_experiment_runs.seed becomes 64-bit: run seeds reach 2**32 - 1, past PostgreSQL's INTEGER.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision: str | None = "0002"
branch_labels: str | None = None
depends_on: str | None = None


def _on_sqlite() -> bool:
    # SQLite's INTEGER holds 64 bits already. Rebuilding the table in batch mode would also drop
    # the old one, and with foreign_keys on that sets every trial's experiment_run_id to NULL.
    return op.get_context().dialect.name == "sqlite"


def upgrade() -> None:
    if _on_sqlite():
        return
    op.alter_column(
        "at_experiment_runs",
        "seed",
        existing_type=sa.Integer(),
        type_=sa.BigInteger(),
        existing_nullable=True,
    )


def downgrade() -> None:
    if _on_sqlite():
        return
    # Fails, changing nothing, while a run has a seed outside INTEGER: nothing is cut silently.
    op.alter_column(
        "at_experiment_runs",
        "seed",
        existing_type=sa.BigInteger(),
        type_=sa.Integer(),
        existing_nullable=True,
    )
