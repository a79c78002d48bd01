"""Several metrics at once: the metric/mode pair as a name or a list, Pareto ranks, and the
experiment's metrics as the trials DB stores them.

One metric is a string, as everywhere else in the package, and everything here leaves it exactly
as it is. Several are a list of names with a list of modes, one ``"min"`` or ``"max"`` per metric,
in Ray Tune's ``OptunaSearch`` spelling::

    from airflow_trials.core.pareto import check_metrics, pareto_ranks

    metric, mode = check_metrics("my_code", ["val_acc", "latency"], ["max", "min"])
    pareto_ranks([[0.9, 30.0], [0.8, 10.0], [0.7, 40.0], [0.9, float("nan")]], mode)
    # -> [0, 0, 1, None]: the first two are the front; the third is dominated by both; the last
    #    has no rank because NaN compares with nothing
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

#: One metric (a result key) or several (a list of result keys).
MetricSpec = str | list[str]
#: One mode (``"min"`` or ``"max"``) or one mode per metric.
ModeSpec = str | list[str]

MODES = ("min", "max")

#: The length of the trials DB's ``at_experiments.metric`` column (``store/models.py``), which
#: holds several metrics as one string (:func:`encode_metrics`).
STORED_METRIC_LENGTH = 250


def check_metrics(
    owner: str, metric: MetricSpec | None, mode: ModeSpec | None
) -> tuple[MetricSpec | None, ModeSpec | None]:
    """``metric`` and ``mode`` checked: one metric (a string or None) is returned as it is, its
    mode left to the caller's own check; several come back as lists (:func:`check_several`).

    :param owner: names the caller in messages (``"OptunaSearch"``).
    :raises ValueError: naming the metrics, what is wrong and how to write it instead.
    """
    if isinstance(metric, list | tuple):
        return check_several(owner, metric, mode)
    return _check_one(owner, metric, mode)


def _check_one(
    owner: str, metric: str | None, mode: ModeSpec | None
) -> tuple[str | None, str | None]:
    if isinstance(mode, list | tuple):
        raise ValueError(
            f"{owner}: mode={mode!r} is a list but metric={metric!r} is not; give metric as a "
            "list too, one name per mode, e.g. metric=['val_acc', 'latency'], "
            "mode=['max', 'min']."
        )
    return metric, mode


def check_several(
    owner: str, metric: Sequence[Any], mode: ModeSpec | Sequence[Any] | None
) -> tuple[list[str], list[str]]:
    """Several metrics and their modes as lists, after checking that they are non-empty, name
    each metric once, and give one ``"min"`` or ``"max"`` per metric.

    :raises ValueError: naming the metrics, what is wrong and how to write it instead.
    """
    names = list(metric)
    if not names:
        raise ValueError(
            f"{owner}: metric=[] names no metric; give at least one, e.g. "
            "metric=['val_acc', 'latency'] with mode=['max', 'min'], or one metric as a string."
        )
    for name in names:
        if not isinstance(name, str) or not name:
            raise ValueError(
                f"{owner}: metric={names!r} holds {name!r}, which is not a result key; give each "
                "metric as a non-empty string."
            )
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise ValueError(
            f"{owner}: metric={names!r} names {', '.join(map(repr, twice))} more than once; give "
            "each metric once, with its one mode at the same place in mode=[...]."
        )
    if not isinstance(mode, list | tuple):
        raise ValueError(
            f"{owner}: metric={names!r} is a list but mode={mode!r} is not; give mode as a list "
            f"of {len(names)}, one 'min' or 'max' per metric in the same order, e.g. "
            f"mode={_example_modes(len(names))!r}."
        )
    modes = list(mode)
    if len(modes) != len(names):
        raise ValueError(
            f"{owner}: metric={names!r} has {len(names)} metrics but mode={modes!r} has "
            f"{len(modes)} modes; give one 'min' or 'max' per metric, in the same order."
        )
    for name, one in zip(names, modes, strict=True):
        if one not in MODES:
            raise ValueError(
                f"{owner}: mode={modes!r} gives metric {name!r} the mode {one!r}; each mode must "
                "be 'min' (lower is better) or 'max' (higher is better)."
            )
    return names, modes


def _example_modes(count: int) -> list[str]:
    return [MODES[i % 2] for i in range(count)]


def pareto_ranks(
    rows: Sequence[Sequence[Any]], modes: Sequence[str], *, finite_only: bool = True
) -> list[int | None]:
    """Each row's Pareto rank (non-dominated sorting): 0 for the rows no other row dominates (the
    front), k for the front left once the ranks below k are removed.

    A row dominates another when it is at least as good on every metric and better on one; equal
    rows do not dominate each other and share a rank. A row with a missing value (None, not a
    number) or NaN gets no rank (None), nor, with ``finite_only`` (default), one with an infinite
    value, as ``ResultGrid.get_best_result(filter_nan_and_inf=True)`` skips them; without it,
    infinities are ranked as the worst or best of values. Rows without a rank are left out of
    the comparison.

    The rank of a row is the length of the longest chain of rows dominating one another above
    it; rows sorted lexicographically (a dominating row always comes first) get their ranks in
    one pass: with two metrics by a binary search over each rank's lowest second value
    (O(N log N); 10,000 rows in milliseconds), with more each compared with the rows before it
    (O(M N^2) comparisons in NumPy).

    :param rows: one sequence of values per row, in the order of ``modes``.
    :param modes: ``"min"`` or ``"max"``, one per metric.
    :raises ValueError: a mode that is not min or max, no mode, or a row of another length.
    """
    if not modes or any(m not in MODES for m in modes):
        raise ValueError(
            f"pareto_ranks: modes={list(modes)!r}; give one 'min' or 'max' per metric."
        )
    ranked_rows: list[int] = []
    points: list[list[float]] = []
    for i, row in enumerate(rows):
        if len(row) != len(modes):
            raise ValueError(
                f"pareto_ranks: row {i} has {len(row)} values for {len(modes)} modes; give one "
                "value per metric."
            )
        if rankable(row, finite_only=finite_only):
            ranked_rows.append(i)
            points.append([float(value) for value in row])
    ranks: list[int | None] = [None] * len(rows)
    for row_index, rank in zip(ranked_rows, _ranks_of(points, modes), strict=True):
        ranks[row_index] = rank
    return ranks


def rankable(row: Sequence[Any], *, finite_only: bool = True) -> bool:
    """Does :func:`pareto_ranks` rank ``row``: every value a number (not a bool), none NaN, and
    with ``finite_only`` none infinite?"""
    for value in row:
        if isinstance(value, bool) or not isinstance(value, int | float):
            return False
        if math.isnan(value) or (finite_only and math.isinf(value)):
            return False
    return True


def _ranks_of(points: list[list[float]], modes: Sequence[str]) -> list[int]:
    if not points:
        return []
    import numpy as np

    signs = np.array([1.0 if m == "min" else -1.0 for m in modes])
    costs = np.asarray(points, dtype=float) * signs  # lower is better on every metric now
    # Equal rows share a rank: rank each distinct row once. np.unique sorts them
    # lexicographically, so a row's dominators all come before it, and an earlier row that is
    # no worse on every metric (it differs, being distinct) dominates it.
    distinct, inverse = np.unique(costs, axis=0, return_inverse=True)
    if distinct.shape[1] == 2:
        ranked_2d = _ranks_of_two(distinct)
        return [ranked_2d[i] for i in inverse.reshape(-1)]
    columns = [np.ascontiguousarray(distinct[:, j]) for j in range(distinct.shape[1])]
    ranked = np.zeros(len(distinct), dtype=np.int64)
    for k in range(1, len(distinct)):
        dominating = columns[0][:k] <= columns[0][k]
        for column in columns[1:]:
            dominating &= column[:k] <= column[k]
        if dominating.any():
            ranked[k] = ranked[:k][dominating].max() + 1
    return [int(r) for r in ranked[inverse.reshape(-1)]]


def _ranks_of_two(distinct: Any) -> list[int]:
    """:func:`_ranks_of` for two metrics in O(N log N): ``distinct`` holds distinct cost rows
    sorted lexicographically, so every row before a row has a first cost no higher, and one of
    them dominates it exactly when its second cost is no higher. ``lowest[f]`` is the lowest
    second cost among the rows of rank f so far, non-decreasing in f (a row of rank f + 1 has a
    dominator of rank f, no higher on the second cost), so the ranks of a row's dominators are
    the prefix of ranks whose ``lowest`` is no higher than its second cost, and its rank is the
    length of that prefix."""
    from bisect import bisect_right

    lowest: list[float] = []
    ranks: list[int] = []
    for second in distinct[:, 1].tolist():
        rank = bisect_right(lowest, second)
        if rank == len(lowest):
            lowest.append(second)
        else:
            lowest[rank] = second  # lower than it was: bisect_right put it before
        ranks.append(rank)
    return ranks


def scheduler_metric_and_mode(
    scheduler: Any, metric: MetricSpec | None, mode: ModeSpec | None
) -> tuple[MetricSpec | None, ModeSpec | None]:
    """What an experiment of ``metric``/``mode`` hands its scheduler to judge trials by: one
    metric as it is; several to a scheduler that takes several (its class sets
    ``takes_several_metrics = True``); else the one of them the scheduler judges by, with its
    mode, as ``TrialRunner`` pairs a scheduler with a searcher of several metrics.

    :raises ValueError: a scheduler that judges one metric but names none of the experiment's,
        or names it in the other mode; the message names the scheduler, the metrics and the fix.
    """
    if not isinstance(metric, list) or not isinstance(mode, list):
        return metric, mode
    if getattr(scheduler, "takes_several_metrics", False):
        return metric, mode
    name = type(scheduler).__name__
    own = getattr(scheduler, "metric", None)
    fix = (
        f"give it one of them to stop trials by, e.g. {name}(metric={metric[0]!r}, "
        f"mode={mode[0]!r}), use a scheduler that takes several metrics (its class sets "
        "takes_several_metrics = True), or leave scheduler out"
    )
    if own is None:
        raise ValueError(
            f"The scheduler {name} judges trials by one metric and cannot take several, but the "
            f"experiment has {metric!r} (modes {mode!r}); {fix}."
        )
    if own not in metric:
        raise ValueError(
            f"The scheduler {name} judges trials by {own!r}, which is not one of the "
            f"experiment's metrics {metric!r}; {fix}."
        )
    wanted = mode[metric.index(own)]
    theirs = getattr(scheduler, "mode", None)
    if theirs and theirs != wanted:
        raise ValueError(
            f"The scheduler {name} and the experiment disagree on the mode of {own!r}: "
            f"{theirs!r} vs {wanted!r} (scheduler vs experiment); give the scheduler "
            f"mode={wanted!r}, or no mode."
        )
    return own, wanted


def encode_metrics(
    metric: MetricSpec | None, mode: ModeSpec | None
) -> tuple[str | None, str | None]:
    """The experiment's metric and mode as the trials DB's ``at_experiments`` columns hold them:
    one metric as it is (the same strings as always); several as one JSON object of metric to
    mode in the metric column (``{"val_acc":"max","latency":"min"}``), with no mode (the mode
    column holds at most 8 characters). :func:`decode_metrics` reads it back.

    :raises ValueError: several metrics that :func:`check_several` refuses, or whose names are
        too long together for the column; a list of modes with one metric.
    """
    owner = "The experiment's metrics"
    if not isinstance(metric, list | tuple):
        return _check_one(owner, metric, mode)
    names, modes = check_several(owner, metric, mode)
    stored = json.dumps(dict(zip(names, modes, strict=True)), separators=(",", ":"))
    if len(stored) > STORED_METRIC_LENGTH:
        raise ValueError(
            f"The metrics {names!r} take {len(stored)} characters together in the trials DB, "
            f"which holds {STORED_METRIC_LENGTH}; use shorter result keys."
        )
    return stored, None


def decode_metrics(
    metric: str | None, mode: str | None
) -> tuple[MetricSpec | None, ModeSpec | None]:
    """The experiment's metric and mode from what :func:`encode_metrics` stored: one metric as it
    is; several as their lists of names and modes (the mode column is then ignored).

    No single metric is read as several: the stored form contains ``"``, which a metric the
    trials DB ranks by cannot hold.
    """
    if metric is None or not metric.startswith("{"):
        return metric, mode
    try:
        stored = json.loads(metric)
    except ValueError:
        return metric, mode
    if (
        not isinstance(stored, dict)
        or not stored
        or not all(isinstance(k, str) and v in MODES for k, v in stored.items())
    ):
        return metric, mode
    return list(stored), list(stored.values())
