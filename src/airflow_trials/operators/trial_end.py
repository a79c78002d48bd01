"""The worker's side of a trial's end, for ``RunTrialOperator.execute_complete``: the failure
decision it records, the state it pushes to XCom, and the error that makes Airflow retry or fail
the task.

Who writes a trial's end (docs/architecture.md, "The write path"): a finished end is its
trigger's (``TrialWatch._ended``), recorded before the trigger fires, and the worker only reads
it; a failed end is the worker's, because only the task knows its retries left
(:func:`~airflow_trials.core.fate.after_failure`). Both go through
``TrialStore.record_progress``, fenced by the Airflow try that writes them.
"""

from __future__ import annotations

from typing import Any, NoReturn

from airflow.sdk.exceptions import AirflowFailException

from airflow_trials.core.end import TrialEnd
from airflow_trials.core.fate import FailureDecision, Outcome
from airflow_trials.core.status import TrialStatus
from airflow_trials.core.update import TrialUpdate
from airflow_trials.exceptions import TrialError


def record_end(
    store: Any, end: TrialEnd, decision: FailureDecision | None, try_number: int, log: Any
) -> TrialStatus:
    """Record a failed end with its ``decision`` (fenced by ``try_number``); a finished end is
    only read: its trigger recorded it before it fired, so that a retry of a task whose worker
    died here finds it. The status the trial has in the store."""
    if decision is not None:
        update = TrialUpdate.of_end(end, decision, try_number=try_number)
        store.record_progress([update])
        record = store.reader.get_trial(end.trial_id)
        if record.status is not update.recorded_status():
            log.warning(
                "Trial %s: this try's (%d) failure decision was not recorded: try %s of its task "
                "took the trial over, and the trials DB holds it %s.",
                end.trial_id,
                try_number,
                record.try_number,
                record.status.value,
            )
        return record.status
    status = store.reader.get_trial(end.trial_id).status
    if status is not TrialStatus.TERMINATED:
        log.warning(
            "Trial %s finished, but the trials DB holds it %s: its end was changed after its "
            "trigger recorded it (an extension, a clear); this task reports the stored status.",
            end.trial_id,
            status.value,
        )
    return status


def end_state(
    end: TrialEnd,
    record: Any,
    status: TrialStatus,
    decision: FailureDecision | None,
    latest_checkpoint: str | None,
) -> dict[str, Any]:
    """What ``execute_complete`` pushes to XCom (key ``trial``) and returns."""
    return {
        "trial_id": end.trial_id,
        "experiment_name": end.experiment_name,
        "config": record.config,
        "status": status.value,
        "last_result": end.last_result,
        "best_checkpoint": end.best_checkpoint or latest_checkpoint,
        "num_failures": record.num_failures if decision is None else decision.num_failures,
        "stop_reason": end.stop_reason,
        "stop_kind": None if end.stop_kind is None else end.stop_kind.value,
        "warm_start": record.warm_start,
    }


def raise_failure(
    end: TrialEnd,
    decision: FailureDecision,
    *,
    can_retry: bool,
    max_failures: int,
    retries: int | None,
    log: Any,
) -> NoReturn:
    """Fail this try: Airflow retries it on RESUME and RETRY, and not at all when the trial
    failed for good (``can_retry``: the task has retries left, which the trial may not).

    A trial lost to infrastructure is resumed by a retry rather than by deferring again in
    this try: a task that defers twice in one try reuses its executor key, and the scheduler
    can take the first deferral's late "success" for the second's and fail the task.
    """
    trial_id = end.trial_id
    if decision.outcome is Outcome.RESUME:
        log.warning("%s %s", end.error, decision.reason)
        raise TrialError(
            f"{end.error} Not a failure of the trial: Airflow retries this task, which "
            "resumes it from its latest checkpoint.",
            trial_id=trial_id,
            infrastructure=True,
        )
    log.error("%s", end.error)
    will_retry = decision.outcome is Outcome.RETRY
    first_line = end.error.splitlines()[0] if end.error else ""
    error = TrialError(
        f"Trial {trial_id} of experiment {end.experiment_name} failed "
        f"(failure {decision.num_failures}, "
        f"{'will retry from its latest checkpoint' if will_retry else 'no retries left'}). "
        f"{first_line}",
        trial_id=trial_id,
        traceback_text=end.error,
    )
    if not will_retry and can_retry:
        raise AirflowFailException(
            f"{error} It reached its max_failures ({max_failures}) before the task's "
            f"retries ({retries})."
        ) from error
    raise error
