"""TrialEnd and SweepEnd: the one end event of a trial, and of a sweep, watched from Airflow.

The trigger yields a TrialEnd (as plain values) when the trial it watches ends or is lost, and the
operator's ``execute_complete`` reads it back; an end the store already holds (a trigger that ran
again after its actor was freed, a retry of a task whose trial had finished) is the same type.
What the store then records is decided by :func:`airflow_trials.core.fate.status_after_end`.

Example::

    end = TrialEnd.lost("t-1", "mnist", "its Ray actor is gone", infrastructure=True)
    payload = end.to_event()                # what TriggerEvent carries
    assert TrialEnd.from_event(payload) == end

A sweep's trigger yields a :class:`SweepEnd` the same way, and ``RunSweepOperator.execute_complete``
reads it back.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any

from airflow_trials.core.status import TrialStatus
from airflow_trials.core.stop_kind import StopKind, stop_kind_or_none


@dataclass(frozen=True)
class TrialEnd:
    """How a trial's watch ended.

    :param trial_id: the trial.
    :param experiment_name: its experiment.
    :param status: TERMINATED (it finished, or a stop ended it) or ERROR (it failed or was lost).
    :param error: what went wrong, for ERROR; default None.
    :param last_result: its last result (scalars); default None.
    :param best_checkpoint: path of its best kept checkpoint; default None.
    :param num_results: results the actor held; default None (not known, e.g. a stored end).
    :param infrastructure: lost with its node or its Ray cluster, not through its own code;
        default False.
    :param released: its actor and placement group were already freed; default False.
    :param stop_reason: why it ended TERMINATED, as the path that stopped it said it, e.g.
        ``"it met its stopping criterion"`` or ``"stopped by ASHA at training_iteration=3 (rung 1
        of 4): ..."``; default None (not known, or it did not end TERMINATED).
    :param stop_kind: why it ended TERMINATED, as a value
        (:class:`~airflow_trials.core.stop_kind.StopKind`); default None (not known, or it did not
        end TERMINATED).
    """

    trial_id: str
    experiment_name: str
    status: TrialStatus
    error: str | None = None
    last_result: dict[str, Any] | None = field(default=None, hash=False)
    best_checkpoint: str | None = None
    num_results: int | None = None
    infrastructure: bool = False
    released: bool = False
    stop_reason: str | None = None
    stop_kind: StopKind | None = None

    def __post_init__(self) -> None:
        if not TrialStatus(self.status).is_terminal():
            raise ValueError(
                f"The end of trial {self.trial_id} must be TERMINATED or ERROR, not {self.status}; "
                "a trial that has not ended has no end event."
            )
        object.__setattr__(self, "status", TrialStatus(self.status))
        object.__setattr__(self, "stop_kind", stop_kind_or_none(self.stop_kind))

    @property
    def finished(self) -> bool:
        """It ended TERMINATED."""
        return self.status is TrialStatus.TERMINATED

    @classmethod
    def lost(
        cls,
        trial_id: str,
        experiment_name: str,
        why: str,
        *,
        infrastructure: bool = False,
        released: bool = False,
    ) -> TrialEnd:
        """The ERROR end of a trial whose actor is gone, or that its watcher had to stop."""
        return cls(
            trial_id=trial_id,
            experiment_name=experiment_name,
            status=TrialStatus.ERROR,
            error=f"Trial {trial_id} of experiment {experiment_name} failed: {why}.",
            num_results=0,
            infrastructure=infrastructure,
            released=released,
        )

    @classmethod
    def stored(
        cls,
        trial_id: str,
        experiment_name: str,
        last_result: Mapping[str, Any] | None,
        best_checkpoint: str | None,
        *,
        stop_reason: str | None = None,
        stop_kind: StopKind | None = None,
    ) -> TrialEnd:
        """The TERMINATED end the store holds for a trial whose actor is already gone (its stored
        ``stop_reason`` and ``stop_kind`` too, where the store has them)."""
        return cls(
            trial_id=trial_id,
            experiment_name=experiment_name,
            status=TrialStatus.TERMINATED,
            last_result=dict(last_result) if last_result else None,
            best_checkpoint=best_checkpoint,
            released=True,
            stop_reason=stop_reason,
            stop_kind=stop_kind,
        )

    def to_event(self) -> dict[str, Any]:
        """Plain values for a TriggerEvent (it is serialized into Airflow's DB)."""
        payload = asdict(self)
        payload["status"] = self.status.value
        payload["stop_kind"] = None if self.stop_kind is None else self.stop_kind.value
        return payload

    @classmethod
    def from_event(cls, payload: Mapping[str, Any]) -> TrialEnd:
        """The end a TriggerEvent carried; also reads events of triggers from before this type
        (a checkpoint given as a dict, keys missing)."""
        return cls(
            trial_id=payload["trial_id"],
            experiment_name=payload["experiment_name"],
            status=TrialStatus(payload["status"]),
            error=payload.get("error"),
            last_result=payload.get("last_result") or None,
            best_checkpoint=_path(payload.get("best_checkpoint")),
            num_results=payload.get("num_results"),
            infrastructure=bool(payload.get("infrastructure")),
            released=bool(payload.get("released")),
            stop_reason=payload.get("stop_reason"),
            stop_kind=payload.get("stop_kind"),
        )


def _path(checkpoint: Any) -> str | None:
    """A checkpoint path, from a path or a checkpoint record's dict."""
    if isinstance(checkpoint, Mapping):
        return str(checkpoint["path"])
    return None if checkpoint is None else str(checkpoint)


class SweepStatus(StrEnum):
    """How a sweep's watch ended: the run ended (``finished``), its driver failed (``error``), or
    the driver is gone with the run unfinished (``lost``: its Ray head restarted, its node died,
    or it was killed)."""

    FINISHED = "finished"
    ERROR = "error"
    LOST = "lost"


@dataclass(frozen=True)
class SweepEnd:
    """How a sweep's watch ended.

    :param run_key: the experiment run's key (its Airflow run id).
    :param status: FINISHED, ERROR or LOST.
    :param progress: the driver's last progress snapshot
        (:meth:`~airflow_trials.core.sweep_progress.SweepProgress.snapshot`); default None (not
        read: the driver was gone).
    :param error: what went wrong, for ERROR and LOST; default None.
    """

    run_key: str
    status: SweepStatus
    progress: dict[str, Any] | None = field(default=None, hash=False)
    error: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "status", SweepStatus(self.status))

    @property
    def finished(self) -> bool:
        """The run ended (its driver did not fail)."""
        return self.status is SweepStatus.FINISHED

    @classmethod
    def from_snapshot(cls, run_key: str, snapshot: Mapping[str, Any]) -> SweepEnd:
        """The end a driver's final progress reports (``finished``, with ``error`` if it failed)."""
        error = snapshot.get("error")
        status = SweepStatus.ERROR if error else SweepStatus.FINISHED
        return cls(run_key, status, dict(snapshot), error)

    @classmethod
    def lost(cls, experiment_name: str, run_key: str, why: str) -> SweepEnd:
        """The LOST end of a run whose driver is gone or could not be reached: ``why`` completes
        "The sweep driver of run ... of experiment ...", and says what the next try does."""
        return cls(
            run_key,
            SweepStatus.LOST,
            error=f"The sweep driver of run {run_key} of experiment {experiment_name} {why}",
        )

    def to_event(self) -> dict[str, Any]:
        """Plain values for a TriggerEvent (it is serialized into Airflow's DB)."""
        return {
            "status": self.status.value,
            "run_key": self.run_key,
            "progress": self.progress,
            "error": self.error,
        }

    @classmethod
    def from_event(cls, payload: Mapping[str, Any]) -> SweepEnd:
        """The end a TriggerEvent carried."""
        progress = payload.get("progress")
        return cls(
            payload["run_key"],
            SweepStatus(payload["status"]),
            dict(progress) if progress is not None else None,
            payload.get("error"),
        )
