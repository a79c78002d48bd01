"""at_experiment_runs.data_version: the version of the data a run tuned on (``tuning_experiment(
data_version=...)``, e.g. the dataset version an Asset event carried).

NULL for a run that named none, and for the rows already there.

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0020"
down_revision: str | None = "0019"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    # In place, not batch mode: rebuilding at_experiment_runs on SQLite would fire its trials'
    # ON DELETE SET NULL.
    op.add_column(
        "at_experiment_runs", sa.Column("data_version", sa.String(length=250), nullable=True)
    )


def downgrade() -> None:
    op.drop_column("at_experiment_runs", "data_version")
