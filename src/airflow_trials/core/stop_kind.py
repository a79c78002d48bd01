"""StopKind: why a trial ended TERMINATED, as a value the store keeps in its own column.

The stop reason is the sentence a person reads ("stopped by ASHA at training_iteration=3 (rung 1
of 4): ..."); the kind is what code decides on (the dashboard's "early-stopped", whether a retry
resumes a trial, whether an extension continues it). Whoever ends a trial says its kind; nothing
reads it back from the sentence. The trials store writes it only through its one guarded status
setter (``store/trial_writes.py`` ``change_status``), and only for a TERMINATED trial.

Example::

    kind = StopKind.MAX_T
    assert kind.by_scheduler and not kind.early
"""

from __future__ import annotations

from enum import StrEnum


class StopKind(StrEnum):
    """Why a trial ended TERMINATED.

    FINISHED: its trainable returned (or reported ``done``). CRITERION: it met its stopping
    criterion. SCHEDULER: its scheduler stopped it before its budget was spent (ASHA at a rung, the
    median rule, HyperBand). MAX_T: its scheduler stopped it because it reached ``max_t`` (its
    budget was spent). EXPERIMENT: the experiment ended it (its stopper, its time budget, a
    ``fail_fast`` failure of another trial). AIRFLOW: stopped from Airflow (its task was cleared,
    marked or killed).
    """

    FINISHED = "finished"
    CRITERION = "criterion"
    SCHEDULER = "scheduler"
    MAX_T = "max_t"
    EXPERIMENT = "experiment"
    AIRFLOW = "airflow"

    @property
    def by_scheduler(self) -> bool:
        """Its scheduler stopped it (at a rung or at ``max_t``): that verdict stands, so a retry
        of its task does not resume it and an extension does not continue it."""
        return self in (StopKind.SCHEDULER, StopKind.MAX_T)

    @property
    def early(self) -> bool:
        """Its scheduler stopped it before its budget was spent (the dashboard's
        "early-stopped")."""
        return self is StopKind.SCHEDULER


def stop_kind_or_none(value: str | StopKind | None) -> StopKind | None:
    """The kind a stored or carried value names; None for none (not TERMINATED, or ended before
    kinds were recorded and not told by the backfill)."""
    return None if value is None else StopKind(value)
