"""The rows a :class:`~airflow_trials.results.ResultGrid` is read into: each trial's row of
``get_dataframe``, a history's best row, the checkpoints shown without one score to rank by, and
the trials that meet the grid's constraints."""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from airflow_trials.core.result import AUTO_FIELDS
from airflow_trials.core.status import TrialStatus

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


def _several_of(board: Board | None, metrics: Sequence[str], modes: Sequence[str]) -> bool:
    """Is ``board`` the board of these several metrics in these modes?"""
    return (
        board is not None
        and (len(board.goal.metrics) > 1 or board.goal.several)
        and list(board.goal.metrics) == list(metrics)
        and list(board.goal.modes) == list(modes)
    )


def board_front(
    board: Board | None, metrics: Sequence[str], modes: Sequence[str], counted_only: bool
) -> set[str]:
    """The ids on the board's front when the front asked for is the board's (its metrics and
    modes, only the trials that count, finite values); empty otherwise."""
    if not counted_only or not _several_of(board, metrics, modes):
        return set()
    assert board is not None
    return set(board.front_trial_ids)


def board_pareto_ranks(
    board: Board | None, metrics: Sequence[str], modes: Sequence[str], rows: list[dict[str, Any]]
) -> list[int | None] | None:
    """Each frame row's Pareto rank on the board, when ranked by the board's metrics and modes;
    None otherwise."""
    if not _several_of(board, metrics, modes):
        return None
    assert board is not None
    ranks = {r.trial_id: r.pareto_rank for r in board.rows}
    return [ranks.get(row["trial_id"]) for row in rows]


def feasible_first(
    grid: Any, candidates: list[tuple[Any, Any]], best_of: tuple[str, str] | None = None
) -> list[tuple[Any, Any]]:
    """The ``(score, TrialResult)`` candidates of a ``ResultGrid`` that meet its constraints;
    all of them, with a warning, when none does. Each is judged on the result whose value is
    ranked: its best of ``best_of`` (metric, mode) when given, else its last result."""
    if not grid.constraints:
        return candidates
    judged = None if best_of is None else best_results(grid._store, grid.run.id, *best_of)

    def result(trial: Any) -> Mapping[str, Any]:
        return trial.metrics if judged is None else judged.get(trial.trial_id, {})

    feasible = [pair for pair in candidates if grid.constraints.feasible(result(pair[1]))]
    if feasible:
        return feasible
    log.warning(
        "No trial of experiment %s run %s that could be ranked meets the constraints %s; "
        "ranking all %d of them.",
        grid.experiment_name,
        grid.run_key,
        grid.constraints.spec,
        len(candidates),
    )
    return candidates


def best_results(
    store: TrialReader, run_id: int, metric: str, mode: str
) -> dict[str, Mapping[str, Any]]:
    """Each trial's result with its best value of ``metric`` (the leaderboard's best iteration):
    the result ``get_best_result(scope="all")`` ranks, so the one its constraints judge."""
    board = store.leaderboard(run_id, metric, mode)
    judged: dict[str, Mapping[str, Any]] = {}
    for row in board:
        if row.best_iteration is not None:
            results = store.get_results(row.trial_id)
            judged[row.trial_id] = next(
                (r for r in results if r.get("training_iteration") == row.best_iteration), {}
            )
    return judged


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


def candidates_of(
    grid: Any,
    scored: list[tuple[Any, Any]],
    metric: Any,
    filter_nan_and_inf: bool,
    terminated_only: bool,
) -> list[tuple[Any, Any]]:
    """The scored trials of a ``ResultGrid`` (those that reported ``metric``, or every one of
    several) to rank: only the TERMINATED ones with ``terminated_only``; ValueError, naming the
    fix, when none is left."""
    one = isinstance(metric, str)
    reported = f"metric {metric!r}" if one else f"metrics {metric!r}"
    candidates = [
        (score, result)
        for score, result in scored
        if not terminated_only or result.status is TrialStatus.TERMINATED
    ]
    where = f"experiment {grid.experiment_name} run {grid.run_key}"
    if scored and not candidates:
        counts = Counter(result.status.value for _, result in scored)
        statuses = ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
        raise ValueError(
            f"No trial of {where} that reported {reported} ended TERMINATED ({statuses}); pass "
            "terminated_only=False to rank them anyway, or resume the run."
        )
    if not candidates:
        raise ValueError(
            f"No trial of {where} reported {reported if one else 'every one of ' + reported}"
            f"{' as a finite number' if filter_nan_and_inf else ''}; its trials report "
            f"{', '.join(reported_metrics(grid)) or 'no metric yet'}. Pass metric= with "
            f"{'one of them' if one else 'a list of them, and mode= with their modes'}."
        )
    return candidates


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
