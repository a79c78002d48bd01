"""IngestWriter: the trials store's results, checkpoints and batched progress of many trials."""

from __future__ import annotations

import math
import numbers
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import Insert, bindparam, func, select, true
from sqlalchemy.orm import Session

from airflow_trials.core.jsonsafe import json_safe
from airflow_trials.core.result import TIMESTAMP, TRAINING_ITERATION
from airflow_trials.core.status import TrialStatus
from airflow_trials.core.update import TrialUpdate
from airflow_trials.exceptions import StoreError
from airflow_trials.store.base import StoreBase
from airflow_trials.store.engine import (
    safe_url,
)
from airflow_trials.store.leaderboard import (
    leaderboard_query,
)
from airflow_trials.store.models import (
    CheckpointRow,
    ExperimentRow,
    ResultRow,
    TrialRow,
    utcnow,
)
from airflow_trials.store.run_summaries import trials_written
from airflow_trials.store.scheduler_state import Judging, SchedulerState
from airflow_trials.store.trial_best import forget_best, other_mode, update_best
from airflow_trials.store.trial_writes import change_status, end_fields


class IngestWriter(StoreBase):
    """Results and checkpoints as trials report them, one trial or many trials at once."""

    def add_results(self, trial_id: str, results: Sequence[Mapping[str, Any]]) -> int:
        """Store a batch of a trial's results once per iteration; returns how many were new.

        Each result needs an integer ``training_iteration``; ``timestamp`` (seconds since the
        epoch) defaults to now. A result whose iteration is stored already is skipped, so
        writing a batch twice, or from two writers at once, stores it once. Values are made
        JSON-safe first (numpy scalars become numbers, NaN and inf become None: see
        :mod:`~airflow_trials.core.jsonsafe`). When a new result has the highest iteration so
        far, it becomes the trial's ``last_result``. The whole batch is written in one
        transaction, or not at all.

        The count is a report, not a guarantee: when the connection was lost while the batch was
        being committed and the retry finds it stored, the call returns 0 for it.

        :param trial_id: a trial registered with :meth:`upsert_trial`.
        :param results: the result dicts, in any order.
        """
        rows = _result_rows(trial_id, results)
        operation = f"add {len(rows)} results to trial {trial_id}"

        def work(session: Session) -> int:
            new = self._add_results(session, trial_id, rows, operation)
            if new:
                trials_written(session, [session.get_one(TrialRow, trial_id).experiment_run_id])
            return new

        return self._transaction(operation, work)

    def _add_results(
        self,
        session: Session,
        trial_id: str,
        rows: list[dict[str, Any]],
        operation: str,
        goals: dict[int, Any] | None = None,
    ) -> int:
        return self._add_results_of_trials(session, {trial_id: rows}, operation, goals)

    def _add_results_of_trials(
        self,
        session: Session,
        rows: Mapping[str, list[dict[str, Any]]],
        operation: str,
        goals: dict[int, Any] | None = None,
    ) -> int:
        """Add the rows of each trial (each trial's row locked first, in trial_id order) in a
        fixed number of statements, however many trials; returns how many rows were new."""
        # Locking the trials makes concurrent batches of one trial take turns, so the
        # last_result check below sees every result committed before it.
        trials = self._find_all_or_raise(session, list(rows), operation, lock=True)
        with_rows = sorted(trial_id for trial_id, trial_rows in rows.items() if trial_rows)
        if not with_rows:
            return 0
        previous_max: dict[str, int] = dict(
            session.execute(  # type: ignore[arg-type]
                select(ResultRow.trial_id, func.max(ResultRow.iteration))
                .where(ResultRow.trial_id.in_(with_rows))
                .group_by(ResultRow.trial_id)
            ).all()
        )
        table = ResultRow.__table__
        inserted: Insert = (
            self._insert(table)
            .on_conflict_do_nothing(index_elements=[table.c.trial_id, table.c.iteration])
            .returning(table.c.trial_id, table.c.iteration)
        )
        new_iterations: dict[str, set[int]] = {}
        all_rows = [row for trial_id in with_rows for row in rows[trial_id]]
        for trial_id, iteration in session.execute(inserted, all_rows):
            new_iterations.setdefault(trial_id, set()).add(iteration)
        for trial_id, new in new_iterations.items():
            trial, previous = trials[trial_id], previous_max.get(trial_id)
            if previous is None or max(new) > previous:
                newest = max(new)
                trial.last_result = next(
                    row["metrics"] for row in rows[trial_id] if row["iteration"] == newest
                )
                trial.updated_at = utcnow()
            update_best(
                session,
                trial,
                [r for r in rows[trial_id] if r["iteration"] in new],
                had_results=previous is not None,
                goals=goals,
            )
        return sum(map(len, new_iterations.values()))

    def recompute_best(self, experiment_run_id: int) -> int:
        """Recompute every trial's best value of the run's experiment metric from its results, in
        the experiment's mode and in the other, or of each of its several metrics
        (:mod:`~airflow_trials.store.trial_best`).

        Needed only for results loaded around :meth:`add_results` (bulk loads, data from before
        migration 0002) or after the experiment's metric changed. Returns the trials updated.
        """
        operation = f"recompute the best values of experiment run {experiment_run_id}"

        def work(session: Session) -> int:
            run = self._find_run_or_raise(session, experiment_run_id, operation)
            experiment = session.get(ExperimentRow, run.experiment_id)
            if experiment is None or experiment.metric is None:
                return 0
            if experiment.mode is None:
                return self._refold_several(session, experiment_run_id, experiment.metric)
            metric, mode = experiment.metric, experiment.mode
            # The leaderboard's probe in each mode: the best of each trial as add_results keeps it.
            other = {
                r.trial_id: (r.best_value, r.best_iteration)
                for r in session.connection().execute(
                    leaderboard_query(
                        self._dialect, experiment_run_id, metric, other_mode(mode), None
                    )
                )
            }
            rows = [
                {
                    "t": r.trial_id,
                    "m": metric,
                    "o": mode,
                    "v": r.best_value,
                    "i": r.best_iteration,
                    "ov": other[r.trial_id][0],
                    "oi": other[r.trial_id][1],
                }
                for r in session.connection().execute(
                    leaderboard_query(self._dialect, experiment_run_id, metric, mode, None)
                )
            ]
            if rows:
                table = TrialRow.__table__
                session.connection().execute(
                    table.update()
                    .where(table.c.trial_id == bindparam("t"))
                    .values(
                        best_metric=bindparam("m"),
                        best_mode=bindparam("o"),
                        best_value=bindparam("v"),
                        best_iteration=bindparam("i"),
                        other_mode_best_value=bindparam("ov"),
                        other_mode_best_iteration=bindparam("oi"),
                    ),
                    rows,
                )
                trials_written(session, [experiment_run_id])
            return len(rows)

        return self._transaction(operation, work)

    @staticmethod
    def _refold_several(session: Session, experiment_run_id: int, metric: str) -> int:
        """``recompute_best`` for an experiment of several metrics: every result of the run read
        once, in order, and folded into each trial's bests as ``add_results`` folds them."""
        trials = {
            trial.trial_id: trial
            for trial in session.scalars(
                select(TrialRow).where(TrialRow.experiment_run_id == experiment_run_id)
            )
        }
        rows: dict[str, list[dict[str, Any]]] = {}
        for trial_id, iteration, metrics in session.execute(
            select(ResultRow.trial_id, ResultRow.iteration, ResultRow.metrics)
            .join(TrialRow, TrialRow.trial_id == ResultRow.trial_id)
            .where(TrialRow.experiment_run_id == experiment_run_id)
            .order_by(ResultRow.trial_id, ResultRow.iteration)
        ):
            rows.setdefault(trial_id, []).append({"iteration": iteration, "metrics": metrics})
        goals: dict[int, Any] = {}
        for trial in trials.values():
            forget_best(trial, goal=(metric, None))
            update_best(session, trial, rows.get(trial.trial_id, []), False, goals)
        trials_written(session, [experiment_run_id])
        return len(trials)

    # -- progress of many trials at once ---------------------------------------------------

    def record_progress(
        self, batch: Sequence[TrialUpdate], *, judges: Mapping[str, Judging] | None = None
    ) -> int:
        """Write what many trials did since they were last looked at, in one transaction; returns
        how many results were new. The one write of a trial's progress and of its end, on every
        path: the triggerer's poller, the trigger that saw a trial finish, the worker that decided
        a failed trial's fate, and a ``TrialRunner``'s ``TrialsDbCallback``.

        First every trial is locked, in trial_id order (so two batches never deadlock), and
        the results of all of them are inserted as :meth:`add_results` writes them (once per
        iteration), in a few statements for the whole batch. Then per trial: the kept checkpoints
        as :meth:`add_checkpoint` (reviving a deleted row at the same path), the dropped ones as
        :meth:`mark_checkpoint_deleted`, and its status through the guarded setter
        (``change_status``, so an ended trial refuses RUNNING): an end with its error, last
        result, stop reason and the failures its decision counts
        (:meth:`~airflow_trials.core.update.TrialUpdate.recorded_status`). With ``judges``, each
        judged trial's scheduler judges its update in between, after every result is inserted
        and before any status: the verdicts its results produced commit with them
        (:class:`~airflow_trials.store.scheduler_state.SchedulerState`). Last the summaries of
        the runs the trials are in. One trial that cannot be written (unknown, an invalid
        transition, an unknown checkpoint, an ERROR end without its decision) fails the whole
        batch and nothing is written: the caller may then write the trials one by one to find it.

        :param batch: one :class:`~airflow_trials.core.update.TrialUpdate` per trial (a trial at
            most once).
        :param judges: the scheduler of some of the batch's trials, by trial id
            (:class:`~airflow_trials.store.scheduler_state.Judging`); default none.
        """
        items = sorted(batch, key=lambda item: item.trial_id)
        rows = _batch_rows(items, judges)
        statuses = {item.trial_id: item.recorded_status() for item in items}
        operation = (
            f"record the progress of {len(items)} trials ({sum(map(len, rows.values()))} results)"
        )

        def work(session: Session) -> int:
            goals: dict[int, Any] = {}
            # The trials' changed rows are written once, at commit, rather than before each query.
            with session.no_autoflush:
                # Every trial of the batch locked and loaded at once, its results inserted with
                # the others': a few statements per batch rather than a few per trial.
                new = self._add_results_of_trials(session, rows, operation, goals)
                if judges:
                    self._judge(session, items, judges)
                for item in items:
                    self._apply(session, item, statuses[item.trial_id], operation)
            # Last, after every trial's lock (see run_summaries): the runs these trials are in.
            trials_written(
                session,
                [session.get_one(TrialRow, item.trial_id).experiment_run_id for item in items],
            )
            return new

        return self._transaction(operation, work)

    def _judge(
        self, session: Session, items: Sequence[TrialUpdate], judges: Mapping[str, Judging]
    ) -> None:
        """Each judged trial's scheduler on its update, under its run's scheduler lock; the
        trials are locked and loaded already."""
        runs = {session.get_one(TrialRow, trial_id).experiment_run_id for trial_id in judges}
        state = SchedulerState(self._db, session, [run for run in runs if run is not None])
        for item in items:
            judging = judges.get(item.trial_id)
            if judging is not None:
                judging(state, item)

    def _apply(
        self, session: Session, item: TrialUpdate, status: TrialStatus | None, operation: str
    ) -> None:
        """One trial's checkpoints and status, its row locked and loaded already."""
        trial = session.get_one(TrialRow, item.trial_id)  # loaded: no query
        for kept in item.kept_checkpoints:
            self._add_checkpoint(session, item.trial_id, kept.path, kept.iteration, kept.score)
        for path in item.dropped_checkpoints:
            self._mark_checkpoint_deleted(session, item.trial_id, path, operation)
        if status is not None:
            kind = item.stop_kind if status is TrialStatus.TERMINATED else None
            change_status(
                trial,
                status,
                end_fields(item) if item.ended else {},
                cause=item.status_cause(),
                try_number=item.try_number,
                stop_kind=kind,
            )

    # -- checkpoints -----------------------------------------------------------------------

    def add_checkpoint(
        self, trial_id: str, path: str, iteration: int, score: float | None = None
    ) -> None:
        """Record a persisted checkpoint; a second call with the same path changes nothing.

        A path whose row is marked deleted is a new checkpoint written where a dropped one was
        (after a PBT exploit, or a retry from an earlier checkpoint, the trial saves again under
        the same ``checkpoint_<iteration>`` name): its row is revived with this call's
        iteration, score and time. A path whose row is live is left as it is, so a re-sent
        checkpoint changes nothing.

        :param trial_id: the trial.
        :param path: directory or URL of the checkpoint (at most 1024 characters).
        :param iteration: training_iteration it was taken at.
        :param score: score it is ranked by; default None. NaN and inf are stored as None.
        """
        operation = f"add checkpoint {path} of trial {trial_id}"

        def work(session: Session) -> None:
            self._find_or_raise(session, trial_id, operation)
            self._add_checkpoint(session, trial_id, path, iteration, score)

        self._transaction(operation, work)

    def _add_checkpoint(
        self, session: Session, trial_id: str, path: str, iteration: int, score: float | None
    ) -> None:
        table = CheckpointRow.__table__
        inserted = self._insert(table).values(
            trial_id=trial_id,
            path=path,
            iteration=int(iteration),
            score=None if score is None else json_safe(score),
            deleted=False,
            created_at=utcnow(),
        )
        # One statement, so a concurrent mark_checkpoint_deleted sees the row before or after
        # it, never half revived; the WHERE keeps a live row (a re-send) untouched.
        session.execute(
            inserted.on_conflict_do_update(
                index_elements=[table.c.trial_id, table.c.path],
                set_={
                    name: inserted.excluded[name]
                    for name in ("iteration", "score", "deleted", "created_at")
                },
                where=table.c.deleted == true(),
            )
        )

    def mark_checkpoint_deleted(self, trial_id: str, path: str) -> None:
        """Mark a recorded checkpoint as deleted (idempotent); raises StoreError for an unknown
        path."""
        operation = f"mark checkpoint {path} of trial {trial_id} deleted"

        def work(session: Session) -> None:
            self._find_or_raise(session, trial_id, operation)
            self._mark_checkpoint_deleted(session, trial_id, path, operation)

        self._transaction(operation, work)

    def _mark_checkpoint_deleted(
        self, session: Session, trial_id: str, path: str, operation: str
    ) -> None:
        checkpoint = session.execute(
            select(CheckpointRow).where(
                CheckpointRow.trial_id == trial_id, CheckpointRow.path == path
            )
        ).scalar_one_or_none()
        if checkpoint is None:
            raise StoreError(
                f"Cannot {operation}: trial {trial_id} has no checkpoint at {path} in the trial "
                f"store at {safe_url(self._url)}; record it with add_checkpoint first."
            )
        checkpoint.deleted = True


def _batch_rows(
    items: Sequence[TrialUpdate], judges: Mapping[str, Judging] | None
) -> dict[str, list[dict[str, Any]]]:
    """Each trial's result rows, once the batch is known to name each trial once and every
    judged trial (ValueError, nothing written)."""
    rows = {item.trial_id: _result_rows(item.trial_id, item.results) for item in items}
    if len(rows) != len(items):
        twice = sorted(
            trial_id for trial_id, n in Counter(i.trial_id for i in items).items() if n > 1
        )
        raise ValueError(
            f"A progress batch names trials {twice} more than once; nothing was written. "
            "Merge each trial's updates into one TrialUpdate."
        )
    unknown = sorted(set(judges or ()) - rows.keys())
    if unknown:
        raise ValueError(
            f"record_progress was given the schedulers of trials {unknown}, which the batch "
            "does not name; nothing was written. Add an update of each trial judged."
        )
    return rows


def _result_rows(trial_id: str, results: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Validated, JSON-safe rows of a batch: one per iteration (first wins), sorted by iteration."""
    if isinstance(results, Mapping) or not isinstance(results, Sequence):
        raise ValueError(
            f"Results of trial {trial_id} must be a list of result dicts, got "
            f"{type(results).__name__}; "
            f"wrap a single result in a list."
        )
    rows: dict[int, dict[str, Any]] = {}
    now = time.time()
    for position, result in enumerate(results):
        if not isinstance(result, Mapping):
            raise ValueError(
                f"Result {position} of the batch for trial {trial_id} is a "
                f"{type(result).__name__}, "
                f"not a dict; nothing of the batch was written."
            )
        metrics = json_safe(result)
        iteration = metrics.get(TRAINING_ITERATION)
        if isinstance(iteration, bool) or not isinstance(iteration, int):
            raise ValueError(
                f"Result {position} of the batch for trial {trial_id} has no integer "
                f"{TRAINING_ITERATION} (got {result.get(TRAINING_ITERATION)!r}); nothing of the "
                "batch was written. Report results through airflow_trials.report, which numbers "
                "them."
            )
        timestamp = metrics.get(TIMESTAMP)
        if (
            isinstance(timestamp, bool)
            or not isinstance(timestamp, numbers.Real)
            or not math.isfinite(timestamp)
        ):
            timestamp = now
        rows.setdefault(
            iteration,
            {
                "trial_id": trial_id,
                "iteration": iteration,
                "timestamp": float(timestamp),
                "metrics": metrics,
            },
        )
    # Sorted, so concurrent batches of one trial insert keys in the same order.
    return [rows[iteration] for iteration in sorted(rows)]
