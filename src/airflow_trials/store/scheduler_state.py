"""SchedulerState: the schedulers' state of runs in the trials store (ASHA's and MOASHA's rungs,
the median rule's running means), read and written within the one transaction of
``record_progress`` that writes the results judged.

A trial's trigger (``schedulers/trial_judge.py``) hands ``record_progress`` a :class:`Judging` for
its trial; the store calls it after the batch's results are inserted, with this state and the
trial's update. So a result and the scheduler verdict it produced commit together, or neither does::

    def judging(state: SchedulerState, update: TrialUpdate) -> None:
        rungs = StoredRungs(state, run_id)
        verdicts = [asha.judge(rungs, update.trial_id, 0, time=r["training_iteration"],
                               value=r["loss"], iteration=r["training_iteration"])
                    for r in update.results]

    store.record_progress([update], judges={update.trial_id: judging})

The state takes each run's scheduler lock first (a PostgreSQL advisory lock per run, in run id
order, so two batches never deadlock; SQLite serialises writers): each verdict sees every value
committed before it, as in memory. A write that fails transiently runs again whole, judging
included, so a :class:`Judging` keeps what it found apart until the write commits.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

from sqlalchemy import select
from sqlalchemy.orm import Session

from airflow_trials.core.update import TrialUpdate
from airflow_trials.core.verdicts import MedianDecide, RungDecide, RungVerdict, ValueList
from airflow_trials.store.database import Database
from airflow_trials.store.median import MedianStore
from airflow_trials.store.models import ResultRow
from airflow_trials.store.records import MedianPoint, RungDecision
from airflow_trials.store.rungs import RungsStore, rung_values, rung_vectors, trial_rungs_in

__all__ = ["SCHEDULER_LOCK_KEY", "Judging", "SchedulerState", "judge_alone"]

#: The second key of a run's scheduler lock (two-key advisory locks are a key space of their own).
SCHEDULER_LOCK_KEY = zlib.crc32(b"scheduler state") - 2**31

_T = TypeVar("_T")


class Judging(Protocol):
    """A trial's scheduler, called by ``record_progress`` within its transaction, after the
    batch's results are inserted: it judges the trial's ``update`` through ``state``. It may be
    called again for the same write (the transaction runs again after a transient error), so only
    what the committed call found counts."""

    def __call__(self, state: SchedulerState, update: TrialUpdate) -> None: ...


class SchedulerState:
    """The schedulers' state of some runs, in one transaction of ``record_progress``: what
    :class:`~airflow_trials.schedulers.asha.stored_rungs.StoredRungs`,
    :class:`~airflow_trials.schedulers.asha.stored_rungs.StoredVectorRungs` and
    :class:`~airflow_trials.store.median.StoredMeans` read and write.

    :param db: the trials database.
    :param session: the transaction.
    :param experiment_run_ids: the runs whose state it reads and writes; their locks are taken
        now, in run id order.
    """

    def __init__(self, db: Database, session: Session, experiment_run_ids: Iterable[int]) -> None:
        self._db, self._session = db, session
        self._rungs = RungsStore(db)
        self._median = MedianStore(db)
        self._runs = frozenset(experiment_run_ids)
        for run in sorted(self._runs):
            db.lock_run_key(session, run, SCHEDULER_LOCK_KEY)

    def record_rung(
        self,
        experiment_run_id: int,
        trial_id: str,
        *,
        bracket: int,
        milestone: float,
        value: float,
        decide: RungDecide,
        iteration: int | None = None,
        at_end: bool = False,
    ) -> RungDecision:
        """ASHA's verdict on a trial's value at a rung, judged once
        (:meth:`~airflow_trials.store.rungs.RungsStore.record_rung`)."""
        return self._rungs.record_rung(
            self._session,
            self._run(experiment_run_id, trial_id),
            trial_id,
            bracket=bracket,
            milestone=milestone,
            value=value,
            decide=decide,
            iteration=iteration,
            at_end=at_end,
        )

    def record_vector_rung(
        self,
        experiment_run_id: int,
        trial_id: str,
        *,
        bracket: int,
        milestone: float,
        values: Sequence[float],
        decide: Callable[[list[tuple[float, ...]]], RungVerdict],
        iteration: int | None = None,
        at_end: bool = False,
    ) -> RungDecision:
        """MOASHA's verdict on a trial's metric values at a rung, judged once
        (:meth:`~airflow_trials.store.rungs.RungsStore.record_vector_rung`)."""
        return self._rungs.record_vector_rung(
            self._session,
            self._run(experiment_run_id, trial_id),
            trial_id,
            bracket=bracket,
            milestone=milestone,
            values=values,
            decide=decide,
            iteration=iteration,
            at_end=at_end,
        )

    def record_median_point(
        self,
        experiment_run_id: int,
        trial_id: str,
        *,
        iteration: int,
        time: float,
        value: float,
        decide: MedianDecide | None = None,
        at_end: bool = False,
    ) -> MedianPoint:
        """The median rule's verdict on a trial's result, judged once
        (:meth:`~airflow_trials.store.median.MedianStore.record_median_point`)."""
        return self._median.record_median_point(
            self._session,
            self._run(experiment_run_id, trial_id),
            trial_id,
            iteration=iteration,
            time=time,
            value=value,
            decide=decide,
            at_end=at_end,
        )

    def rung_values(self, experiment_run_id: int, bracket: int, milestone: float) -> ValueList:
        """Every value the run's trials recorded at a rung (NaN for NaN)."""
        return rung_values(self._session, self._run(experiment_run_id), bracket, milestone)

    def rung_vectors(
        self, experiment_run_id: int, bracket: int, milestone: float
    ) -> list[tuple[float, ...]]:
        """The metric vectors the run's trials recorded at a rung, in the order recorded."""
        return rung_vectors(self._session, self._run(experiment_run_id), bracket, milestone)

    def trial_rungs(self, trial_id: str) -> list[RungDecision]:
        """The trial's rung records, lowest milestone first."""
        return trial_rungs_in(self._session, trial_id)

    def results_before(self, trial_id: str, iteration: int) -> list[dict[str, Any]]:
        """The trial's stored results before ``iteration``, in iteration order."""
        query = (
            select(ResultRow.metrics)
            .where(ResultRow.trial_id == trial_id, ResultRow.iteration < iteration)
            .order_by(ResultRow.iteration)
        )
        return list(self._session.execute(query).scalars())

    def _run(self, experiment_run_id: int, trial_id: str | None = None) -> int:
        if experiment_run_id not in self._runs:
            if trial_id is not None:  # a trial of another run: say so
                operation = f"judge trial {trial_id} of experiment run {experiment_run_id}"
                self._db.trial_of_run(self._session, experiment_run_id, trial_id, operation)
            raise ValueError(
                f"The scheduler state of this write holds the locks of experiment runs "
                f"{sorted(self._runs)}, not of run {experiment_run_id}: judge a trial of run "
                f"{experiment_run_id} in a write that names one of its trials."
            )
        return experiment_run_id


class _Progress(Protocol):
    def record_progress(
        self, batch: Sequence[TrialUpdate], *, judges: Mapping[str, Judging] | None = None
    ) -> int: ...


def judge_alone(store: _Progress, trial_id: str, work: Callable[[SchedulerState], _T]) -> _T:
    """``work(state)`` in a write of nothing but the trial's scheduler state: what a tool or a
    benchmark uses to record a verdict outside a poll (the write path is ``record_progress``'s
    all the same). Returns what ``work`` returned in the committed transaction."""
    found: list[_T] = []

    def judging(state: SchedulerState, update: TrialUpdate) -> None:
        found[:] = [work(state)]

    store.record_progress([TrialUpdate(trial_id)], judges={trial_id: judging})
    return found[0]
