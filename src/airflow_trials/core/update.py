"""TrialUpdate: what one trial did since it was last looked at, the one typed value that crosses
processes on its way to the trials store.

A trial's actor answers each poll with one (``TrialActor.poll``); the triggerer's poller (and the
:class:`~airflow_trials.TrialsDbCallback` of a ``TrialRunner``) narrows it to what the store lacks
(:meth:`~airflow_trials.execution.polls.TrialProgressTracker.progress`) and hands a batch of them
to ``TrialStore.record_progress``, which writes the batch in one transaction. An end travels in it
too (:meth:`TrialUpdate.ended`), with the failure decision that makes a failed end ERROR or
PENDING.

Example::

    update = TrialUpdate("t-1", results=({"training_iteration": 1, "loss": 0.5},),
                         kept_checkpoints=(KeptCheckpoint("/ck/t-1/1", 1, 0.5),),
                         status=TrialStatus.RUNNING)
    store.record_progress([update])

Plain values only (numbers, strings, lists and dicts of them), so that it pickles across Ray.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from airflow_trials.core.end import TrialEnd
from airflow_trials.core.fate import FailureDecision, status_after_end
from airflow_trials.core.status import TrialStatus
from airflow_trials.core.status_cause import StatusCause
from airflow_trials.core.stop_kind import StopKind, stop_kind_or_none


@dataclass(frozen=True)
class KeptCheckpoint:
    """A checkpoint the trial keeps.

    :param path: directory or URL of the checkpoint.
    :param iteration: ``training_iteration`` it was taken at.
    :param score: what it is ranked by; None when it has no score.
    """

    path: str
    iteration: int
    score: float | None = None


@dataclass(frozen=True)
class TrialUpdate:
    """What one trial did since it was last looked at.

    Written by the store (``record_progress``): ``results``, ``kept_checkpoints`` (a path the
    store holds already is left as it is), ``dropped_checkpoints`` (marked deleted) and
    ``status``: RUNNING through the guarded setter, or an end (TERMINATED, or ERROR with
    ``failure``, the decision that makes it ERROR or PENDING) with ``error``, ``last_result`` and
    ``stop_reason``. The other fields are for the trial's watcher: never stored.

    :param trial_id: the trial.
    :param status: what the trial is now; default None (the store leaves it as it is).
    :param results: its new result dicts; default none.
    :param kept_checkpoints: the checkpoints it keeps; default none.
    :param dropped_checkpoints: paths of recorded checkpoints it dropped; default none.
    :param checkpoints_version: the version of its kept set (the actor's checkpoint manager's);
        default None.
    :param num_results: results the actor holds in all; default None (not known).
    :param last_result: its last result (scalars); default None.
    :param best_checkpoint: path of its best kept checkpoint; default None.
    :param error: what went wrong, for ERROR; default None.
    :param infrastructure: it failed with its node or its Ray cluster; default False.
    :param stop_reason: why it ended TERMINATED; default None.
    :param stop_kind: the kind of that end (``core/stop_kind.py``); default None.
    :param failure: with an ERROR end, what happens next (``core.fate.after_failure``); default
        None, which the store refuses for an ERROR status.
    :param try_number: the Airflow try of the trial's task that sends it (its trigger's, or its
        worker's); the store writes its status only while no later try registered the trial
        (the setter's try fence). Default None: not sent by a try (a runner, a shared poll).
    :param held_at: the iteration whose verdict the actor waits for; default None (not held).
    :param pid: the actor's process id; default None.
    :param output: each stream's new output since the offsets asked (``{"stdout": chunk}``);
        default None.
    :param log_files: where the trial's stdout and stderr are saved; default none.
    :param log_error: why they could not be saved; default None.
    """

    trial_id: str
    status: TrialStatus | None = None
    results: Sequence[Mapping[str, Any]] = ()
    kept_checkpoints: Sequence[KeptCheckpoint] = ()
    dropped_checkpoints: Sequence[str] = ()
    checkpoints_version: int | None = None
    num_results: int | None = None
    last_result: Mapping[str, Any] | None = field(default=None, hash=False)
    best_checkpoint: str | None = None
    error: str | None = None
    infrastructure: bool = False
    stop_reason: str | None = None
    stop_kind: StopKind | None = None
    failure: FailureDecision | None = None
    try_number: int | None = None
    held_at: int | None = None
    pid: int | None = None
    output: Mapping[str, Any] | None = field(default=None, hash=False)
    log_files: Mapping[str, str] = field(default_factory=dict, hash=False)
    log_error: str | None = None

    def __post_init__(self) -> None:
        if self.status is not None:
            object.__setattr__(self, "status", TrialStatus(self.status))
        object.__setattr__(self, "stop_kind", stop_kind_or_none(self.stop_kind))

    @property
    def ended(self) -> bool:
        """It carries the trial's end (a terminal status)."""
        return self.status is not None and self.status.is_terminal()

    @property
    def writes(self) -> bool:
        """The store has something to write for it."""
        return bool(
            self.results or self.kept_checkpoints or self.dropped_checkpoints or self.status
        )

    def recorded_status(self) -> TrialStatus | None:
        """The status the store records for it: ``status``, or for an end the one
        :func:`~airflow_trials.core.fate.status_after_end` gives with ``failure``."""
        if not self.ended:
            return self.status
        return status_after_end(self.end("", released=True), self.failure)

    def status_cause(self) -> StatusCause | None:
        """Why its status changes (:class:`~airflow_trials.core.status_cause.StatusCause`): END
        for a finished end, FAILURE_DECISION for a failed one, PAUSED, or PROGRESS for RUNNING;
        None without a status."""
        if self.status is None:
            return None
        if self.status is TrialStatus.TERMINATED:
            return StatusCause.END
        if self.ended:
            return StatusCause.FAILURE_DECISION
        return StatusCause.PAUSED if self.status is TrialStatus.PAUSED else StatusCause.PROGRESS

    @classmethod
    def of_end(
        cls,
        end: TrialEnd,
        failure: FailureDecision | None = None,
        *,
        try_number: int | None = None,
    ) -> TrialUpdate:
        """The update that records ``end``; ``failure`` decides a failed end (ERROR or PENDING),
        ``try_number`` is the try that records it (fenced by a later one)."""
        return cls(
            end.trial_id,
            status=end.status,
            last_result=end.last_result,
            best_checkpoint=end.best_checkpoint,
            num_results=end.num_results,
            error=end.error,
            infrastructure=end.infrastructure,
            stop_reason=end.stop_reason if end.finished else None,
            stop_kind=end.stop_kind if end.finished else None,
            failure=failure,
            try_number=try_number,
        )

    def end(self, experiment_name: str, *, released: bool) -> TrialEnd:
        """The end this update reports (its status must be terminal)."""
        if self.status is None or not self.ended:
            raise ValueError(
                f"Trial {self.trial_id} is {self.status}: an update has an end only with "
                "TERMINATED or ERROR."
            )
        return TrialEnd(
            trial_id=self.trial_id,
            experiment_name=experiment_name,
            status=self.status,
            error=self.error,
            last_result=dict(self.last_result) if self.last_result else None,
            best_checkpoint=self.best_checkpoint,
            num_results=self.num_results,
            infrastructure=self.infrastructure,
            released=released,
            stop_reason=self.stop_reason if self.status is TrialStatus.TERMINATED else None,
            stop_kind=self.stop_kind if self.status is TrialStatus.TERMINATED else None,
        )
