"""StoredRungs and StoredVectorRungs: one experiment run's rungs in the trials store, as the
states that ASHA's and MOASHA's rules in core/ judge over on the Airflow path.

They read each trial's rungs once through the store's reader and record through its
``record_rung`` and ``record_vector_rung`` (:mod:`~airflow_trials.store.rungs`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Generic, Protocol, TypeVar

from airflow_trials.core.rung_math import RungDecide, RungVerdict, ValueList
from airflow_trials.store.records import RungDecision

__all__ = ["RungsAccess", "StoredRungs", "StoredVectorRungs", "VectorRungsAccess"]


class _TrialRungsAccess(Protocol):
    def trial_rungs(self, trial_id: str) -> list[RungDecision]: ...


class _ReaderAccess(Protocol):
    @property
    def reader(self) -> _TrialRungsAccess: ...


A = TypeVar("A", bound=_ReaderAccess)


class RungsAccess(Protocol):
    """What :class:`StoredRungs` asks of the trials store (a ``TrialStore`` has it all)."""

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

    @property
    def reader(self) -> _TrialRungsAccess: ...

    def rung_values(self, experiment_run_id: int, bracket: int, milestone: float) -> ValueList: ...


class _RunRungs(Generic[A]):
    """One experiment run's rungs in the trials store, each trial's rows read once and then kept
    as this object records them: for one trigger's life (one trial), or for one process judging
    every trial of the run.

    :param store: the trials store.
    :param experiment_run_id: the run whose trials share the rungs.
    """

    def __init__(self, store: A, experiment_run_id: int) -> None:
        self.store = store
        self.experiment_run_id = experiment_run_id
        self._trials: dict[str, list[RungDecision]] = {}

    def trial_rungs(self, trial_id: str) -> list[RungDecision]:
        recorded = self._trials.get(trial_id)
        if recorded is None:
            recorded = self._trials[trial_id] = list(self.store.reader.trial_rungs(trial_id))
        return recorded

    def _kept(self, trial_id: str, recorded: RungDecision) -> RungDecision:
        if recorded.fresh:
            self.trial_rungs(trial_id).append(recorded)
        return recorded


class StoredRungs(_RunRungs["RungsAccess"]):
    """:class:`~airflow_trials.core.rungs.RungState` of one experiment run in the trials store:
    ASHA's rungs on the Airflow path, one row per trial and rung (:class:`_RunRungs`).

    :param store: the trials store (``record_rung``, ``rung_values``, ``reader.trial_rungs``).
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
    """What :class:`StoredVectorRungs` asks of the trials store (a ``TrialStore`` has it all)."""

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

    @property
    def reader(self) -> _TrialRungsAccess: ...

    def rung_vectors(
        self, experiment_run_id: int, bracket: int, milestone: float
    ) -> list[tuple[float, ...]]: ...


class StoredVectorRungs(_RunRungs["VectorRungsAccess"]):
    """:class:`~airflow_trials.core.moasha.VectorRungState` of one experiment run in the trials
    store: MOASHA's rungs, one row per trial and rung (:class:`_RunRungs`).

    :param store: the trials store (``record_vector_rung``, ``rung_vectors``,
        ``reader.trial_rungs``).
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
