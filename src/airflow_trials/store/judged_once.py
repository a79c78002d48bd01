"""JudgedOnce: verdicts on trials' results in the trials store, each made once (ASHA, median)."""

from __future__ import annotations

from typing import Any, Generic, Protocol, TypeVar

from sqlalchemy.orm import Session

from airflow_trials.core.scheduler import Decision
from airflow_trials.store.base import StoreBase
from airflow_trials.store.models import utcnow

R = TypeVar("R")
R_co = TypeVar("R_co", covariant=True)

#: The verdicts a rule may store; pausing is the runner's, never a stored verdict.
VERDICTS = (Decision.CONTINUE, Decision.STOP)


class Judgement(Protocol[R_co]):
    """One result of one trial, as its rule's table records it (a rung, a running mean).

    :class:`JudgedOnce` calls these in one transaction, under the run's scheduler lock:
    :meth:`stored`; if None, :meth:`decide` and then :meth:`write` with the verdict's columns.
    """

    def stored(self, session: Session) -> R_co | None:
        """The record this result has already (``fresh=False``), or None."""

    def decide(self, session: Session) -> tuple[Decision, str | None]:
        """The rule's verdict, from what the table holds of the run's other trials."""

    def write(self, session: Session, verdict: dict[str, Any]) -> R_co:
        """Insert the result's row with the verdict's columns (``decision``, ``reason``,
        ``at_end``, ``created_at``); returns its record (``fresh=True``)."""


class JudgedOnce(Generic[R]):
    """A table of verdicts, one per result of a trial, each made once: what ASHA's rungs
    (``at_trial_rungs``) and the median stopping rule's running means (``at_trial_median_points``)
    share.

    :meth:`record` runs a :class:`Judgement` in the caller's transaction, the one of
    ``record_progress`` that writes the result judged (:class:`~airflow_trials.store.
    scheduler_state.SchedulerState`), which holds the run's scheduler lock (a PostgreSQL advisory
    lock; SQLite serialises writers): each verdict sees every row committed before it. A result
    recorded already (a triggerer restart, a retry processing it again) returns its stored record,
    and nothing is decided again, so the transaction may run twice. (The read side lists a trial's
    records: ``TrialReader.trial_rungs`` and ``trial_median_points``.)

    :param store: the store component whose checks it uses.
    """

    def __init__(self, store: StoreBase) -> None:
        self._store = store

    def record(
        self,
        session: Session,
        experiment_run_id: int,
        trial_id: str,
        judgement: Judgement[R],
        *,
        at_end: bool,
        operation: str,
    ) -> R:
        """The judgement's record: the stored one, or a new one with its fresh verdict."""
        self._store._trial_of_run(session, experiment_run_id, trial_id, operation)
        stored = judgement.stored(session)
        if stored is not None:
            return stored
        decision, reason = judgement.decide(session)
        if decision not in VERDICTS:
            raise ValueError(
                f"Cannot {operation}: decide returned {decision!r}, not CONTINUE or STOP. "
                "Nothing was written."
            )
        verdict = {
            "decision": decision.value,
            "reason": reason,
            "at_end": bool(at_end),
            "created_at": utcnow(),
        }
        return judgement.write(session, verdict)
