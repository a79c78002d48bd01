"""``with_parameters`` constants on Ray: put once in the object store, read back in each trial's
actor.

Ray is imported on first use, so the in-process actor (unit tests) and package import stay light.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from airflow_trials.core.trial import Trial
from airflow_trials.exceptions import TrainableNotFoundError


def parameter_refs(trial: Trial) -> dict[str, Any]:
    """Name -> ObjectRef of the trial's ``with_parameters`` constants; each is put once, by the
    first trial that uses them. Raises TrainableNotFoundError when the trial names constants it no
    longer holds (rebuilt from saved state)."""
    holder = trial.trainable_parameters
    if holder is None:
        if trial.parameter_names:
            raise TrainableNotFoundError(
                f"Trial {trial.trial_id} of experiment {trial.experiment_name}: its trainable "
                f"{trial.trainable!r} took with_parameters constants "
                f"({', '.join(trial.parameter_names)}), "
                "which live in Ray's object store and are not saved with the trial's state, so "
                "this "
                f"resumed trial cannot get them. Re-create it with Trial(with_parameters("
                f"{trial.trainable!r}, ...), config, trial_id={trial.trial_id!r}), or load the "
                "data "
                f"inside the trainable."
            )
        return {}
    import ray

    return holder.references(ray.put)


def resolve_parameters(refs: Mapping[str, Any]) -> dict[str, Any]:
    """The constants behind ``refs`` (ObjectRefs are fetched; other values, in-process, pass as they
    are)."""
    if not refs:
        return {}
    import ray

    values = dict(refs)
    names = [name for name, value in refs.items() if isinstance(value, ray.ObjectRef)]
    if names:  # ray.get, even of nothing, would start a local Ray where none runs
        values.update(zip(names, ray.get([refs[name] for name in names]), strict=True))
    return values


def parameters_key(refs: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """What identifies a set of constants: an actor reuses its trainable only for the same ones."""
    if not refs:
        return ()
    import ray

    # An ObjectRef's id survives Ray's serialisation; a plain value (in-process) is itself.
    return tuple(
        sorted(
            (name, v.hex() if isinstance(v, ray.ObjectRef) else f"id:{id(v)}")
            for name, v in refs.items()
        )
    )
