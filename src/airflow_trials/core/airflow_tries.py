"""Airflow's try arithmetic, for a trial's task: is this try the first after a clear, and does a
retry follow if it fails? Pure: the operator passes the task instance's numbers in."""

from __future__ import annotations


def first_try_after_a_clear(try_number: int, max_tries: int, retries: int) -> bool:
    """Is this the first try of a task instance that was cleared after an earlier try ran?

    Clearing gives a task instance a fresh retry budget (``max_tries = try_number + retries``),
    so its first try after the clear is ``max_tries - retries + 1``, as Airflow's own
    ``get_first_reschedule_date`` counts; a retry after a failure comes later than that.
    """
    return try_number > 1 and try_number == max_tries - retries + 1


def retries_left(try_number: int, retries: int) -> bool:
    """Does Airflow run the task again if this try fails (``try_number`` <= its ``retries``)?"""
    return try_number <= retries
