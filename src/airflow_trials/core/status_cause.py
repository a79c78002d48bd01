"""StatusCause: why a trial's stored status last changed, as a value.

The store's one status setter (``store/trial_writes.py`` ``change_status``) takes one with every
change and keeps it on the trial's row (``status_cause``, migration 0018), so that "why is this
trial ERROR?" has an answer beside the status: a failure decision (its error and failure count
say more), a trial abandoned by its run, or a stop from Airflow. The dashboard's trial JSON and
``TrialReader.get_trial`` show it.

Example::

    change_status(row, TrialStatus.RUNNING, {}, cause=StatusCause.PLACED)
    StatusCause.of_transition(Transition.STOPPED)   # StatusCause.STOP_FROM_AIRFLOW
"""

from __future__ import annotations

from enum import StrEnum

from airflow_trials.core.fate import Transition


class StatusCause(StrEnum):
    """Why a trial's status changed; each names the one path that makes such a change."""

    REGISTERED = "registered"  # its first registration: PENDING
    QUEUED = "queued"  # waiting for Ray to place it: PENDING
    PLACED = "placed"  # Ray placed its actor, which trains: RUNNING
    PROGRESS = "progress"  # its poll reported it training: RUNNING (a runner's resume too)
    PAUSED = "paused"  # its scheduler paused it (PBT): PAUSED
    END = "end"  # it finished, or a criterion or a scheduler stopped it: TERMINATED
    FAILURE_DECISION = "failure_decision"  # it failed: ERROR for good, or PENDING for a retry
    STOP_FROM_AIRFLOW = "stop_from_airflow"  # its task was cleared, marked or killed: TERMINATED
    ABANDONED = "abandoned"  # its task ended for good without recording its end: ERROR
    CLEARED = "cleared"  # its task was cleared: PENDING, with a fresh budget of failures
    RESTART = "restart"  # cleared after it ended: PENDING, its results deleted
    EXTENSION = "extension"  # its finished run was extended: PENDING, to go on

    @classmethod
    def of_transition(cls, transition: Transition) -> StatusCause:
        """The cause a plain :class:`~airflow_trials.core.fate.Transition` records."""
        return _OF_TRANSITION[Transition(transition)]


_OF_TRANSITION = {
    Transition.QUEUED: StatusCause.QUEUED,
    Transition.PLACED: StatusCause.PLACED,
    Transition.RESET: StatusCause.CLEARED,
    Transition.STOPPED: StatusCause.STOP_FROM_AIRFLOW,
    Transition.ABANDONED: StatusCause.ABANDONED,
}
