"""TrialError from a Ray failure: the remote traceback, what died, and whether the cluster is to
blame."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from ray.exceptions import RayActorError, RayTaskError

from airflow_trials.core.trial import Trial
from airflow_trials.exceptions import TrialError
from airflow_trials.execution.ray_state import actor_info_by_id

log = logging.getLogger(__name__)


def trial_error(trial: Trial, error: Exception, doing: str = "training") -> TrialError:
    """The TrialError to raise (``from error``) when ``trial`` failed while ``doing`` something on
    Ray.

    A trial whose actor was lost with its node is marked ``infrastructure``: not the trial's fault.
    """
    cause = getattr(error, "cause", None)
    if isinstance(cause, TrialError) and cause.traceback_text:
        text = cause.traceback_text
    else:
        text = str(error)
    infrastructure = False
    if isinstance(error, RayActorError) and not isinstance(error, RayTaskError):
        infrastructure = _lost_with_its_node(error)
        what = (
            "its Ray actor was lost with its node (infrastructure, not counted as a failure)"
            if infrastructure
            else "its Ray actor died (out of memory, crashed, or killed)"
        )
    else:
        what = "its trainable raised"
    return TrialError(
        f"Trial {trial.trial_id} of experiment {trial.experiment_name} failed while {doing}: "
        f"{what}.\n{text}",
        trial_id=trial.trial_id,
        traceback_text=text,
        infrastructure=infrastructure,
    )


def _lost_with_its_node(error: RayActorError) -> bool:
    """Did the actor behind ``error`` die because its node did (as the GCS recorded it)?"""
    actor_id = getattr(error, "actor_id", None)
    if not actor_id:
        return False
    try:
        return actor_info_by_id(
            actor_id.hex() if hasattr(actor_id, "hex") else str(actor_id)
        ).lost_to_infrastructure
    except Exception:  # the GCS does not answer: say nothing rather than guess
        log.warning("Could not ask Ray why actor %s died", actor_id, exc_info=True)
        return False


def check_picklable(spec: Any, what: str, to: str) -> None:
    """Raise TypeError, naming the fields, when the dataclass ``spec`` cannot travel to ``to`` on
    Ray. Ray's own error would print every field it walks past, a DB URL's password included."""
    from ray import cloudpickle

    try:
        cloudpickle.dumps(spec)
    except Exception as e:  # noqa: BLE001 - pickling raises whatever the object's __reduce__ does
        bad = []
        for field in dataclasses.fields(spec):
            try:
                cloudpickle.dumps(getattr(spec, field.name))
            except Exception:  # noqa: BLE001 - as above
                bad.append(field.name)
        raise TypeError(
            f"{what} cannot be sent to {to} on Ray: {', '.join(bad) or 'its spec'} cannot be "
            f"pickled ({type(e).__name__}: {e}); give it objects that pickle (no locks, open "
            "files or connections)."
        ) from e
