"""at_trials.stop_kind: why a TERMINATED trial ended, as a value (``core/stop_kind.py``), written
by the store's one status setter; the partial index of the trials stopped early is rebuilt on it.

The rows already there get the kind the stop reason's text gave until now (the rule of
``core/fate.py`` ``stopped_early`` before this revision): a trial stopped from Airflow is
``airflow``; "its trainable finished" is ``finished``; "it met its stopping criterion" is
``criterion``; a reason that holds ": it reached max_t=" is ``max_t``; any other reason is
``scheduler``; no reason leaves it NULL.

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision: str | None = "0016"
branch_labels: str | None = None
depends_on: str | None = None

# Written out, not imported: a revision keeps the schema it made when the package changes.
_INDEX = "ix_at_trials_run_stopped_early"
_OLD_STOPPED_EARLY = (
    "status = 'TERMINATED' AND stop_reason IS NOT NULL AND stop_reason <> '' "
    "AND stop_reason NOT IN ('its trainable finished', 'it met its stopping criterion') "
    "AND {find}(stop_reason, ': it reached max_t=') = 0"
)
_STOPPED_EARLY = "status = 'TERMINATED' AND stop_kind = 'scheduler'"
_FIND = {"sqlite": "instr", "postgresql": "strpos"}
_BACKFILL = (
    "UPDATE at_trials SET stop_kind = CASE "
    "WHEN stopped_from_airflow THEN 'airflow' "
    "WHEN stop_reason IS NULL OR stop_reason = '' THEN NULL "
    "WHEN stop_reason = 'its trainable finished' THEN 'finished' "
    "WHEN stop_reason = 'it met its stopping criterion' THEN 'criterion' "
    "WHEN {find}(stop_reason, ': it reached max_t=') > 0 THEN 'max_t' "
    "ELSE 'scheduler' END "
    "WHERE status = 'TERMINATED'"
)


def upgrade() -> None:
    find = _FIND.get(op.get_bind().dialect.name, "instr")
    # In place, not batch mode: rebuilding at_trials on SQLite would cascade-delete its results.
    op.add_column("at_trials", sa.Column("stop_kind", sa.String(16), nullable=True))
    op.execute(_BACKFILL.format(find=find))
    op.drop_index(_INDEX, table_name="at_trials")
    op.create_index(
        _INDEX,
        "at_trials",
        ["experiment_run_id", "status", "stop_kind"],
        sqlite_where=sa.text(_STOPPED_EARLY),
        postgresql_where=sa.text(_STOPPED_EARLY),
    )


def downgrade() -> None:
    op.drop_index(_INDEX, table_name="at_trials")
    op.drop_column("at_trials", "stop_kind")
    op.create_index(
        _INDEX,
        "at_trials",
        ["experiment_run_id", "status", "stop_reason"],
        sqlite_where=sa.text(_OLD_STOPPED_EARLY.format(find="instr")),
        postgresql_where=sa.text(_OLD_STOPPED_EARLY.format(find="strpos")),
    )
