"""The leaderboard of an experiment with several metrics: its trials ordered by Pareto rank.

One metric ranks trials by their best value (:mod:`airflow_trials.store.leaderboard`). Several
have no single best: a trial's best value of one metric need not come from the same result as its
best of another. So each trial is placed by its **last result** (``at_trials.last_result``), as
``ResultGrid.get_pareto_front`` places it, and the trials are ordered by:

1. Pareto rank (:func:`~airflow_trials.core.pareto.pareto_ranks`): 0 for the front, the trials
   no other trial beats on every metric; 1 for the front once those are removed; and so on;
2. then, within a rank, the first metric in its mode (lowest first for ``"min"``, highest first
   for ``"max"``);
3. then trial id.

With constraints (``at_experiments.constraints``), the feasible trials are ranked first
(:func:`~airflow_trials.core.constraints.constrained_ranks`, as ``ResultGrid`` ranks them): rank
0 is the front of the feasible trials, and the infeasible trials' ranks follow the last feasible
one (:mod:`airflow_trials.store.feasibility`).

Only the trials that count have a Pareto rank (:func:`~airflow_trials.core.constraints.front_ranks`:
those that ended TERMINATED, docs/store.md "Which trials count"), so the front is the one
``select_best`` picks from. A trial that does not count, or has no rankable value of every metric
(it reported none yet, or one is missing, or was NaN or infinite, which the trials DB stores as
null), has no Pareto rank and comes last, by trial id, as trials without the metric do on a
one-metric leaderboard. Each metric's value is read in
SQL with the one-metric leaderboard's guarded expression
(:func:`~airflow_trials.store.leaderboard.metric_value`), so a string under a metric's key counts
as not reported there too.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Select, Text, cast, select

from airflow_trials.core.constraints import COUNTED_STATUSES, Constraints, front_ranks
from airflow_trials.core.pareto import check_several
from airflow_trials.core.status import TrialStatus
from airflow_trials.store.feasibility import Feasibility, judge
from airflow_trials.store.leaderboard import check_metric, latest_checkpoint_path, metric_value
from airflow_trials.store.models import TrialRow

_STATUSES = {status.value: status for status in TrialStatus}


@dataclass(frozen=True)
class ParetoRow:
    """One trial's line on the leaderboard of several metrics.

    :param trial_id: the trial.
    :param status: its current status.
    :param num_failures: failures so far.
    :param config: its hyperparameters.
    :param values: each metric's value in its last result, in the board's metric order; None
        for a metric it has not reported as a finite number.
    :param iteration: ``training_iteration`` of its last result; None before its first result.
    :param pareto_rank: 0 on the front, k on the front once the ranks below k are removed; None
        when it does not count (it did not end TERMINATED) or has no rankable value of every
        metric (it then comes last).
    :param on_front: ``pareto_rank == 0``.
    :param latest_checkpoint: path of its newest kept checkpoint (no one score picks a best
        checkpoint among several metrics); None when none is kept.
    :param feasible: does its last result meet the experiment's constraints? None when the
        experiment has none. Default None.
    :param violations: with constraints, those it misses, each with by how much (None: not
        reported as a finite number); None without constraints.
    :param stop_kind: how it ended (:class:`~airflow_trials.core.stop_kind.StopKind`'s value);
        None while it has not ended TERMINATED.
    """

    trial_id: str
    status: TrialStatus
    num_failures: int
    config: dict[str, Any]
    values: dict[str, float | None]
    iteration: int | None
    pareto_rank: int | None
    on_front: bool
    latest_checkpoint: str | None
    feasible: bool | None = None
    violations: dict[str, float | None] | None = None
    stop_kind: str | None = None


@dataclass(frozen=True)
class ParetoBoard:
    """A run's leaderboard of several metrics (:meth:`TrialReader.pareto_leaderboard`).

    :param metrics: the metrics, in the experiment's order (the first is the tie-break).
    :param modes: ``"min"`` or ``"max"``, one per metric.
    :param rows: the trials in leaderboard order (module docstring), at most the limit asked for.
    :param front_trial_ids: the ids of the run's trials on the front (Pareto rank 0), sorted;
        all of them, whatever the limit.
    :param constraints: the experiment's constraints, canonical; default none.
    """

    metrics: list[str]
    modes: list[str]
    rows: list[ParetoRow]
    front_trial_ids: list[str]
    constraints: list[str] = field(default_factory=list)


def check_board_metrics(
    metrics: Sequence[str], modes: Sequence[str]
) -> tuple[list[str], list[str]]:
    """The metrics and modes of a leaderboard of several metrics, checked as the experiment's
    (:func:`~airflow_trials.core.pareto.check_several`) and as result keys the trials DB can
    read (:func:`~airflow_trials.store.leaderboard.check_metric`).

    :raises ValueError: naming the metrics, what is wrong and how to write them instead.
    """
    names, checked_modes = check_several("The leaderboard", metrics, modes)
    for name in names:
        check_metric(name)
    return names, checked_modes


def pareto_leaderboard_query(
    dialect_name: str,
    experiment_run_id: int,
    metrics: Sequence[str],
    constrained: Sequence[str] = (),
) -> Select[Any]:
    """One row per trial of the run, unordered (ranking needs every row; it is done in Python).

    Columns: trial_id, status, num_failures, config (JSON text), iteration (of the last result,
    as a float), latest_checkpoint_path, stop_kind, then one value per metric (NULL when not a
    number), then one per ``constrained`` metric (the metrics the experiment's constraints
    bound).
    """
    trials = TrialRow.__table__
    last = trials.c.last_result
    return select(
        trials.c.trial_id,
        trials.c.status,
        trials.c.num_failures,
        # As JSON text, decoded here: psycopg's JSONB loader costs twice what json.loads does.
        cast(trials.c.config, Text).label("config"),
        metric_value(last, "training_iteration", dialect_name).label("iteration"),
        latest_checkpoint_path().label("latest_checkpoint_path"),
        trials.c.stop_kind,
        *(
            metric_value(last, metric, dialect_name).label(f"value_{i}")
            for i, metric in enumerate(metrics)
        ),
        *(
            metric_value(last, metric, dialect_name).label(f"constrained_{i}")
            for i, metric in enumerate(constrained)
        ),
    ).where(trials.c.experiment_run_id == experiment_run_id)


def pareto_board(
    metrics: list[str],
    modes: list[str],
    rows: Sequence[Sequence[Any]],
    limit: int | None,
    constraints: Constraints | None = None,
    counted: Collection[str] = COUNTED_STATUSES,
    finite_only: bool = True,
) -> ParetoBoard:
    """The board from the rows of :func:`pareto_leaderboard_query` (with ``constraints``, read
    with their metrics as ``constrained``): ranked (the trials whose status is in ``counted``,
    default those that count; an infinite value only without ``finite_only``, which the trials
    DB, storing none, never needs), ordered, cut."""
    constraints = constraints or Constraints()
    end = 7 + len(metrics)
    values = [[_number(v) for v in row[7:end]] for row in rows]
    checks: list[Feasibility | None] = [
        judge(constraints, constraints.metrics, row[end:]) if constraints else None for row in rows
    ]
    feasible = [bool(check and check.feasible) for check in checks] if constraints else None
    statuses = [row[1] for row in rows]
    ranks = front_ranks(values, modes, statuses, feasible, counted=counted, finite_only=finite_only)
    sign = 1.0 if modes[0] == "min" else -1.0

    def place(i: int) -> tuple[bool, int, float, str]:
        rank, first = ranks[i], values[i][0]
        if rank is None or first is None:  # a ranked row has every value
            return True, 0, 0.0, rows[i][0]
        return False, rank, sign * first, rows[i][0]

    ordered = sorted(range(len(rows)), key=place)
    board = [
        ParetoRow(
            trial_id=rows[i][0],
            status=_STATUSES[rows[i][1]],
            num_failures=rows[i][2],
            config=json.loads(rows[i][3]),
            values=dict(zip(metrics, values[i], strict=True)),
            iteration=None if rows[i][4] is None else int(rows[i][4]),
            pareto_rank=ranks[i],
            on_front=ranks[i] == 0,
            latest_checkpoint=rows[i][5],
            stop_kind=rows[i][6],
            **_feasibility_fields(checks[i]),
        )
        for i in (ordered if limit is None else ordered[:limit])
    ]
    front_trial_ids = sorted(rows[i][0] for i in range(len(rows)) if ranks[i] == 0)
    return ParetoBoard(
        metrics=metrics,
        modes=modes,
        rows=board,
        front_trial_ids=front_trial_ids,
        constraints=constraints.spec,
    )


def _feasibility_fields(check: Feasibility | None) -> dict[str, Any]:
    if check is None:
        return {}
    return {"feasible": check.feasible, "violations": check.violations}


def _number(value: Any) -> float | None:
    return None if value is None else float(value)
