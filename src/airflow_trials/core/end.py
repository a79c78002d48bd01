"""TrialEnd: the one end event of a trial watched from Airflow, built here and nowhere else.

The trigger yields it (as plain values) when the trial it watches ends or is lost, and the
operator's ``execute_complete`` reads it back; an end the store already holds (a trigger that ran
again after its actor was freed, a retry of a task whose trial had finished) is the same type.
What the store then records is decided by :func:`airflow_trials.core.fate.status_after_end`.

Example::

    end = TrialEnd.lost("t-1", "mnist", "its Ray actor is gone", infrastructure=True)
    payload = end.to_event()                # what TriggerEvent carries
    assert TrialEnd.from_event(payload) == end
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from airflow_trials.core.status import TrialStatus


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

    def __post_init__(self) -> None:
        if not TrialStatus(self.status).is_terminal():
            raise ValueError(
                f"The end of trial {self.trial_id} must be TERMINATED or ERROR, not {self.status}; "
                "a trial that has not ended has no end event."
            )
        object.__setattr__(self, "status", TrialStatus(self.status))

    @property
    def finished(self) -> bool:
        """It ended TERMINATED."""
        return self.status is TrialStatus.TERMINATED

    @classmethod
    def from_snapshot(cls, experiment_name: str, snapshot: Mapping[str, Any], *, released: bool) -> TrialEnd:
        """The end a trial actor's final poll reports (``TrialActor.poll``)."""
        return cls(
            trial_id=snapshot["trial_id"],
            experiment_name=experiment_name,
            status=TrialStatus(snapshot["status"]),
            error=snapshot.get("error"),
            last_result=dict(snapshot["last_result"]) if snapshot.get("last_result") else None,
            best_checkpoint=_path(snapshot.get("best_checkpoint")),
            num_results=snapshot.get("num_results"),
            infrastructure=bool(snapshot.get("infrastructure")),
            released=released,
            stop_reason=snapshot.get("stop_reason"),
        )

    @classmethod
    def lost(
        cls, trial_id: str, experiment_name: str, why: str, *, infrastructure: bool = False, released: bool = False
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
    ) -> TrialEnd:
        """The TERMINATED end the store holds for a trial whose actor is already gone (its stored
        ``stop_reason`` too, where the store has one)."""
        return cls(
            trial_id=trial_id,
            experiment_name=experiment_name,
            status=TrialStatus.TERMINATED,
            last_result=dict(last_result) if last_result else None,
            best_checkpoint=best_checkpoint,
            released=True,
            stop_reason=stop_reason,
        )

    def to_event(self) -> dict[str, Any]:
        """Plain values for a TriggerEvent (it is serialized into Airflow's DB)."""
        payload = asdict(self)
        payload["status"] = self.status.value
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
        )


def _path(checkpoint: Any) -> str | None:
    """A checkpoint path, from a path or a checkpoint record's dict."""
    if isinstance(checkpoint, Mapping):
        return str(checkpoint["path"])
    return None if checkpoint is None else str(checkpoint)
