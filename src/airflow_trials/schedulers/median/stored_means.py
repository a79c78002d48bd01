"""StoredMeans: the median stopping rule's running means of one experiment run in the trials DB,
the state :class:`~airflow_trials.schedulers.median.median_rule.MedianRule` judges over on the
Airflow path.

It works within the transaction of ``record_progress`` that writes the results judged, through its
:class:`~airflow_trials.store.scheduler_state.SchedulerState` (``record_median_point``, whose SQL
is :mod:`airflow_trials.store.median`)."""

from __future__ import annotations

from typing import Protocol

from airflow_trials.core.verdicts import MedianDecide
from airflow_trials.store.records import MedianPoint

__all__ = ["MeansAccess", "StoredMeans"]


class MeansAccess(Protocol):
    """What :class:`StoredMeans` asks of the trials store, within ``record_progress``'s
    transaction (a :class:`~airflow_trials.store.scheduler_state.SchedulerState` has it)."""

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
    ) -> MedianPoint: ...


class StoredMeans:
    """:class:`~airflow_trials.schedulers.median.median_rule.MedianState` of one experiment run in
    the trials store: the median rule's running means on the Airflow path.

    :param store: the scheduler's state in the transaction judging (``record_median_point``).
    :param experiment_run_id: the run whose trials the rule compares.
    """

    def __init__(self, store: MeansAccess, experiment_run_id: int) -> None:
        self.store = store
        self.experiment_run_id = experiment_run_id

    def record(
        self,
        trial_id: str,
        *,
        iteration: int,
        time: float,
        value: float,
        decide: MedianDecide | None = None,
        at_end: bool = False,
    ) -> MedianPoint:
        return self.store.record_median_point(
            self.experiment_run_id,
            trial_id,
            iteration=iteration,
            time=time,
            value=value,
            decide=decide,
            at_end=at_end,
        )
