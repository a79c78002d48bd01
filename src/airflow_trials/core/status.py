"""Trial statuses and the one guarded transition table every status change goes through."""

from __future__ import annotations

from enum import StrEnum

from airflow_trials.exceptions import InvalidTransitionError


class TrialStatus(StrEnum):
    """Lifecycle of a trial, as in Ray Tune.

    PENDING: waiting for resources. RUNNING: its actor trains. PAUSED: checkpointed and
    its resources released. TERMINATED: finished normally or stopped. ERROR: failed for good.
    """

    PENDING = "PENDING"
    RUNNING = "RUNNING"
    PAUSED = "PAUSED"
    TERMINATED = "TERMINATED"
    ERROR = "ERROR"

    def is_terminal(self) -> bool:
        return self in (TrialStatus.TERMINATED, TrialStatus.ERROR)


# A terminal trial may go back to PENDING: that is how errored trials are re-run on resume and
# how a finished trial is restarted explicitly. Everything else not listed is a bug in the caller.
_ALLOWED: dict[TrialStatus, frozenset[TrialStatus]] = {
    TrialStatus.PENDING: frozenset(
        {TrialStatus.RUNNING, TrialStatus.PAUSED, TrialStatus.TERMINATED, TrialStatus.ERROR}
    ),
    TrialStatus.RUNNING: frozenset(
        {TrialStatus.PENDING, TrialStatus.PAUSED, TrialStatus.TERMINATED, TrialStatus.ERROR}
    ),
    TrialStatus.PAUSED: frozenset(
        {TrialStatus.PENDING, TrialStatus.RUNNING, TrialStatus.TERMINATED, TrialStatus.ERROR}
    ),
    TrialStatus.TERMINATED: frozenset({TrialStatus.PENDING}),
    TrialStatus.ERROR: frozenset({TrialStatus.PENDING, TrialStatus.TERMINATED}),
}


def check_transition(trial_id: str, current: TrialStatus, new: TrialStatus) -> None:
    """Raise InvalidTransitionError unless ``current -> new`` is allowed (same status is a
    no-op)."""
    if current == new or new in _ALLOWED[current]:
        return
    allowed = ", ".join(sorted(s.value for s in _ALLOWED[current]))
    raise InvalidTransitionError(
        f"Trial {trial_id} cannot go from {current.value} to {new.value}; "
        f"from {current.value} it may only go to {allowed}."
    )
