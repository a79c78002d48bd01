"""A run's best against the previous run's: the regression tolerance and the comparisons.

``tuning_experiment(regression_tolerance=...)`` fails a run whose best is worse than the previous
successful run's by more than the tolerance. The tolerance is spelled one way, a dict of one key::

    {"absolute": 0.01}   # in the metric's units: worse by more than 0.01 fails
    {"relative": 0.05}   # a fraction of the previous value: worse by more than 5 % fails

One metric compares the two runs' best values in the metric's mode (:func:`compare_best`).
Several compare the hypervolumes of the two runs' Pareto fronts against one reference point
(:func:`compare_fronts`), so only ``relative`` applies. The hypervolume itself is computed by the
caller's function (optuna's, which ``core/`` does not import), given loss vectors to minimise.

Everything here is pure: no store, no Airflow, no Ray.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

#: The spellings of a tolerance: the one key of its dict.
KINDS = ("absolute", "relative")
#: The reference point sits this fraction of each metric's range beyond the worst value of both
#: fronts, so that a point with a worst value still adds volume.
REFERENCE_MARGIN = 0.1

#: ``hypervolume(loss_vectors, reference_point)``: the volume the vectors (every coordinate to be
#: minimised) dominate up to the reference point.
Hypervolume = Callable[[list[list[float]], list[float]], float]


@dataclass(frozen=True)
class RegressionTolerance:
    """How much worse than the previous successful run's best a run's best may be.

    :param kind: ``"absolute"`` (in the metric's units) or ``"relative"`` (a fraction of the
        previous run's value, or of its hypervolume with several metrics).
    :param amount: a finite number >= 0; ``relative`` at most 1 (5 % is 0.05).
    """

    kind: str
    amount: float

    @classmethod
    def of(cls, spec: Any) -> RegressionTolerance | None:
        """The tolerance a DAG file gives (``{"relative": 0.05}`` or ``{"absolute": 0.01}``);
        None for None (no check). ValueError naming the value and the spelling otherwise."""
        if spec is None or isinstance(spec, RegressionTolerance):
            return spec
        example = (
            '{"relative": 0.05} (worse by at most 5 %) or {"absolute": 0.01} (in the metric\'s '
            "units)"
        )
        if not isinstance(spec, Mapping) or len(spec) != 1 or next(iter(spec)) not in KINDS:
            raise ValueError(
                f"regression_tolerance={spec!r} is not a tolerance: give a dict of one key, "
                f"{example}, or leave it out (no check)."
            )
        ((kind, amount),) = spec.items()
        number = isinstance(amount, int | float) and not isinstance(amount, bool)
        if not number or not math.isfinite(amount) or amount < 0:
            raise ValueError(
                f"regression_tolerance={spec!r}: the {kind} tolerance must be a finite number "
                f">= 0, got {amount!r}; e.g. {example}."
            )
        if kind == "relative" and amount > 1:
            raise ValueError(
                f"regression_tolerance={spec!r}: a relative tolerance is a fraction of the "
                f"previous run's value, at most 1; 5 % is {{'relative': 0.05}}."
            )
        return cls(kind, float(amount))

    def check_metrics(self, several_metrics: bool) -> None:
        """ValueError for an absolute tolerance with several metrics: their hypervolume has no
        unit a user could give a tolerance in."""
        if several_metrics and self.kind == "absolute":
            raise ValueError(
                f"regression_tolerance={self.to_dict()!r} is absolute, but with several metrics "
                "the runs' Pareto fronts are compared by hypervolume, whose units are no "
                "metric's; give a relative tolerance, e.g. {'relative': 0.05}."
            )

    def to_dict(self) -> dict[str, float]:
        return {self.kind: self.amount}

    def allowed_drop(self, previous: float) -> float:
        """How much worse than ``previous`` a value may be: the amount, or that fraction of
        ``|previous|``."""
        return self.amount if self.kind == "absolute" else self.amount * abs(previous)


@dataclass(frozen=True)
class Comparison:
    """Tonight's value against the previous run's.

    :param current: the run's best value (its hypervolume with several metrics).
    :param previous: the previous successful run's.
    :param worse_by: how much worse ``current`` is (0 when as good or better).
    :param allowed: how much worse it may be (:meth:`RegressionTolerance.allowed_drop`).
    :param reference_point: with several metrics, the hypervolumes' reference point in the
        metrics' own units and order; None with one metric. Default None.
    """

    current: float
    previous: float
    worse_by: float
    allowed: float
    reference_point: list[float] | None = None

    @property
    def regressed(self) -> bool:
        return self.worse_by > self.allowed

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "current": self.current,
            "previous": self.previous,
            "worse_by": self.worse_by,
            "allowed": self.allowed,
            "regressed": self.regressed,
        }
        if self.reference_point is not None:
            out["reference_point"] = self.reference_point
        return out


def compare_best(
    current: float, previous: float, mode: str, tolerance: RegressionTolerance
) -> Comparison:
    """One metric: how much worse ``current`` is than ``previous`` in ``mode``
    (``"min"``: higher is worse; ``"max"``: lower is)."""
    if mode not in ("min", "max"):
        raise ValueError(f"mode must be 'min' or 'max', got {mode!r}.")
    worse_by = current - previous if mode == "min" else previous - current
    return Comparison(current, previous, max(worse_by, 0.0), tolerance.allowed_drop(previous))


def reference_point(
    fronts: Sequence[Sequence[Sequence[float]]], modes: Sequence[str]
) -> list[float]:
    """The common reference point of ``fronts`` (each a list of points, one value per mode), as
    loss coordinates (max-metrics negated): each metric's worst value over all the fronts, plus
    :data:`REFERENCE_MARGIN` of its range (1 where the range is 0). Shifting or scaling a metric
    moves the point with the fronts, so the ratio of two hypervolumes does not change."""
    losses = [_losses(point, modes) for front in fronts for point in front]
    if not losses:
        raise ValueError("reference_point needs at least one point.")
    point = []
    for i in range(len(modes)):
        column = [loss[i] for loss in losses]
        span = max(column) - min(column)
        point.append(max(column) + (REFERENCE_MARGIN * span if span > 0 else 1.0))
    return point


def compare_fronts(
    current: Sequence[Sequence[float]],
    previous: Sequence[Sequence[float]],
    modes: Sequence[str],
    tolerance: RegressionTolerance,
    hypervolume: Hypervolume,
) -> Comparison:
    """Several metrics: the hypervolumes of the two runs' points (each a list of values in the
    metrics' order; dominated points add nothing) against their common :func:`reference_point`,
    compared as :func:`compare_best` compares with mode ``"max"`` (a lower hypervolume is
    worse). ``previous`` must hold a point; an empty ``current`` has hypervolume 0."""
    tolerance.check_metrics(several_metrics=True)
    for point in (*current, *previous):
        if len(point) != len(modes) or not all(math.isfinite(v) for v in point):
            raise ValueError(
                f"each point needs {len(modes)} finite values, one per metric, got {list(point)!r}"
            )
    reference = reference_point([current, previous], modes)
    # The loss coordinates' reference; the Comparison reports it in the metrics' own units.
    volumes = [
        hypervolume([_losses(p, modes) for p in front], reference) if front else 0.0
        for front in (current, previous)
    ]
    compared = compare_best(volumes[0], volumes[1], "max", tolerance)
    own_units = [-r if m == "max" else r for r, m in zip(reference, modes, strict=True)]
    return Comparison(
        compared.current, compared.previous, compared.worse_by, compared.allowed, own_units
    )


def _losses(point: Sequence[float], modes: Sequence[str]) -> list[float]:
    return [-float(v) if m == "max" else float(v) for v, m in zip(point, modes, strict=True)]
