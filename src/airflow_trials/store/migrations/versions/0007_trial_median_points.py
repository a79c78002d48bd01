"""at_trial_median_points: the median stopping rule's running mean per trial and result, and its
verdict.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision: str | None = "0006"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.create_table("at_trial_median_points", *_point_columns(), *_point_constraints())
    _create_point_indexes()


def _point_columns() -> list[sa.Column]:
    """The table's columns: a trial's point at a time, its running mean and its verdict."""
    return [
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("experiment_run_id", sa.Integer(), nullable=False),
        sa.Column("trial_id", sa.String(128), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("time", sa.Float(), nullable=False),
        # The time of the trial's previous point (NULL for its first), and whether a decision at a
        # time strictly between the two could find no point of this trial at that time: the times
        # are not consecutive integers. See TrialStore.record_median_point.
        sa.Column("prev_time", sa.Float(), nullable=True),
        sa.Column("gap", sa.Boolean(), server_default=sa.false(), nullable=False),
        sa.Column("iteration", sa.Integer(), nullable=False),
        sa.Column("at_end", sa.Boolean(), server_default=sa.false(), nullable=False),
        # NULL: the running sum is not finite (a NaN or an infinity among the values), so its mean
        # is left out of every median from then on, as Ray leaves a non-finite mean out.
        sa.Column("total", sa.Float(), nullable=True),
        # total / seq (NULL when not finite), and whether a later point of the trial has the same
        # time (its last result added again when it ended): the points a median at a time counts.
        sa.Column("mean", sa.Float(), nullable=True),
        sa.Column("superseded", sa.Boolean(), server_default=sa.false(), nullable=False),
        sa.Column("decision", sa.String(16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    ]


def _point_constraints() -> list[sa.Constraint]:
    """Its key, one point per trial, iteration and end, and its run's and trial's rows."""
    return [
        sa.PrimaryKeyConstraint("id", name="pk_at_trial_median_points"),
        sa.UniqueConstraint(
            "trial_id",
            "iteration",
            "at_end",
            name="uq_at_trial_median_points_trial_id_iteration_at_end",
        ),
        sa.ForeignKeyConstraint(
            ["experiment_run_id"],
            ["at_experiment_runs.id"],
            name="fk_at_trial_median_points_experiment_run_id_at_experiment_runs",
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["trial_id"],
            ["at_trials.trial_id"],
            name="fk_at_trial_median_points_trial_id_at_trials",
            ondelete="CASCADE",
        ),
    ]


def _create_point_indexes() -> None:
    """The indexes the median rule's reads probe."""
    # A trial's running mean at a time, and its latest time: one probe of this index each.
    op.create_index(
        "ix_at_trial_median_points_trial_id_time_seq",
        "at_trial_median_points",
        ["trial_id", "time", "seq"],
    )
    # The means of a run's trials at one time, counted and read by rank from the index alone.
    op.create_index(
        "ix_at_trial_median_points_run_time_mean",
        "at_trial_median_points",
        ["experiment_run_id", "time", "superseded", "mean"],
    )
    # The points after a gap: the few trials that skipped a time.
    op.create_index(
        "ix_at_trial_median_points_run_gaps",
        "at_trial_median_points",
        ["experiment_run_id", "gap", "time", "prev_time"],
    )


def downgrade() -> None:
    op.drop_index("ix_at_trial_median_points_run_gaps", table_name="at_trial_median_points")
    op.drop_index("ix_at_trial_median_points_run_time_mean", table_name="at_trial_median_points")
    op.drop_index(
        "ix_at_trial_median_points_trial_id_time_seq", table_name="at_trial_median_points"
    )
    op.drop_table("at_trial_median_points")
