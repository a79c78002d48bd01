"""Initial schema: at_experiments, at_experiment_runs, at_trials, at_results, at_checkpoints.

Revision ID: 0001
Revises:
Create Date: 2026-11-21
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0001"
down_revision: str | None = None
branch_labels: str | None = None
depends_on: str | None = None


def _json(nullable: bool = False) -> sa.types.TypeEngine:
    return sa.JSON(none_as_null=nullable).with_variant(
        postgresql.JSONB(none_as_null=nullable), "postgresql"
    )


def _utc() -> sa.DateTime:
    return sa.DateTime(timezone=True)


def upgrade() -> None:
    _create_experiment_tables()
    _create_trials_table()
    _create_result_tables()


def _create_experiment_tables() -> None:
    """at_experiments and at_experiment_runs."""
    op.create_table(
        "at_experiments",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("metric", sa.String(250), nullable=True),
        sa.Column("mode", sa.String(8), nullable=True),
        sa.Column("created_at", _utc(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_at_experiments"),
        sa.UniqueConstraint("name", name="uq_at_experiments_name"),
    )
    op.create_table(
        "at_experiment_runs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("experiment_id", sa.Integer(), nullable=False),
        sa.Column("run_key", sa.String(250), nullable=False),
        sa.Column("dag_id", sa.String(250), nullable=True),
        sa.Column("run_id", sa.String(250), nullable=True),
        sa.Column("search_space", _json(nullable=True), nullable=True),
        sa.Column("seed", sa.Integer(), nullable=True),
        sa.Column("num_samples", sa.Integer(), nullable=True),
        sa.Column("status", sa.String(16), server_default=sa.text("'RUNNING'"), nullable=False),
        sa.Column("created_at", _utc(), nullable=False),
        sa.Column("ended_at", _utc(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_at_experiment_runs"),
        sa.UniqueConstraint(
            "experiment_id", "run_key", name="uq_at_experiment_runs_experiment_id_run_key"
        ),
        sa.ForeignKeyConstraint(
            ["experiment_id"],
            ["at_experiments.id"],
            name="fk_at_experiment_runs_experiment_id_at_experiments",
            ondelete="CASCADE",
        ),
    )


def _create_trials_table() -> None:
    op.create_table(
        "at_trials",
        sa.Column("trial_id", sa.String(128), nullable=False),
        sa.Column("experiment_run_id", sa.Integer(), nullable=True),
        sa.Column("trainable", sa.String(1024), nullable=False),
        sa.Column("config", _json(), nullable=False),
        sa.Column("resources", _json(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("num_failures", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("max_failures", sa.Integer(), nullable=False),
        sa.Column("error_msg", sa.Text(), nullable=True),
        sa.Column("last_result", _json(nullable=True), nullable=True),
        sa.Column("created_at", _utc(), nullable=False),
        sa.Column("started_at", _utc(), nullable=True),
        sa.Column("ended_at", _utc(), nullable=True),
        sa.Column("updated_at", _utc(), nullable=False),
        sa.Column("dag_id", sa.String(250), nullable=True),
        sa.Column("run_id", sa.String(250), nullable=True),
        sa.Column("task_id", sa.String(250), nullable=True),
        sa.Column("map_index", sa.Integer(), server_default=sa.text("-1"), nullable=False),
        sa.Column("try_number", sa.Integer(), nullable=True),
        sa.PrimaryKeyConstraint("trial_id", name="pk_at_trials"),
        sa.ForeignKeyConstraint(
            ["experiment_run_id"],
            ["at_experiment_runs.id"],
            name="fk_at_trials_experiment_run_id_at_experiment_runs",
            ondelete="SET NULL",
        ),
    )
    op.create_index("ix_at_trials_experiment_run_id", "at_trials", ["experiment_run_id"])


def _create_result_tables() -> None:
    """at_results and at_checkpoints, which reference at_trials."""
    op.create_table(
        "at_results",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("trial_id", sa.String(128), nullable=False),
        sa.Column("iteration", sa.Integer(), nullable=False),
        sa.Column("timestamp", sa.Float(), nullable=False),
        sa.Column("metrics", _json(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_at_results"),
        sa.UniqueConstraint("trial_id", "iteration", name="uq_at_results_trial_id_iteration"),
        sa.ForeignKeyConstraint(
            ["trial_id"],
            ["at_trials.trial_id"],
            name="fk_at_results_trial_id_at_trials",
            ondelete="CASCADE",
        ),
    )
    op.create_table(
        "at_checkpoints",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("trial_id", sa.String(128), nullable=False),
        sa.Column("path", sa.String(1024), nullable=False),
        sa.Column("iteration", sa.Integer(), nullable=False),
        sa.Column("score", sa.Float(), nullable=True),
        sa.Column("deleted", sa.Boolean(), server_default=sa.false(), nullable=False),
        sa.Column("created_at", _utc(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_at_checkpoints"),
        sa.UniqueConstraint("trial_id", "path", name="uq_at_checkpoints_trial_id_path"),
        sa.ForeignKeyConstraint(
            ["trial_id"],
            ["at_trials.trial_id"],
            name="fk_at_checkpoints_trial_id_at_trials",
            ondelete="CASCADE",
        ),
    )
    op.create_index(
        "ix_at_checkpoints_trial_id_iteration", "at_checkpoints", ["trial_id", "iteration", "id"]
    )


def downgrade() -> None:
    op.drop_index("ix_at_checkpoints_trial_id_iteration", table_name="at_checkpoints")
    op.drop_table("at_checkpoints")
    op.drop_table("at_results")
    op.drop_index("ix_at_trials_experiment_run_id", table_name="at_trials")
    op.drop_table("at_trials")
    op.drop_table("at_experiment_runs")
    op.drop_table("at_experiments")
