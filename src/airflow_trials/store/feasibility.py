"""Which trials of a run meet their experiment's constraints (``at_experiments.constraints``).

A trial is feasible when its **last result** meets every constraint
(:meth:`~airflow_trials.core.constraints.Constraints.feasible`), as ``ResultGrid`` and
``OptunaSearch`` judge it. Only the constrained metrics of each last result are read, in SQL, with
the leaderboard's guarded expression (:func:`~airflow_trials.store.leaderboard.metric_value`): a
metric that is missing, not a number, or was NaN or infinite (stored as null) is not reported, so
its constraint is missed. The leaderboards put feasible trials first (:func:`feasible_first`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from sqlalchemy import Float, Select, and_, case, literal, select
from sqlalchemy.orm import Session

from airflow_trials.core.constraints import Constraints
from airflow_trials.store.leaderboard import metric_value
from airflow_trials.store.models import ExperimentRow, ExperimentRunRow, TrialRow
from airflow_trials.store.records import LeaderboardRow, RankedTrial, decode_constraints

_T = TypeVar("_T")
_R = TypeVar("_R", LeaderboardRow, RankedTrial)


@dataclass(frozen=True)
class Feasibility:
    """A trial against its experiment's constraints.

    :param feasible: its last result meets every constraint.
    :param violations: the constraints it misses, each with by how much; None for a constraint
        whose metric its last result does not report as a finite number. Empty when feasible.
    """

    feasible: bool
    violations: dict[str, float | None]


def run_constraints(session: Session, run: ExperimentRunRow) -> Constraints:
    """The constraints of the run's experiment; empty when it has none."""
    experiment = session.get(ExperimentRow, run.experiment_id)
    if experiment is None or not experiment.constraints:
        return Constraints()
    return Constraints.parse(decode_constraints(experiment.constraints), experiment.name)


def constrained_values_query(
    dialect_name: str, experiment_run_id: int, constraints: Constraints
) -> Select[Any]:
    """One row per trial of the run: trial_id, then each constrained metric's value in its last
    result (NULL when not a number), in the order of ``constraints.metrics``."""
    trials = TrialRow.__table__
    return select(
        trials.c.trial_id,
        *(
            metric_value(trials.c.last_result, metric, dialect_name).label(f"c_{i}")
            for i, metric in enumerate(constraints.metrics)
        ),
    ).where(trials.c.experiment_run_id == experiment_run_id)


def feasible_sql(dialect_name: str, last_result: Any, constraints: Constraints) -> Any:
    """1 when the trial's ``last_result`` meets every constraint, else 0, in SQL: as
    :func:`judge` decides it (a metric that is not a finite number misses its constraint; ``v -
    bound > 0`` is a miss, which for finite floats is ``v > bound``)."""
    met = []
    for constraint in constraints:
        value = metric_value(last_result, constraint.metric, dialect_name)
        bound = literal(constraint.bound, Float())
        met.append(value <= bound if constraint.op == "<=" else value >= bound)
    # A NULL comparison (metric not reported) is no match, so it falls to the ELSE.
    return case((and_(*met), 1), else_=0)


def run_feasibility(
    session: Session, dialect_name: str, run: ExperimentRunRow, constraints: Constraints
) -> dict[str, Feasibility]:
    """Each trial of the run (by id) against ``constraints``."""
    query = constrained_values_query(dialect_name, run.id, constraints)
    return {
        row[0]: judge(constraints, constraints.metrics, row[1:]) for row in session.execute(query)
    }


def judge(constraints: Constraints, metrics: Sequence[str], values: Sequence[Any]) -> Feasibility:
    """A trial whose last result reports ``values`` (one per name of ``metrics``; None: not a
    number) against ``constraints``."""
    result = {m: float(v) for m, v in zip(metrics, values, strict=True) if v is not None}
    violations = constraints.violations(result)
    return Feasibility(
        feasible=not violations,
        violations={k: (None if math.isinf(v) else v) for k, v in violations.items()},
    )


def feasible_first(items: Sequence[_T], feasible: Callable[[_T], bool]) -> list[_T]:
    """``items`` with the feasible ones first, each group in its order (a stable partition)."""
    return [i for i in items if feasible(i)] + [i for i in items if not feasible(i)]


def judged_feasible_first(rows: Sequence[_R], checks: Mapping[str, Feasibility]) -> list[_R]:
    """Leaderboard rows (records with ``trial_id``, ``feasible`` and ``violations``) in their
    order, each with its check from ``checks``, feasible rows first."""
    judged = [
        replace(r, feasible=checks[r.trial_id].feasible, violations=checks[r.trial_id].violations)
        for r in rows
    ]
    return feasible_first(judged, lambda r: bool(r.feasible))


def constraints_json(constraints: Constraints) -> str | None:
    """How ``at_experiments.constraints`` stores them: a JSON list, NULL for none."""
    return json.dumps(constraints.spec) if constraints else None
