"""The schedulers' state in the trials DB, written as production writes it: within
``record_progress`` (store/scheduler_state.py), one write per call.

- :class:`OneWriteEach` is the store as a rule's stored state sees it (``StoredRungs``,
  ``StoredVectorRungs``, ``StoredMeans``): each record in a write of its own, reads through the
  reader.
- :func:`judge` and :func:`judge_end` run a trigger's judge (``schedulers/trial_judge.py``) as its
  poller does, in a write of the trial.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from airflow_trials.core.update import TrialUpdate
from airflow_trials.schedulers.trial_judge import Judge, Verdict
from airflow_trials.store import TrialStore
from airflow_trials.store.records import MedianPoint, RungDecision
from airflow_trials.store.scheduler_state import SchedulerState, judge_alone


class OneWriteEach:
    """The trials store's scheduler state, each record written by a ``record_progress`` of its
    trial (:func:`~airflow_trials.store.scheduler_state.judge_alone`)."""

    def __init__(self, store: TrialStore) -> None:
        self.store = store

    def record_rung(self, experiment_run_id: int, trial_id: str, **rung: Any) -> RungDecision:
        return judge_alone(
            self.store, trial_id, lambda s: s.record_rung(experiment_run_id, trial_id, **rung)
        )

    def record_vector_rung(
        self, experiment_run_id: int, trial_id: str, **rung: Any
    ) -> RungDecision:
        return judge_alone(
            self.store,
            trial_id,
            lambda s: s.record_vector_rung(experiment_run_id, trial_id, **rung),
        )

    def record_median_point(
        self, experiment_run_id: int, trial_id: str, **point: Any
    ) -> MedianPoint:
        return judge_alone(
            self.store,
            trial_id,
            lambda s: s.record_median_point(experiment_run_id, trial_id, **point),
        )

    def rung_values(self, experiment_run_id: int, bracket: int, milestone: float) -> Any:
        return self.store.reader.rung_values(experiment_run_id, bracket, milestone)

    def rung_vectors(
        self, experiment_run_id: int, bracket: int, milestone: float
    ) -> list[tuple[float, ...]]:
        return self.store.reader.rung_vectors(experiment_run_id, bracket, milestone)

    def trial_rungs(self, trial_id: str) -> list[RungDecision]:
        return self.store.reader.trial_rungs(trial_id)


def judge(store: TrialStore, judge_: Judge, results: Sequence[Mapping[str, Any]]) -> Verdict | None:
    """The judge's first STOP among ``results``, judged in a write of its trial (the results
    themselves are not written: the test seeds them, or not); raises the result it could not
    judge (MissingSchedulerKey), as the trigger then ends the trial."""
    call = judge_.call()

    def judging(state: SchedulerState, update: TrialUpdate) -> None:
        call(state, TrialUpdate(update.trial_id, results=results))

    store.record_progress([TrialUpdate(judge_.trial_id)], judges={judge_.trial_id: judging})
    found = call.settle()
    if found.error is not None:
        raise found.error
    return found.stop


def judge_end(store: TrialStore, judge_: Judge, last_result: Mapping[str, Any] | None) -> None:
    """The finished trial's last value recorded by its judge, as its end's write does."""
    call = judge_.ending(last_result)
    store.record_progress([TrialUpdate(judge_.trial_id)], judges={judge_.trial_id: call})
    call.settle()


def write_judged(
    store: TrialStore, judge_: Judge, results: Sequence[Mapping[str, Any]]
) -> Verdict | None:
    """The trial's ``results`` written with its judge's verdicts on them in one transaction, as
    the triggerer's poller writes a poll; the first STOP (raises what it could not judge)."""
    call = judge_.call()
    update = TrialUpdate(judge_.trial_id, results=results)
    store.record_progress([update], judges={judge_.trial_id: call})
    found = call.settle()
    if found.error is not None:
        raise found.error
    return found.stop
