"""at_trials.other_mode_best_value and .other_mode_best_iteration: each trial's best of its kept
metric in the other mode than ``best_mode``, so that the leaderboard ranks in either mode from one
row per trial (``store/trial_best.py``).

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision: str | None = "0014"
branch_labels: str | None = None
depends_on: str | None = None

# Written out, not imported: a revision keeps the SQL it ran when the package changes. Per
# trial whose best is kept (best_metric and best_mode set), its results' best in the other mode:
# the highest value of best_metric for "min", the lowest for "max", the earliest iteration on
# ties; only numbers count (a string, a bool or a JSON null under the key is not reported), as
# the leaderboard's metric_value and add_results count them. Trials with no such result keep
# NULL, as do trials whose best is not kept (the leaderboard reads their results).
_VALUE = {
    "sqlite": "json_extract(r.metrics, '$.\"' || at_trials.best_metric || '\"')",
    "postgresql": "(r.metrics ->> at_trials.best_metric)::float",
}
_IS_NUMBER = {
    "sqlite": (
        "json_type(r.metrics, '$.\"' || at_trials.best_metric || '\"') IN ('integer', 'real')"
    ),
    "postgresql": "jsonb_typeof(r.metrics -> at_trials.best_metric) = 'number'",
}


def _backfill(dialect: str) -> str:
    value = _VALUE[dialect]
    # Ascending on this key is the other mode's order: the value for "max", its negation for "min".
    # It is a column of a derived table: SQLite refuses a reference to the updated row in the
    # ORDER BY of the subquery.
    key = f"CASE WHEN at_trials.best_mode = 'min' THEN -({value}) ELSE {value} END"
    return (
        "UPDATE at_trials SET (other_mode_best_value, other_mode_best_iteration) = ("
        "SELECT v, i FROM ("
        f"SELECT {value} AS v, r.iteration AS i, {key} AS k FROM at_results r "
        f"WHERE r.trial_id = at_trials.trial_id AND {_IS_NUMBER[dialect]}"
        ") AS numbers ORDER BY k, i LIMIT 1) "
        "WHERE best_metric IS NOT NULL AND best_mode IN ('min', 'max')"
    )


def upgrade() -> None:
    op.add_column("at_trials", sa.Column("other_mode_best_value", sa.Float(), nullable=True))
    op.add_column("at_trials", sa.Column("other_mode_best_iteration", sa.Integer(), nullable=True))
    dialect = op.get_bind().dialect.name
    if dialect in _VALUE:
        op.execute(_backfill(dialect))


def downgrade() -> None:
    # In place, not batch mode: rebuilding the table on SQLite is not needed to drop a column.
    op.drop_column("at_trials", "other_mode_best_iteration")
    op.drop_column("at_trials", "other_mode_best_value")
