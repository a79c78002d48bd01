"""at_run_approvals: the answer to each DAG run's ``approve_best`` (``tuning_experiment(
approval=True)``): who answered, when, why, who triggered the DAG run, and the outcome
(``store/approvals.py``).

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision: str | None = "0015"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.create_table(
        "at_run_approvals",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column(
            "experiment_run_id",
            sa.Integer(),
            sa.ForeignKey("at_experiment_runs.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("dag_run_id", sa.String(250), nullable=False),
        sa.Column("trial_id", sa.String(128), nullable=False),
        sa.Column("outcome", sa.String(16), nullable=False),
        sa.Column("responded_by_id", sa.String(250), nullable=False),
        sa.Column("responded_by_name", sa.String(250), nullable=False),
        sa.Column("responded_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("triggered_by", sa.String(250), nullable=True),
        sa.Column("recorded_at", sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint("experiment_run_id", "dag_run_id"),
    )


def downgrade() -> None:
    op.drop_table("at_run_approvals")
