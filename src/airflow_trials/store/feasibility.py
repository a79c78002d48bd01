"""Which trials of a run meet their experiment's constraints (``at_experiments.constraints``).

A trial is judged on **the result whose value is ranked and handed on**: with one metric, its
best result of that metric (the leaderboard's best iteration, whose value and checkpoint
``select_best`` publishes); a trial with no value of the metric, on its last result. (With
several metrics each trial is placed by its last result, so that is the one judged:
:mod:`~airflow_trials.store.pareto_board`.) It is feasible when that result meets every
constraint (:meth:`~airflow_trials.core.constraints.Constraints.feasible`). Only the constrained
metrics of the judged result are read, in SQL, with the leaderboard's guarded expression
(:func:`~airflow_trials.store.leaderboard.metric_value`): a metric that is missing, not a number,
or was NaN or infinite (stored as null) is not reported, so its constraint is missed. The
leaderboards put feasible trials first (:func:`feasible_first`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from sqlalchemy import ColumnElement, Float, and_, case, literal, select
from sqlalchemy.orm import Session

from airflow_trials.core.constraints import Constraints
from airflow_trials.store.leaderboard import best_source, maintained_best_columns, metric_value
from airflow_trials.store.models import ExperimentRow, ExperimentRunRow, ResultRow, TrialRow
from airflow_trials.store.records import LeaderboardRow, RankedTrial, decode_constraints

_T = TypeVar("_T")
_R = TypeVar("_R", LeaderboardRow, RankedTrial)
# Each trial's judged result: the one at its best iteration of the ranked metric.
_JUDGED = ResultRow.__table__.alias("judged")


@dataclass(frozen=True)
class Feasibility:
    """A trial against its experiment's constraints.

    :param feasible: its judged result (module docstring) meets every constraint.
    :param violations: the constraints it misses, each with by how much; None for a constraint
        whose metric its judged result does not report as a finite number. Empty when feasible.
    """

    feasible: bool
    violations: dict[str, float | None]


def run_constraints(session: Session, run: ExperimentRunRow) -> Constraints:
    """The constraints of the run's experiment; empty when it has none."""
    experiment = session.get(ExperimentRow, run.experiment_id)
    if experiment is None or not experiment.constraints:
        return Constraints()
    return Constraints.parse(decode_constraints(experiment.constraints), experiment.name)


def judged_join(source: Any, iteration: ColumnElement[Any]) -> Any:
    """``source`` (a FROM holding ``at_trials``) with each trial's judged result joined: its
    result at ``iteration`` (its best iteration of the ranked metric; none when NULL)."""
    trials = TrialRow.__table__
    return source.outerjoin(
        _JUDGED,
        and_(_JUDGED.c.trial_id == trials.c.trial_id, _JUDGED.c.iteration == iteration),
    )


def judged_value(dialect_name: str, iteration: ColumnElement[Any], metric: str) -> Any:
    """``metric``'s value in the trial's judged result (NULL when not a number), over
    :func:`judged_join`: the result at ``iteration``, or its last result when ``iteration`` is
    NULL (the trial has no value of the ranked metric)."""
    last = TrialRow.__table__.c.last_result
    return case(
        (iteration.is_(None), metric_value(last, metric, dialect_name)),
        else_=metric_value(_JUDGED.c.metrics, metric, dialect_name),
    )


def feasible_sql(dialect_name: str, constraints: Constraints, iteration: ColumnElement[Any]) -> Any:
    """1 when the trial's judged result (:func:`judged_value`, over :func:`judged_join`) meets
    every constraint, else 0, in SQL: as :func:`judge` decides it (a metric that is not a finite
    number misses its constraint; ``v - bound > 0`` is a miss, which for finite floats is
    ``v > bound``)."""
    met = []
    for constraint in constraints:
        value = judged_value(dialect_name, iteration, constraint.metric)
        bound = literal(constraint.bound, Float())
        met.append(value <= bound if constraint.op == "<=" else value >= bound)
    # A NULL comparison (metric not reported) is no match, so it falls to the ELSE.
    return case((and_(*met), 1), else_=0)


def run_feasibility(
    session: Session,
    dialect_name: str,
    run: ExperimentRunRow,
    constraints: Constraints,
    ranked: tuple[str, str],
) -> dict[str, Feasibility]:
    """Each trial of the run (by id) against ``constraints``, judged on its best result of
    ``ranked`` (metric, mode): the result whose value the leaderboard ranks and hands on."""
    metric, mode = ranked
    maintained = maintained_best_columns(session, run, metric, mode)
    source, _, iteration = best_source(dialect_name, run.id, metric, mode, maintained)
    query = (
        select(
            TrialRow.__table__.c.trial_id,
            *(
                judged_value(dialect_name, iteration, name).label(f"c_{i}")
                for i, name in enumerate(constraints.metrics)
            ),
        )
        .select_from(judged_join(source, iteration))
        .where(TrialRow.__table__.c.experiment_run_id == run.id)
    )
    return {
        row[0]: judge(constraints, constraints.metrics, row[1:]) for row in session.execute(query)
    }


def judge(constraints: Constraints, metrics: Sequence[str], values: Sequence[Any]) -> Feasibility:
    """A trial whose judged result reports ``values`` (one per name of ``metrics``; None: not a
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
