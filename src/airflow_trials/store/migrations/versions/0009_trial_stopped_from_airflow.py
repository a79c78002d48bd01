"""at_trials.stopped_from_airflow: Airflow stopped the trial (its task cleared, marked or killed).

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-25
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision: str | None = "0008"
branch_labels: str | None = None
depends_on: str | None = None


# What a trigger's on_kill wrote as the error of a trial it stopped, before this revision.
_OLD_STOP_MESSAGE = "Stopped because its Airflow task was cleared or marked while deferred."


def upgrade() -> None:
    op.add_column(
        "at_trials",
        sa.Column("stopped_from_airflow", sa.Boolean(), server_default=sa.false(), nullable=False),
    )
    # A trial stopped that way and not started since keeps saying so: its task's next try must
    # not re-attach to the actor being stopped.
    trials = sa.table(
        "at_trials",
        sa.column("status"),
        sa.column("error_msg"),
        sa.column("stopped_from_airflow", sa.Boolean()),
    )
    op.execute(
        trials.update()
        .where(trials.c.status == "TERMINATED", trials.c.error_msg == _OLD_STOP_MESSAGE)
        .values(stopped_from_airflow=True)
    )


def downgrade() -> None:
    # In place, not batch mode: rebuilding at_trials on SQLite would cascade-delete its results.
    op.drop_column("at_trials", "stopped_from_airflow")
