"""The ranking reads of :class:`~airflow_trials.store.reader.TrialReader`: the run's board
(:mod:`~airflow_trials.store.board`, the one ranking model), and the views of its internals that
page or narrow it (the one-metric leaderboard, the Pareto board, a page of the ranking in SQL,
the best checkpoints)."""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import replace
from typing import TypeVar

from sqlalchemy import text
from sqlalchemy.orm import Session

from airflow_trials.core.constraints import COUNTED_STATUSES, Constraints
from airflow_trials.core.goal import Goal
from airflow_trials.store.board import JUDGED, Board, leaderboard_in, pareto_board_in, read_board
from airflow_trials.store.database import Database
from airflow_trials.store.feasibility import run_constraints
from airflow_trials.store.leaderboard import (
    check_metric,
    check_mode,
    checkpoint_paths,
    maintained_best_columns,
)
from airflow_trials.store.pareto_board import ParetoBoard, check_board_metrics
from airflow_trials.store.ranked_page import RankedPage, check_page_order, ranked_page
from airflow_trials.store.records import LeaderboardRow

_T = TypeVar("_T")


class RankingReads:
    """The ranking reads :class:`~airflow_trials.store.reader.TrialReader` inherits."""

    _db: Database

    def _read(self, operation: str, work: Callable[[Session], _T]) -> _T:
        return self._db.transaction(operation, work, write=False)

    def leaderboard(
        self, experiment_run_id: int, metric: str, mode: str = "min", limit: int | None = None
    ) -> list[LeaderboardRow]:
        """Trials of a run ranked by their best value of ``metric``, computed in SQL.

        One row per trial: best value (lowest for ``"min"``, highest for ``"max"``) over its
        results, the first iteration that reached it, its best checkpoint (the kept one whose
        iteration scored best on ``metric``) and its latest kept checkpoint. Trials that
        never reported the metric as a number come last, then ties by trial_id. With the
        experiment's constraints (``ensure_experiment(constraints=...)``), each row says whether
        the trial's last result meets them (``feasible``, ``violations``) and every feasible trial
        ranks above every infeasible one, each group in that order. Fast with the
        metric's index (``ExperimentWriter.ensure_metric_index``, made by
        ``ensure_experiment(metric=...)``).

        :param experiment_run_id: the run.
        :param metric: key of the metric in the results.
        :param mode: ``"min"`` (default) or ``"max"``.
        :param limit: at most this many rows; default all.
        """
        check_mode(mode)
        check_metric(metric)
        if limit is not None and limit < 1:
            raise ValueError(f"limit must be at least 1 or None, got {limit}.")
        operation = f"rank the trials of experiment run {experiment_run_id} by {mode} {metric}"

        def work(session: Session) -> list[LeaderboardRow]:
            run = self._db.find_run(session, experiment_run_id, operation)
            return leaderboard_in(session, self._db.dialect, run, metric, mode, limit)

        return self._read(operation, work)

    def board(
        self,
        experiment_run_id: int,
        goal: Goal,
        limit: int | None = None,
        *,
        judged: str = "best",
        counted: Collection[str] = COUNTED_STATUSES,
        constraints: Constraints | None = None,
    ) -> Board:
        """The run's board by ``goal``: the one ranking every screen reads
        (:mod:`~airflow_trials.store.board`). Each trial's rank, Pareto rank, values, feasibility
        and checkpoints; the run's front and best trial (select_best's), whatever the limit.

        The defaults ask select_best's question; a reader may ask another of the same ranking
        (``ResultGrid``'s), answered in SQL by the same internals.

        :param experiment_run_id: the run.
        :param goal: the metrics and modes to rank by: the experiment's (``.goal`` of
            :meth:`get_experiment`), or a reader's choice of it (:meth:`Goal.pick`).
        :param limit: at most this many rows; default all. The front and best count every trial.
        :param judged: with one metric, each trial's ``"best"`` result of it (default) or its
            ``"last"`` result; several metrics judge the last result only.
        :param counted: the statuses of the trials that count for the best and the front;
            default TERMINATED (docs/store.md "Which trials count"); ``EVERY_STATUS``: all.
        :param constraints: judged instead of the experiment's; default the experiment's.
        :raises ValueError: the goal has no metric, or one that cannot be ranked by, or
            ``judged`` is not ``"best"`` or ``"last"``.
        """
        if not goal.metrics:
            raise ValueError(
                f"Experiment run {experiment_run_id} has no metric to rank by; record one "
                "(ensure_experiment(metric=..., mode=...)) or pass one (--metric/--mode)."
            )
        several = len(goal.metrics) > 1 or goal.several
        if judged not in JUDGED:
            raise ValueError(f"judged must be 'best' or 'last', got {judged!r}.")
        if several:
            check_board_metrics(goal.metrics, [str(m) for m in goal.modes])
        else:
            check_mode(goal.mode)
            check_metric(goal.metrics[0])
        if limit is not None and limit < 1:
            raise ValueError(f"limit must be at least 1 or None, got {limit}.")
        operation = f"rank the trials of experiment run {experiment_run_id} by {goal.describe()}"

        def work(session: Session) -> Board:
            run = self._db.find_run(session, experiment_run_id, operation)
            board = read_board(
                session,
                self._db.dialect,
                run,
                goal,
                judged=judged,
                counted=counted,
                constraints=constraints,
            )
            return board if limit is None else replace(board, rows=board.rows[:limit])

        return self._read(operation, work)

    def ranked_page(
        self,
        experiment_run_id: int,
        metric: str,
        mode: str = "min",
        *,
        sort: str = "metric",
        descending: bool = False,
        stopped: str = "all",
        offset: int = 0,
        limit: int = 50,
        leaders: int = 20,
        front: bool = False,
    ) -> RankedPage:
        """One page of the run's ranking, ranked, filtered, sorted and sliced in SQL
        (:mod:`~airflow_trials.store.ranked_page`): the page's trials, each with its rank in the
        whole ranking of :meth:`leaderboard` (feasible trials first with constraints), the
        filter's total, the run's status counts and the ids of its first ``leaders`` trials
        with a value. Only the page's rows and the leaders are read out; no config.

        :param sort: ``"metric"`` (default; descending reverses the trials with a value, those
            without stay last), ``"trial_id"``, ``"status"`` or ``"failures"``.
        :param descending: reverse the sort; default False.
        :param stopped: ``"all"`` (default), ``"early"`` (the trials their scheduler stopped
            early) or ``"not_early"``.
        :param offset: trials of the sorted, filtered ranking to skip; default 0.
        :param limit: at most this many rows; default 50.
        :param leaders: how many of the first trials give the leaders; default 20.
        :param front: read the run's front too (``front_trial_ids``: the board's with one metric,
            whatever the page); default False.
        """
        _check_page_request(mode, metric, sort, stopped, offset, limit, leaders)
        operation = (
            f"read a page of the trials of experiment run {experiment_run_id} by {mode} {metric}"
        )
        dialect = self._db.dialect

        # One attempt, as the other batch reads of pages: the page is asked for again.
        with self._db.session_scope(operation, write=False) as session:
            run = self._db.find_run(session, experiment_run_id, operation)
            if dialect == "postgresql":
                # A window over every trial inflates the cost estimate past jit_above_cost, and
                # compiling the plan then takes longer than running it.
                session.connection().execute(text("SET LOCAL jit = off"))
            return ranked_page(
                session,
                dialect,
                experiment_run_id,
                metric,
                mode,
                maintained_best_columns(session, run, metric, mode),
                run_constraints(session, run),
                sort=sort,
                descending=descending,
                stopped=stopped,
                offset=offset,
                limit=limit,
                leaders=leaders,
                front=front,
            )

    def pareto_leaderboard(
        self,
        experiment_run_id: int,
        metrics: Sequence[str],
        modes: Sequence[str],
        limit: int | None = None,
    ) -> ParetoBoard:
        """Trials of a run ranked by several metrics at once: by Pareto rank (0 = the front),
        then by the first metric in its mode, then by trial id; trials without a rankable value
        of every metric last, by trial id (:mod:`~airflow_trials.store.pareto_board`).

        Each trial is placed by its last result, as ``ResultGrid.get_pareto_front`` places it:
        the board's front is the trials that method returns. The values are read in SQL (one row
        per trial, no result scanned) and ranked in Python.

        :param experiment_run_id: the run.
        :param metrics: two or more result keys (one is a list of one), e.g.
            ``["val_acc", "latency"]``; the first is the tie-break within a rank.
        :param modes: ``"min"`` or ``"max"``, one per metric, e.g. ``["max", "min"]``.
        :param limit: at most this many rows; default all. The front counts every trial.
        """
        names, checked_modes = check_board_metrics(metrics, modes)
        if limit is not None and limit < 1:
            raise ValueError(f"limit must be at least 1 or None, got {limit}.")
        goals = ", ".join(f"{mode} {name}" for name, mode in zip(names, checked_modes, strict=True))
        operation = (
            f"rank the trials of experiment run {experiment_run_id} by the Pareto front of {goals}"
        )

        def work(session: Session) -> ParetoBoard:
            run = self._db.find_run(session, experiment_run_id, operation)
            return pareto_board_in(session, self._db.dialect, run, names, checked_modes, limit)

        return self._read(operation, work)

    def best_checkpoint_paths(
        self, trial_ids: Sequence[str], metric: str, mode: str
    ) -> dict[str, str]:
        """The path of each trial's best checkpoint, as :meth:`leaderboard` gives it
        (:func:`~airflow_trials.store.leaderboard.checkpoint_paths`); trials with none left
        out."""
        check_mode(mode)
        check_metric(metric)
        if not trial_ids:
            return {}
        query = checkpoint_paths(self._db.dialect, metric, mode, trial_ids=trial_ids)

        def work(session: Session) -> dict[str, str]:
            return {trial_id: best for trial_id, best, _ in session.execute(query)}

        return self._read(f"read the best checkpoints of {len(trial_ids)} trials", work)


def _check_page_request(
    mode: str, metric: str, sort: str, stopped: str, offset: int, limit: int, leaders: int
) -> None:
    """ValueError for a page of the ranking that cannot be asked for."""
    check_mode(mode)
    check_metric(metric)
    check_page_order(sort, stopped)
    if offset < 0 or limit < 1 or leaders < 1:
        raise ValueError(
            f"offset must be >= 0, limit and leaders >= 1, got {offset}, {limit}, {leaders}."
        )
