"""What a trial task finds when it starts: the trial's live actor, a clear, a trial already finished."""

from __future__ import annotations

from typing import Any, cast

from airflow_trials.core.fate import stopped_by_scheduler
from airflow_trials.core.status import TrialStatus
from airflow_trials.core.trial import Trial

# How long execute waits for a live trial's actor to say its status before the try fails.
ATTACH_TIMEOUT_SECONDS = 60.0


def live_actor(executor: Any, experiment: str, trial_id: str) -> tuple[Any, str | None]:
    """The trial's actor on Ray and what it says of itself (QUEUED while it waits for resources),
    or (None, None) when there is none or it died as we attached (the previous try's trigger,
    cancelled because the task was cleared, stopped it)."""
    import ray
    from ray.exceptions import RayActorError

    actor = executor.attach(experiment, trial_id)
    if actor is None:
        return None, None
    if not executor.is_placed(actor):
        return actor, "QUEUED"  # it starts its trial when Ray places it
    try:
        snapshot = cast(dict[str, Any], ray.get(actor.poll.remote(10**9), timeout=ATTACH_TIMEOUT_SECONDS))
    except RayActorError:
        return None, None
    return actor, snapshot["status"]


def first_try_after_a_clear(ti: Any, retries: int) -> bool:
    """Is this the first try of a task instance that was cleared after an earlier try ran?

    Clearing gives a task instance a fresh retry budget (``max_tries = try_number + retries``),
    so its first try after the clear is ``max_tries - retries + 1``, as Airflow's own
    ``get_first_reschedule_date`` counts; a retry after a failure comes later than that.
    """
    return bool(ti.try_number > 1 and ti.try_number == ti.max_tries - retries + 1)


def finished_in_store(trial: Trial, record: Any) -> bool:
    """Did the stored trial end TERMINATED having met its stopping criterion, or stopped by its
    scheduler (its stop reason says why)?"""
    if record.status != TrialStatus.TERMINATED or not record.last_result:
        return False
    if stopped_by_scheduler(record.stop_reason):
        return True
    try:
        return trial.should_stop(record.last_result)
    except KeyError:  # the criterion names a metric the stored result lacks
        return False
