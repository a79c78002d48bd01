"""MOASHA's ranking of a rung, as Syne Tune 0.16's: the non-dominated order of the vectors
recorded there and the verdict it gives a newcomer."""

# Pure functions over plain numbers (NumPy only), as schedulers/asha/rung_math.py is for ASHA:
# MOASHA's rule (schedulers/moasha/moasha_scheduler.py MOASHARungs) calls moasha_rung_decision in
# memory and in the trials DB alike.

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow_trials.core.scheduler import Decision
from airflow_trials.schedulers.asha.rung_math import RungVerdict

__all__ = ["costs_of", "moasha_rung_decision", "syne_tune_order"]


def syne_tune_order(costs: Sequence[Sequence[float]]) -> list[int]:
    """The list by which Syne Tune 0.16's default multi-objective priority
    (``NonDominatedPriority``) ranks a rung's rows of ``costs`` (lower is better on every column).

    The rows are split into non-dominated fronts (a row dominates another when it is no higher on
    every cost and lower on one; equal rows share a front). Within each front the rows are put in
    a greedy epsilon-net order: first the row with the lowest first cost (the earliest on ties),
    then again and again the row farthest, by Euclidean distance, from the rows already picked
    (the earliest on ties). Then, front after front, Syne Tune 0.16 lists for each row of the front
    (in row order) the row found at that row's *position* in the net: ``front[position[i]]``. The
    list is what its rung ranks by; :func:`moasha_rung_decision` reads its last entry.
    """
    import numpy as np

    points = np.asarray(costs, dtype=float)
    remaining = np.arange(len(points))
    order: list[int] = []
    while remaining.size:
        rows = points[remaining]
        # no_worse[j, i]: row j is no higher than row i on every cost; lower[j, i]: on one.
        no_worse = (rows[:, None, :] <= rows[None, :, :]).all(axis=-1)
        lower = (rows[:, None, :] < rows[None, :, :]).any(axis=-1)
        on_front = ~(no_worse & lower).any(axis=0)
        front = remaining[on_front]
        order.extend(int(i) for i in front[_net_positions(points[front])])
        remaining = remaining[~on_front]
    return order


def _net_positions(front: Any) -> Any:
    """Each row's position in the greedy epsilon-net order of ``front`` (a 2-D array)."""
    import numpy as np

    first = int(np.argmin(front[:, 0]))
    picked = [first]
    left = [i for i in range(len(front)) if i != first]
    while left:
        # Distances with NumPy's norm over the last axis, so ties fall exactly as Syne Tune's.
        gaps = front[left][:, None, :] - front[picked][None, :, :]
        nearest = np.linalg.norm(gaps, axis=-1).min(axis=-1)
        picked.append(left.pop(int(nearest.argmax())))
    positions = np.empty(len(front), dtype=int)
    positions[picked] = np.arange(len(front))
    return positions


def costs_of(values: Sequence[float], modes: Sequence[str]) -> list[float]:
    """A vector of metric values as costs (lower is better): negated where the mode is max."""
    return [value if mode == "min" else -value for value, mode in zip(values, modes, strict=True)]


def moasha_rung_decision(
    values_before: Sequence[Sequence[float]],
    values: Sequence[float],
    reduction_factor: float,
    modes: Sequence[str],
) -> RungVerdict:
    """MOASHA's verdict on ``values`` at a rung where ``values_before`` were recorded before it
    (in the order recorded), as Syne Tune 0.16's ``Bracket.on_result`` gives it.

    The first vector at a rung continues. Otherwise the rung's ``n`` vectors (the new one last)
    are turned into costs and listed by :func:`syne_tune_order`; the trial stops when that list's
    last entry divided by ``n`` exceeds ``1 / reduction_factor``. (Syne Tune 0.16 reads the list
    of row indices as if it were each row's priority, so this is not the new trial's own place
    in the order; it is kept as it is so that decisions match Syne Tune's.)
    """
    if not values_before:
        return RungVerdict(Decision.CONTINUE, None)
    rows = [costs_of(row, modes) for row in values_before]
    rows.append(costs_of(values, modes))
    score = syne_tune_order(rows)[-1] / len(rows)
    decision = Decision.STOP if score > 1 / reduction_factor else Decision.CONTINUE
    return RungVerdict(decision, score)
