"""at_trial_rungs: ASHA's value and verdict per trial and rung, so triggers judge from shared state.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision: str | None = "0003"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.create_table(
        "at_trial_rungs",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("experiment_run_id", sa.Integer(), nullable=False),
        sa.Column("trial_id", sa.String(128), nullable=False),
        sa.Column("bracket", sa.Integer(), nullable=False),
        sa.Column("milestone", sa.Float(), nullable=False),
        sa.Column("iteration", sa.Integer(), nullable=True),
        # NULL: the value was NaN (recorded, but left out of the rung's cutoff).
        sa.Column("value", sa.Float(), nullable=True),
        sa.Column("decision", sa.String(16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("at_end", sa.Boolean(), server_default=sa.false(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_at_trial_rungs"),
        sa.UniqueConstraint("trial_id", "milestone", name="uq_at_trial_rungs_trial_id_milestone"),
        sa.ForeignKeyConstraint(
            ["experiment_run_id"],
            ["at_experiment_runs.id"],
            name="fk_at_trial_rungs_experiment_run_id_at_experiment_runs",
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["trial_id"],
            ["at_trials.trial_id"],
            name="fk_at_trial_rungs_trial_id_at_trials",
            ondelete="CASCADE",
        ),
    )
    # One rung's values, read by every decision at that rung, from the index alone.
    op.create_index(
        "ix_at_trial_rungs_rung_values",
        "at_trial_rungs",
        ["experiment_run_id", "bracket", "milestone", "value"],
    )


def downgrade() -> None:
    op.drop_index("ix_at_trial_rungs_rung_values", table_name="at_trial_rungs")
    op.drop_table("at_trial_rungs")
