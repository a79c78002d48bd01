"""The rows a :class:`~airflow_trials.results.ResultGrid` is read into: each trial's row of
``get_dataframe``, a history's best row, the checkpoints shown without one score to rank by, and
the trials that meet the grid's constraints."""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from airflow_trials.store import TrialReader

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


def with_checkpoints(store: TrialReader, results: list[Any]) -> list[Any]:
    """The ``TrialResult``s with, since no one score ranks them, their newest kept checkpoint as
    both best and latest."""
    paths = store.best_checkpoint_paths([r.trial_id for r in results], "training_iteration", "max")
    return [
        replace(r, best_checkpoint=paths.get(r.trial_id), latest_checkpoint=paths.get(r.trial_id))
        for r in results
    ]


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
