"""The one mapper layer: a database row in, a frozen record of `store/records.py` out.

Every component reads its rows through these, so a column added to a table is mapped once. An
argument is an ORM row or a Core row's ``_mapping`` where the function says so.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from airflow_trials.core.scheduler import Decision
from airflow_trials.core.status import TrialStatus
from airflow_trials.core.status_cause import StatusCause
from airflow_trials.core.stop_kind import stop_kind_or_none
from airflow_trials.store.models import ExperimentRow, ExperimentRunRow, TrialRow
from airflow_trials.store.records import (
    CheckpointRecordRow,
    ExperimentRecord,
    ExperimentRunRecord,
    ExperimentRunStatus,
    ExploitRecord,
    LeaderboardRow,
    MedianPoint,
    RankedTrial,
    RungDecision,
    TrialRecord,
)

_STATUSES = {status.value: status for status in TrialStatus}
_R = TypeVar("_R")
_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def from_row(record: type[_R], row: Any, **computed: Any) -> _R:
    """The ``record`` whose fields are the row's columns of the same names, but those ``computed``
    from it. An ORM row's columns are its attributes; a Core row's ``_mapping`` (or a dict) is
    read by key."""
    names = _field_names(record)
    if isinstance(row, Mapping):
        columns = {name: row[name] for name in names if name not in computed}
    else:
        columns = {name: getattr(row, name) for name in names if name not in computed}
    return record(**columns, **computed)


def _field_names(record: type) -> tuple[str, ...]:
    names = _FIELD_NAMES.get(record)
    if names is None:
        names = _FIELD_NAMES[record] = tuple(field.name for field in dataclasses.fields(record))
    return names


def trial_record(row: TrialRow) -> TrialRecord:
    return from_row(
        TrialRecord,
        row,
        status=TrialStatus(row.status),
        stopped_from_airflow=bool(row.stopped_from_airflow),
        stop_kind=stop_kind_or_none(row.stop_kind),
        status_cause=None if row.status_cause is None else StatusCause(row.status_cause),
    )


def experiment_record(row: ExperimentRow) -> ExperimentRecord:
    return from_row(ExperimentRecord, row)


def experiment_run_record(run: ExperimentRunRow, experiment_name: str) -> ExperimentRunRecord:
    return from_row(
        ExperimentRunRecord,
        run,
        experiment_name=experiment_name,
        status=ExperimentRunStatus(run.status),
    )


def checkpoint_record(row: Any) -> CheckpointRecordRow:
    """From an ORM checkpoint row, or a Core row with its path, iteration, score and deleted."""
    return from_row(CheckpointRecordRow, row)


_NO_CHECKPOINTS: tuple[None, None] = (None, None)


def leaderboard_rows(
    rows: Sequence[Any], checkpoints: Mapping[str, tuple[str, str]]
) -> list[LeaderboardRow]:
    """From the rows of :func:`~airflow_trials.store.leaderboard.leaderboard_query` (Core, not
    ORM: the ORM's per-row work would cost more than the query), whose config is JSON text, and
    the trials' (best, latest) checkpoint paths by trial id
    (:func:`~airflow_trials.store.leaderboard.checkpoint_paths`; none kept: not in it).

    The configs are decoded as one JSON array: a ``json.loads`` call per row cost three times as
    much at 10,000 rows.
    """
    configs = json.loads("[" + ",".join(row[3] for row in rows) + "]")
    board = []
    for (trial_id, status, num_failures, _, value, iteration, stop_kind), config in zip(
        rows, configs, strict=True
    ):
        best, latest = checkpoints.get(trial_id, _NO_CHECKPOINTS)
        board.append(
            LeaderboardRow(
                trial_id=trial_id,
                status=_STATUSES[status],
                num_failures=num_failures,
                config=config,
                best_value=value,
                best_iteration=iteration,
                best_checkpoint=best,
                latest_checkpoint=latest,
                stop_kind=stop_kind,
            )
        )
    return board


def trial_status(value: str) -> TrialStatus:
    """The status stored as ``value``."""
    return _STATUSES[value]


def ranked_trial(row: Any) -> RankedTrial:
    """From a (trial_id, status, num_failures, best_value, best_iteration) row."""
    trial_id, status, num_failures, best_value, best_iteration = row
    return RankedTrial(trial_id, _STATUSES[status], num_failures, best_value, best_iteration)


def exploit_record(row: Any, *, fresh: bool) -> ExploitRecord:
    """From a Core row's ``_mapping`` (or the dict inserted)."""
    return from_row(ExploitRecord, row, fresh=fresh)


def rung_decision(row: Any, *, fresh: bool) -> RungDecision:
    """From a Core row's ``_mapping`` (or the dict inserted); a NULL value is NaN."""
    value = row["value"]
    return from_row(
        RungDecision,
        row,
        value=math.nan if value is None else value,
        decision=Decision(row["decision"]),
        at_end=bool(row["at_end"]),
        fresh=fresh,
    )


def median_point(row: Any, *, fresh: bool) -> MedianPoint:
    """From a Core row's ``_mapping`` (or the dict inserted); the mean is NaN where the sum is
    NULL."""
    total = row["total"]
    return from_row(
        MedianPoint,
        row,
        mean=math.nan if total is None else total / row["seq"],
        decision=Decision(row["decision"]),
        at_end=bool(row["at_end"]),
        fresh=fresh,
    )
