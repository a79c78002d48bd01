"""at_run_extensions: the extensions of finished experiment runs (``airflow-trials extend``): which
run, the DAG run that extended it, when, and what changed (``store/extensions.py``).

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0014"
down_revision: str | None = "0013"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    def json_column(name: str, nullable: bool) -> sa.Column:
        kind = sa.JSON(none_as_null=True).with_variant(
            postgresql.JSONB(none_as_null=True), "postgresql"
        )
        return sa.Column(name, kind, nullable=nullable)

    op.create_table(
        "at_run_extensions",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column(
            "experiment_run_id",
            sa.Integer(),
            sa.ForeignKey("at_experiment_runs.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("dag_run_id", sa.String(250), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("num_samples_added", sa.Integer(), nullable=False),
        json_column("stop_before", True),
        json_column("stop_after", True),
        json_column("trials_continued", False),
        json_column("trials_added", False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.UniqueConstraint("experiment_run_id", "dag_run_id"),
    )


def downgrade() -> None:
    op.drop_table("at_run_extensions")
