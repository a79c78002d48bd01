"""What a launched trial actor is given: plain values that the driver builds and the worker reads.

The driver (:mod:`~airflow_trials.execution.driver`) builds them; the actor
(:mod:`~airflow_trials.execution.worker`) reads them. Neither imports the other for them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from airflow_trials.core.trial import Trial
from airflow_trials.execution.parameter_refs import parameter_refs

TrialSpec = dict[str, Any]
"""What an actor needs to run a trial: trial_id, experiment_name, trainable, config, resources (what
``get_trial_resources()`` answers in it) and optionally parameters (name -> ObjectRef of a
``with_parameters`` constant)."""

HoldSpec = Mapping[str, Any]
"""``{"time_attr": str, "points": [float, ...], "every_from": float | None}``: plain values, so
that Ray and Airflow carry them (``every_from`` may be left out)."""

# What a launched actor runs from its constructor: the trial's JSON state, the checkpoint to
# restore first (None: start from scratch) and its holds (None: no scheduler's verdicts).
Autorun = tuple[dict[str, Any], str | None, dict[str, Any] | None]


def trial_spec(trial: Trial) -> TrialSpec:
    """What a trial actor needs to know of its trial to build the trainable; its with_parameters
    constants travel as ObjectRefs, which Ray passes by reference, never copied into the spec."""
    return {
        "trial_id": trial.trial_id,
        "experiment_name": trial.experiment_name,
        "trainable": trial.trainable,
        "config": trial.config,
        "resources": trial.resources.to_dict(),
        "parameters": parameter_refs(trial),
    }
