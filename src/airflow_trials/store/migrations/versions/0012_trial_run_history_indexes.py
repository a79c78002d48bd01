"""Indexes on at_trials for an experiment's history across runs: per-run bests and counts, trials
stopped early, warm-started trials (``store/history_indexes.py``).

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-26
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision: str | None = "0011"
branch_labels: str | None = None
depends_on: str | None = None

# Written out, not imported: a revision keeps the schema it made when the package changes.
_STOPPED_EARLY = (
    "status = 'TERMINATED' AND stop_reason IS NOT NULL AND stop_reason <> '' "
    "AND stop_reason NOT IN ('its trainable finished', 'it met its stopping criterion') "
    "AND {find}(stop_reason, ': it reached max_t=') = 0"
)
_WARM_STARTED = "warm_start IS NOT NULL"


def upgrade() -> None:
    op.create_index(
        "ix_at_trials_run_best",
        "at_trials",
        [
            "experiment_run_id",
            "best_metric",
            "best_mode",
            "best_value",
            "trial_id",
        ],
    )
    op.create_index(
        "ix_at_trials_run_status", "at_trials", ["experiment_run_id", "status", "num_failures"]
    )
    op.create_index(
        "ix_at_trials_run_stopped_early",
        "at_trials",
        ["experiment_run_id", "status", "stop_reason"],
        sqlite_where=sa.text(_STOPPED_EARLY.format(find="instr")),
        postgresql_where=sa.text(_STOPPED_EARLY.format(find="strpos")),
    )
    op.create_index(
        "ix_at_trials_run_warm_started",
        "at_trials",
        ["experiment_run_id", "trial_id", "warm_start"],
        sqlite_where=sa.text(_WARM_STARTED),
        postgresql_where=sa.text(_WARM_STARTED),
    )


def downgrade() -> None:
    for name in (
        "ix_at_trials_run_warm_started",
        "ix_at_trials_run_stopped_early",
        "ix_at_trials_run_status",
        "ix_at_trials_run_best",
    ):
        op.drop_index(name, table_name="at_trials")
