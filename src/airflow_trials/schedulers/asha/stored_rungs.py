"""StoredRungs and StoredVectorRungs: one experiment run's rungs in the trials store, as the
states that ASHA's and MOASHA's rules in core/ judge over on the Airflow path.

They work within the transaction of ``record_progress`` that writes the results judged, through
its :class:`~airflow_trials.store.scheduler_state.SchedulerState` (``record_rung``,
``record_vector_rung``, ``trial_rungs``: :mod:`~airflow_trials.store.rungs`). A trial's rungs are
read once and then kept as recorded: ``known`` carries them from one transaction to the next once
it committed (a judge's memory, :mod:`~airflow_trials.schedulers.trial_judge`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Generic, Protocol, TypeVar

from airflow_trials.core.verdicts import RungDecide, RungVerdict, ValueList
from airflow_trials.store.records import RungDecision

__all__ = [
    "KnownRungs",
    "RungsAccess",
    "StoredRungs",
    "StoredVectorRungs",
    "VectorRungsAccess",
]


class _TrialRungsAccess(Protocol):
    def trial_rungs(self, trial_id: str) -> list[RungDecision]: ...


A = TypeVar("A", bound=_TrialRungsAccess)

#: Each trial's rungs as recorded, by trial id: what a judge remembers between transactions.
KnownRungs = dict[str, list[RungDecision]]


class RungsAccess(Protocol):
    """What :class:`StoredRungs` asks of the trials store, within ``record_progress``'s
    transaction (a :class:`~airflow_trials.store.scheduler_state.SchedulerState` has it all)."""

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
    ) -> RungDecision: ...

    def trial_rungs(self, trial_id: str) -> list[RungDecision]: ...

    def rung_values(self, experiment_run_id: int, bracket: int, milestone: float) -> ValueList: ...


class _RunRungs(Generic[A]):
    """One experiment run's rungs in the trials store, each trial's rows read once and then kept
    as this object records them, for one transaction.

    :param store: the scheduler's state in the transaction judging.
    :param experiment_run_id: the run whose trials share the rungs.
    :param known: the trials' rungs as an earlier, committed transaction left them (copied, not
        changed); default none (read from the store).
    """

    def __init__(self, store: A, experiment_run_id: int, known: KnownRungs | None = None) -> None:
        self.store = store
        self.experiment_run_id = experiment_run_id
        self._known = known or {}
        #: Each trial's rungs read or recorded in this transaction: ``known`` once it committed.
        self.trials: KnownRungs = {}

    def trial_rungs(self, trial_id: str) -> list[RungDecision]:
        recorded = self.trials.get(trial_id)
        if recorded is None:
            known = self._known.get(trial_id)
            recorded = list(known) if known is not None else self.store.trial_rungs(trial_id)
            self.trials[trial_id] = recorded
        return recorded

    def _kept(self, trial_id: str, recorded: RungDecision) -> RungDecision:
        if recorded.fresh:
            self.trial_rungs(trial_id).append(recorded)
        return recorded


class StoredRungs(_RunRungs["RungsAccess"]):
    """:class:`~airflow_trials.schedulers.asha.asha_rungs.RungState` of one experiment run in the
    trials store: ASHA's rungs on the Airflow path, one row per trial and rung (:class:`_RunRungs`).

    :param store: the scheduler's state (``record_rung``, ``rung_values``, ``trial_rungs``).
    :param experiment_run_id: the run whose trials share the rungs.
    """

    def record(
        self,
        trial_id: str,
        *,
        bracket: int,
        milestone: float,
        value: float,
        iteration: int,
        at_end: bool,
        decide: RungDecide,
    ) -> RungDecision:
        recorded = self.store.record_rung(
            self.experiment_run_id,
            trial_id,
            bracket=bracket,
            milestone=milestone,
            value=value,
            iteration=iteration,
            at_end=at_end,
            decide=decide,
        )
        return self._kept(trial_id, recorded)

    def rung_values(self, bracket: int, milestone: float) -> ValueList:
        return self.store.rung_values(self.experiment_run_id, bracket, milestone)


class VectorRungsAccess(Protocol):
    """What :class:`StoredVectorRungs` asks of the trials store, within ``record_progress``'s
    transaction (a :class:`~airflow_trials.store.scheduler_state.SchedulerState` has it all)."""

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
    ) -> RungDecision: ...

    def trial_rungs(self, trial_id: str) -> list[RungDecision]: ...

    def rung_vectors(
        self, experiment_run_id: int, bracket: int, milestone: float
    ) -> list[tuple[float, ...]]: ...


class StoredVectorRungs(_RunRungs["VectorRungsAccess"]):
    """:class:`~airflow_trials.schedulers.moasha.moasha_scheduler.VectorRungState` of one experiment
    run in the trials store: MOASHA's rungs, one row per trial and rung (:class:`_RunRungs`).

    :param store: the scheduler's state (``record_vector_rung``, ``rung_vectors``,
        ``trial_rungs``).
    :param experiment_run_id: the run whose trials share the rungs.
    """

    def record(
        self,
        trial_id: str,
        *,
        bracket: int,
        milestone: float,
        values: tuple[float, ...],
        iteration: int,
        at_end: bool,
        decide: Callable[[list[tuple[float, ...]]], RungVerdict],
    ) -> RungDecision:
        recorded = self.store.record_vector_rung(
            self.experiment_run_id,
            trial_id,
            bracket=bracket,
            milestone=milestone,
            values=values,
            iteration=iteration,
            at_end=at_end,
            decide=decide,
        )
        return self._kept(trial_id, recorded)

    def rung_vectors(self, bracket: int, milestone: float) -> list[tuple[float, ...]]:
        return self.store.rung_vectors(self.experiment_run_id, bracket, milestone)
