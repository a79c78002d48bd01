"""What an Optuna study is told of a finished trial: its objective value (one per metric with
several) and its constraint values, each checked, with a message naming the trial's place."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from airflow_trials.core.constraints import Constraints
from airflow_trials.core.pareto import MetricSpec
from airflow_trials.core.searcher import ObjectiveValue


def constraint_values(
    constraints: Constraints, where: str, result: Mapping[str, Any]
) -> dict[str, float]:
    """``constraints``' values for ``result``, by their spelling; ValueError naming ``where``
    when it does not report a constrained metric as a finite number (Optuna takes no NaN, and
    a missing value would count as met)."""
    missing = constraints.missing(result)
    if missing:
        raise ValueError(
            f"OptunaSearch: {where} reported no finite value of {missing[0]!r}, which the "
            f"constraints {constraints.spec!r} bound (it reported {sorted(result)}); "
            "report every constrained metric as a number in every result, or drop that "
            "constraint."
        )
    return dict(zip(constraints.spec, constraints.values(result), strict=True))


def told_value(
    metric: MetricSpec | None, where: str, value: ObjectiveValue | None
) -> dict[str, Any]:
    """``create_trial``'s ``value=`` or, with several metrics, ``values=``; ValueError naming
    ``where`` when a value of several metrics is not one value per metric."""
    if not isinstance(metric, list) or value is None:
        return {"value": value}
    if isinstance(value, Sequence) and len(value) == len(metric or ()):
        return {"values": list(value)}
    raise ValueError(
        f"OptunaSearch: {where} is {value!r}, but it optimises {len(metric or ())} "
        f"metrics, {metric!r}; give a list of one value per metric, in that order."
    )
