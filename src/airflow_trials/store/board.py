"""A run's board: the one ranking model every screen reads (:meth:`TrialReader.board
<airflow_trials.store.reader.TrialReader.board>`).

A run and a :class:`~airflow_trials.core.goal.Goal` give one :class:`Board`: every trial with its
place on the ranking (``rank``), its Pareto rank, its values of the goal's metrics, whether it
meets the experiment's constraints, its best and latest checkpoints, and the run's best trial and
front. ``select_best`` (with or without a ``pick``), the history, the CLI's boards, the
dashboard, ``ResultGrid``, warm start, the regression check and the MLflow export read it, so they
name the same best trial and the same front.

- One metric: the trials ranked by their best value (:mod:`~airflow_trials.store.leaderboard`),
  feasible first with constraints (judged on that best result,
  :mod:`~airflow_trials.store.feasibility`), those without a value last, ties by trial id.
- Several metrics: the trials ranked by Pareto rank, then the first metric, placed by their last
  result (:mod:`~airflow_trials.store.pareto_board`).

Which trials count (docs/store.md "Which trials count"): only those that ended TERMINATED have a
Pareto rank (:func:`~airflow_trials.core.constraints.front_ranks`), so only they are on the front
or the best. With one metric, the Pareto rank is the place of the trial's value among the
counted trials' (ties share it; feasible ones first), so the front is the counted trials that
share the best value.

The same read answers a reader's other questions (``ResultGrid``'s), by the same internals:
which statuses count (``counted``: every status, as Ray Tune's ``get_best_result``), which result
is judged with one metric (``judged="last"``: each trial's last result, placed as the board of
several metrics places it, by ``at_trials.last_result``) and which constraints are judged
(``constraints``, instead of the experiment's).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import text
from sqlalchemy.orm import Session

from airflow_trials.core.constraints import COUNTED_STATUSES, Constraints, is_counted
from airflow_trials.core.goal import Goal
from airflow_trials.core.pick import Candidate, Pick
from airflow_trials.core.status import TrialStatus
from airflow_trials.store.feasibility import judged_feasible_first, run_constraints, run_feasibility
from airflow_trials.store.leaderboard import (
    best_leaderboard_query,
    checkpoint_paths,
    leaderboard_query,
    maintained_best_columns,
)
from airflow_trials.store.mapping import leaderboard_rows
from airflow_trials.store.models import ExperimentRunRow
from airflow_trials.store.pareto_board import ParetoBoard, pareto_board, pareto_leaderboard_query
from airflow_trials.store.records import LeaderboardRow


@dataclass(frozen=True)
class BoardRow:
    """One trial on a run's board.

    :param trial_id: the trial.
    :param status: its current status.
    :param num_failures: failures so far.
    :param config: its hyperparameters.
    :param rank: its place on the board, 1 for the first.
    :param pareto_rank: 0 on the front; None when it does not count (docs/store.md "Which trials
        count") or has no value of every metric.
    :param values: its value of each of the goal's metrics: with one metric its best value, with
        several its last result's; None for a metric not reported as a finite number.
    :param iteration: the iteration of those values (the best one's, or the last result's).
    :param best_checkpoint: the kept checkpoint to hand on: with one metric the one whose result
        scored best, with several the newest kept one; None when none is kept.
    :param latest_checkpoint: its newest kept checkpoint; None when none is kept.
    :param feasible: do the judged result's values meet the constraints? None without any.
    :param violations: the constraints it misses, by how much; None without constraints.
    :param stop_kind: how it ended (:class:`~airflow_trials.core.stop_kind.StopKind`'s value,
        the ``at_trials.stop_kind`` column); None while it has not ended TERMINATED.
    """

    trial_id: str
    status: TrialStatus
    num_failures: int
    config: dict[str, Any]
    rank: int
    pareto_rank: int | None
    values: dict[str, float | None]
    iteration: int | None
    best_checkpoint: str | None
    latest_checkpoint: str | None
    feasible: bool | None = None
    violations: dict[str, float | None] | None = None
    stop_kind: str | None = None

    @property
    def counted(self) -> bool:
        """Does it count for the best and the front (ranked: a value of every metric, and a
        status that counts, by default TERMINATED)?"""
        return self.pareto_rank is not None

    @property
    def value(self) -> float | None:
        """Its value of the goal's first metric."""
        return next(iter(self.values.values()), None)


@dataclass(frozen=True)
class Board:
    """A run's board (module docstring).

    :param goal: the goal it ranks by.
    :param rows: the trials in board order, at most the limit asked for.
    :param front_trial_ids: the ids of the counted trials on the front, sorted; all of them,
        whatever the limit.
    :param candidates: the trials a ``pick`` chooses from: the counted ones, only the feasible
        while there is one, by Pareto rank then trial id; whatever the limit.
    :param best_trial_id: the run's best trial, the one ``select_best`` picks without a ``pick``;
        None when no trial counts.
    """

    goal: Goal
    rows: list[BoardRow]
    front_trial_ids: list[str]
    candidates: list[Candidate]
    best_trial_id: str | None

    def choose(self, pick: Pick | None = None) -> Candidate | None:
        """The candidate ``pick`` chooses (default: the best on the first metric); None when
        none is within its bounds, or none counts."""
        if pick is None:
            pick = Pick.of(
                "the board", None, self.goal.metrics, [m or "min" for m in self.goal.modes]
            )
        return pick.choose(self.candidates)

    def row(self, trial_id: str | None) -> BoardRow | None:
        """The row of ``trial_id`` among :attr:`rows`; None when not on it."""
        return next((r for r in self.rows if r.trial_id == trial_id), None)

    @property
    def best(self) -> BoardRow | None:
        """The best trial's row, when it is among :attr:`rows`."""
        return self.row(self.best_trial_id)


#: The result a board of one metric judges each trial by: its best result of the metric
#: (``"best"``, the leaderboard's) or its last result (``"last"``); several metrics: the last.
JUDGED = ("best", "last")


def read_board(
    session: Session,
    dialect: str,
    run: ExperimentRunRow,
    goal: Goal,
    *,
    judged: str = "best",
    counted: Collection[str] = COUNTED_STATUSES,
    constraints: Constraints | None = None,
) -> Board:
    """The whole board of ``run`` by ``goal`` (two or more metrics, or one with its mode).

    :param judged: with one metric, ``"best"`` (default) or ``"last"`` (module docstring).
    :param counted: the statuses that count; default those of "Which trials count".
    :param constraints: judged instead of the experiment's; default the experiment's.
    """
    if len(goal.metrics) > 1 or goal.several or judged == "last":
        modes = [str(m) for m in goal.modes] if len(goal.metrics) > 1 else [goal.mode]
        pareto = pareto_board_in(
            session, dialect, run, list(goal.metrics), modes, None, constraints, counted
        )
        return several_board(goal, pareto)
    ranked = leaderboard_in(session, dialect, run, goal.metric or "", goal.mode, None, constraints)
    return one_board(goal, ranked, counted)


def pareto_board_in(
    session: Session,
    dialect: str,
    run: ExperimentRunRow,
    metrics: list[str],
    modes: list[str],
    limit: int | None,
    constraints: Constraints | None = None,
    counted: Collection[str] = COUNTED_STATUSES,
) -> ParetoBoard:
    """The run's trials ranked by the Pareto front of ``metrics`` in ``modes``
    (:meth:`TrialReader.pareto_leaderboard`), at most ``limit``; ``constraints`` and ``counted``
    as :func:`read_board`'s."""
    if constraints is None:
        constraints = run_constraints(session, run)
    query = pareto_leaderboard_query(dialect, run.id, metrics, constraints.metrics)
    rows = session.connection().execute(query).all()
    return pareto_board(metrics, modes, rows, limit, constraints, counted)


def leaderboard_in(
    session: Session,
    dialect: str,
    run: ExperimentRunRow,
    metric: str,
    mode: str,
    limit: int | None = None,
    constraints: Constraints | None = None,
) -> list[LeaderboardRow]:
    """The run's trials ranked by their best value of ``metric`` in ``mode``, feasible first
    with constraints (:meth:`TrialReader.leaderboard`; ``constraints``: judged instead of the
    experiment's), at most ``limit``."""
    if constraints is None:
        constraints = run_constraints(session, run)
    # With constraints the feasible trials go first, so the cut is made after that.
    cut = None if constraints else limit
    connection = session.connection()
    maintained = maintained_best_columns(session, run, metric, mode)
    if maintained is not None:
        # Every trial's best is maintained for this metric and mode: one row per trial.
        query = best_leaderboard_query(run.id, mode, cut, maintained)
    else:
        query = leaderboard_query(dialect, run.id, metric, mode, cut)
    if dialect == "postgresql":
        # The per-trial probes inflate the cost estimate past jit_above_cost, and compiling the
        # plan then takes longer than running it.
        connection.execute(text("SET LOCAL jit = off"))
    ranked = connection.execute(query).all()
    # The checkpoints in one more query: of the whole run, or of the trials shown.
    which: dict[str, Any] = (
        {"experiment_run_id": run.id} if cut is None else {"trial_ids": [row[0] for row in ranked]}
    )
    checkpoints = {
        trial_id: (best, latest)
        for trial_id, best, latest in connection.execute(
            checkpoint_paths(dialect, metric, mode, **which)
        )
    }
    rows = leaderboard_rows(ranked, checkpoints)
    if not constraints:
        return rows
    checks = run_feasibility(session, dialect, run, constraints, (metric, mode))
    return judged_feasible_first(rows, checks)[:limit]


def one_board(
    goal: Goal, ranked: Sequence[LeaderboardRow], counted: Collection[str] = COUNTED_STATUSES
) -> Board:
    """The board of one metric from its leaderboard (whole, in order); the rows whose status is
    in ``counted`` are ranked."""
    metric = goal.metric or ""
    ranks = _one_metric_ranks(ranked, counted)
    rows = [
        BoardRow(
            trial_id=r.trial_id,
            status=r.status,
            num_failures=r.num_failures,
            config=r.config,
            rank=place,
            pareto_rank=rank,
            values={metric: r.best_value},
            iteration=r.best_iteration,
            best_checkpoint=r.best_checkpoint,
            latest_checkpoint=r.latest_checkpoint,
            feasible=r.feasible,
            violations=r.violations,
            stop_kind=r.stop_kind,
        )
        for place, (r, rank) in enumerate(zip(ranked, ranks, strict=True), start=1)
    ]
    return _finished(goal, rows)


def _one_metric_ranks(
    ranked: Sequence[LeaderboardRow], counted: Collection[str]
) -> list[int | None]:
    """The Pareto rank of each row of a one-metric leaderboard (feasible first, then by value):
    the counted rows with a value, in order, ranked densely by (feasible, value)."""
    ranks: list[int | None] = []
    rank, last = -1, None
    for r in ranked:
        if r.best_value is None or not is_counted(r.status, counted):
            ranks.append(None)
            continue
        key = (r.feasible is not False, r.best_value)
        if key != last:
            rank, last = rank + 1, key
        ranks.append(rank)
    return ranks


def several_board(goal: Goal, board: ParetoBoard) -> Board:
    """The board of several metrics from the Pareto board (whole, in order)."""
    rows = [
        BoardRow(
            trial_id=r.trial_id,
            status=r.status,
            num_failures=r.num_failures,
            config=r.config,
            rank=place,
            pareto_rank=r.pareto_rank,
            values=dict(r.values),
            iteration=r.iteration,
            # No one metric ranks checkpoints: the newest kept one is handed on.
            best_checkpoint=r.latest_checkpoint,
            latest_checkpoint=r.latest_checkpoint,
            feasible=r.feasible,
            violations=r.violations,
            stop_kind=r.stop_kind,
        )
        for place, r in enumerate(board.rows, start=1)
    ]
    return _finished(goal, rows)


def _finished(goal: Goal, rows: list[BoardRow]) -> Board:
    ranked = [r for r in rows if r.counted]
    # Only the feasible ones while there is one (``feasible`` is None without constraints).
    feasible = [r for r in ranked if r.feasible]
    if feasible:
        ranked = feasible
    candidates = sorted(
        (
            Candidate(r.trial_id, {m: float(v) for m, v in r.values.items() if v is not None}, rank)
            for r in ranked
            if (rank := r.pareto_rank) is not None
        ),
        key=lambda c: (c.pareto_rank, c.trial_id),
    )
    board = Board(
        goal=goal,
        rows=rows,
        front_trial_ids=sorted(r.trial_id for r in rows if r.counted and r.pareto_rank == 0),
        candidates=candidates,
        best_trial_id=None,
    )
    chosen = board.choose()
    best = chosen.trial_id if chosen is not None else None
    return Board(goal, rows, board.front_trial_ids, candidates, best)
