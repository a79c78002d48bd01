"""The rows a :class:`~airflow_trials.results.ResultGrid` is read into: each trial's row of
``get_dataframe``, a history's best row, the checkpoints shown without one score to rank by, and
the board that answers a grid's question, checked (or, for a grid of results in memory, the same
ranking over them)."""

from __future__ import annotations

import json
import logging
import math
from collections import Counter
from collections.abc import Collection, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from airflow_trials.core.pareto import rankable
from airflow_trials.core.result import AUTO_FIELDS

if TYPE_CHECKING:
    from airflow_trials.core.goal import Goal
    from airflow_trials.store import TrialReader
    from airflow_trials.store.board import Board

log = logging.getLogger(__name__)


def frame_row(result: Any, metrics: Mapping[str, Any]) -> dict[str, Any]:
    """A trial's (a ``TrialResult``'s) row of ``ResultGrid.get_dataframe``: ``metrics``, its
    config as ``config/<key>`` columns, trial_id, status and checkpoints."""
    return {
        **metrics,
        **{f"config/{k}": v for k, v in _flatten(result.config).items()},
        "trial_id": result.trial_id,
        "status": result.status.value,
        "best_checkpoint": result.best_checkpoint,
        "latest_checkpoint": result.latest_checkpoint,
    }


def run_board(store: TrialReader, run_id: int, goal: Goal) -> Board | None:
    """The run's board by the experiment's ``goal`` (store/board.py); None without a metric and
    its mode recorded."""
    if not goal.metrics or None in goal.modes:
        return None
    return store.board(run_id, goal)


def with_checkpoints(store: TrialReader, results: list[Any], board: Board | None) -> list[Any]:
    """The ``TrialResult``s with their checkpoints: as the run's board gives them (the one
    select_best hands on, and the newest kept); without a board, since no score ranks them,
    their newest kept checkpoint as both."""
    if board is not None:
        rows = {r.trial_id: r for r in board.rows}
        return [
            replace(
                r,
                best_checkpoint=row.best_checkpoint,
                latest_checkpoint=row.latest_checkpoint,
            )
            if (row := rows.get(r.trial_id)) is not None
            else r
            for r in results
        ]
    paths = store.best_checkpoint_paths([r.trial_id for r in results], "training_iteration", "max")
    return [
        replace(r, best_checkpoint=paths.get(r.trial_id), latest_checkpoint=paths.get(r.trial_id))
        for r in results
    ]


def memory_board(grid: Any, goal: Goal, counted: Collection[str], finite_only: bool) -> Board:
    """The board of a ``ResultGrid`` built from results in memory (not read back from the trials
    DB), by the board's own ranking (:func:`~airflow_trials.store.pareto_board.pareto_board`,
    :func:`~airflow_trials.store.board.several_board`) over each trial's last result, as the
    trials DB's rows are ranked; only such a grid can hold an infinite value (``finite_only``)."""
    from airflow_trials.store.board import several_board
    from airflow_trials.store.pareto_board import pareto_board

    metrics = list(goal.metrics)
    rows = [
        (
            r.trial_id,
            r.status.value,
            r.num_failures,
            json.dumps(r.config, default=str),
            _number(r.metrics.get("training_iteration")),
            r.latest_checkpoint,
            None,
            *(_number(r.metrics.get(m)) for m in [*metrics, *grid.constraints.metrics]),
        )
        for r in grid
    ]
    modes = [str(m) for m in goal.modes] if len(metrics) > 1 else [goal.mode]
    pareto = pareto_board(metrics, modes, rows, None, grid.constraints, counted, finite_only)
    return several_board(goal, pareto)


def _number(value: Any) -> float | None:
    return None if isinstance(value, bool) or not isinstance(value, int | float) else float(value)


def checked_board(grid: Any, board: Board, metric: Any, finite_only: bool) -> Board:
    """``board``, the answer to a ``ResultGrid``'s question of ``metric`` (one, or a list), once
    it ranks a trial: a ValueError naming the fix when none is; a warning when the grid has
    constraints and no ranked trial meets them (the board then ranks them all)."""
    one = isinstance(metric, str)
    reported = f"metric {metric!r}" if one else f"metrics {metric!r}"
    valued = [r for r in board.rows if rankable(list(r.values.values()), finite_only=finite_only)]
    ranked = [r for r in valued if r.counted]
    where = f"experiment {grid.experiment_name} run {grid.run_key}"
    if valued and not ranked:
        counts = Counter(r.status.value for r in valued)
        statuses = ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
        raise ValueError(
            f"No trial of {where} that reported {reported} ended TERMINATED ({statuses}); pass "
            "terminated_only=False to rank them anyway, or resume the run."
        )
    if not ranked:
        raise ValueError(
            f"No trial of {where} reported {reported if one else 'every one of ' + reported}"
            f"{' as a finite number' if finite_only else ''}; its trials report "
            f"{', '.join(reported_metrics(grid)) or 'no metric yet'}. Pass metric= with "
            f"{'one of them' if one else 'a list of them, and mode= with their modes'}."
        )
    if grid.constraints and not any(r.feasible for r in ranked):
        log.warning(
            "No trial of experiment %s run %s that could be ranked meets the constraints %s; "
            "ranking all %d of them.",
            grid.experiment_name,
            grid.run_key,
            grid.constraints.spec,
            len(ranked),
        )
    return board


def best_row(history: list[dict[str, Any]], metric: str, mode: str | None) -> dict[str, Any] | None:
    sign = 1.0 if mode == "min" else -1.0
    scored = [
        (float(r[metric]), r)
        for r in history
        if isinstance(r.get(metric), (int, float))
        and not isinstance(r.get(metric), bool)
        and math.isfinite(r[metric])
    ]
    return min(scored, key=lambda pair: sign * pair[0])[1] if scored else None


def _flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, Mapping):
            flat.update(_flatten(value, f"{prefix}{key}/"))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def reported_metrics(grid: Any) -> list[str]:
    """The metrics a ``ResultGrid``'s trials report as numbers in their last result."""
    return sorted(
        {
            k
            for r in grid
            for k, v in r.metrics.items()
            if k not in AUTO_FIELDS and isinstance(v, (int, float)) and not isinstance(v, bool)
        }
    )
