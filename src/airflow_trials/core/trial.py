"""The Trial: one config of one trainable, with its resources, checkpoint policy and state."""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Mapping
from typing import Any

from airflow_trials.core.checkpoint import CheckpointManager, CheckpointRecord
from airflow_trials.core.parameters import TrainableWithParameters
from airflow_trials.core.resources import Resources
from airflow_trials.core.result import TRAINING_ITERATION, MetricAnalysis, Result
from airflow_trials.core.status import TrialStatus, check_transition
from airflow_trials.core.stop_kind import StopKind, stop_kind_or_none
from airflow_trials.core.stopping import StopFn, Stopper, build_stopper

# Ids and experiment names become directory names and Ray actor names: keep them plain.
_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def validate_name(kind: str, value: str) -> str:
    """Return ``value`` if it is a safe id (letters, digits, ``.``, ``_``, ``-``), else raise
    ValueError."""
    if not isinstance(value, str) or not _SAFE_NAME.match(value) or ".." in value:
        raise ValueError(
            f"{kind} {value!r} is not a valid name: use 1-128 letters, digits, '.', '_' or '-', "
            f"starting with a letter or digit and without '..' (it becomes a directory name)."
        )
    return value


def new_trial_id() -> str:
    return uuid.uuid4().hex[:10]


class Trial:
    """One run of a trainable with one config.

    :param trainable: import path of the trainable, ``"package.module:name"``; a function taking
        ``config`` or a :class:`~airflow_trials.Trainable` subclass. Or such a path bundled with
        large constants by :func:`~airflow_trials.with_parameters` (not saved with the trial's
        state: a resumed trial needs them given again).
    :param config: the hyperparameters; must be JSON-serialisable. Default ``{}``.
    :param trial_id: unique id; default a random hex string.
    :param experiment_name: groups trials on storage; default ``"default"``.
    :param resources: a :class:`Resources`, a dict such as ``{"cpu": 1, "gpu": 0.5}``, or a
        :class:`~airflow_trials.PlacementGroupFactory` of several bundles (the trial's actor in
        bundle 0, the others for the workers its trainable starts); default 1 CPU.
    :param stopping_criterion: thresholds such as ``{"training_iteration": 10}``, a callable
        ``(trial_id, result) -> bool`` or a :class:`Stopper`; default: run until the trainable ends.
    :param checkpoint_freq: checkpoint every N iterations (class trainables); 0 disables. Default 0.
    :param checkpoint_at_end: checkpoint when the trial finishes. Default False.
    :param keep_checkpoints_num: keep at most this many checkpoints; default all.
    :param checkpoint_score_attr: metric ranking checkpoints for keep_checkpoints_num (``min-``
        prefix
        for lower-is-better); default recency.
    :param max_failures: retries from the latest checkpoint after a failure; -1 means unlimited.
        Default 0.
    :param restore_path: checkpoint to warm-start from; default none.
    """

    def __init__(
        self,
        trainable: str | TrainableWithParameters,
        config: Mapping[str, Any] | None = None,
        *,
        trial_id: str | None = None,
        experiment_name: str = "default",
        resources: Resources | Mapping[str, Any] | None = None,
        stopping_criterion: Mapping[str, float] | StopFn | Stopper | None = None,
        checkpoint_freq: int = 0,
        checkpoint_at_end: bool = False,
        keep_checkpoints_num: int | None = None,
        checkpoint_score_attr: str | None = None,
        max_failures: int = 0,
        restore_path: str | None = None,
    ) -> None:
        self.trial_id = validate_name("Trial id", new_trial_id() if trial_id is None else trial_id)
        self.experiment_name = validate_name("Experiment name", experiment_name)
        self._set_trainable(trainable)
        self.config: dict[str, Any] = dict(config or {})
        try:
            json.dumps(self.config, allow_nan=True)
        except (TypeError, ValueError) as e:
            raise ValueError(
                f"Trial {self.trial_id}: config is not JSON-serialisable ({e}); configs are stored "
                f"and shown as JSON, so use numbers, strings, booleans, lists and dicts."
            ) from e
        self.resources = Resources.from_dict(resources)
        if not self.resources.is_nonnegative():
            raise ValueError(
                f"Trial {self.trial_id}: resources must not be negative, got {self.resources}."
            )
        self.stopping_criterion = stopping_criterion
        self.stopper = build_stopper(stopping_criterion)
        if checkpoint_freq < 0:
            raise ValueError(
                f"Trial {self.trial_id}: checkpoint_freq must be >= 0, got {checkpoint_freq}."
            )
        check_max_failures(max_failures, trial_id=self.trial_id)
        self.checkpoint_freq = checkpoint_freq
        self.checkpoint_at_end = checkpoint_at_end
        self.max_failures = max_failures
        self.restore_path = restore_path
        self.checkpoint_manager = CheckpointManager(keep_checkpoints_num, checkpoint_score_attr)

        self.status = TrialStatus.PENDING
        self.num_failures = 0
        self.last_result: Result = {}
        self.metric_analysis = MetricAnalysis()
        self.error_msg: str | None = None
        # Why it ended TERMINATED after a result: its trainable finished, it met its stopping
        # criterion, or the scheduler's sentence (e.g. ASHA's rung and cutoff). Set by the runner.
        self.stop_reason: str | None = None
        # The kind of that end (core/stop_kind.py); set with stop_reason.
        self.stop_kind: StopKind | None = None
        self.start_time: float | None = None
        self.end_time: float | None = None
        # Highest training_iteration recorded; a restore replays iterations after its checkpoint,
        # and those replays are not recorded twice.
        self.last_recorded_iteration = 0

    def _set_trainable(self, trainable: str | TrainableWithParameters) -> None:
        bundle = trainable if isinstance(trainable, TrainableWithParameters) else None
        path = bundle.trainable if bundle is not None else trainable
        if not isinstance(path, str) or not path.strip():
            raise ValueError(
                f"Trial {self.trial_id}: trainable must be an import path such as "
                f"'my_pkg.train:train_fn', got {path!r}."
            )
        self.trainable = path
        self.trainable_parameters = bundle
        # Saved with the state (the values are not), so a resumed trial without them fails clearly.
        self.parameter_names: tuple[str, ...] = bundle.names if bundle is not None else ()

    # -- properties mirrored from the checkpoint policy ------------------------------------------
    @property
    def keep_checkpoints_num(self) -> int | None:
        return self.checkpoint_manager.keep_checkpoints_num

    @property
    def checkpoint_score_attr(self) -> str | None:
        return self.checkpoint_manager.checkpoint_score_attr

    @property
    def checkpoint(self) -> CheckpointRecord | None:
        """The newest persisted checkpoint, if any."""
        return self.checkpoint_manager.newest

    def has_checkpoint(self) -> bool:
        return self.checkpoint_manager.newest is not None

    def restore_source(self) -> str | None:
        """Where the next start restores from: the newest checkpoint, else ``restore_path``."""
        newest = self.checkpoint_manager.newest
        return newest.path if newest is not None else self.restore_path

    # -- state changes ----------------------------------------------------------------------------
    def set_status(self, status: TrialStatus) -> None:
        """The one place a trial's status changes; raises InvalidTransitionError if not allowed."""
        status = TrialStatus(status)
        check_transition(self.trial_id, self.status, status)
        if status == TrialStatus.RUNNING and self.start_time is None:
            self.start_time = time.time()
        if status.is_terminal():
            self.end_time = time.time()
        elif self.status.is_terminal():
            self.end_time = None
        self.status = status

    def update_resources(self, resources: Resources | Mapping[str, Any]) -> None:
        """Change what the trial asks for (one bundle or a PlacementGroupFactory's several); only
        allowed while it is not RUNNING. Its next start makes a placement group of the new shape."""
        if self.status == TrialStatus.RUNNING:
            raise ValueError(
                f"Cannot update resources of trial {self.trial_id} while it is RUNNING; "
                f"stop or pause it first."
            )
        self.resources = Resources.from_dict(resources)

    def record_result(self, result: Result) -> bool:
        """Make ``result`` the latest; returns False when it replays an already recorded
        iteration."""
        self.last_result = result
        iteration = int(result.get(TRAINING_ITERATION, 0))
        if iteration and iteration <= self.last_recorded_iteration:
            return False
        self.last_recorded_iteration = max(self.last_recorded_iteration, iteration)
        self.metric_analysis.update(result)
        return True

    def should_stop(self, result: Result) -> bool:
        if result.get("done"):
            return True
        return self.stopper is not None and self.stopper(self.trial_id, result)

    def should_checkpoint(self) -> bool:
        iteration = int(self.last_result.get(TRAINING_ITERATION, 0))
        return self.checkpoint_freq > 0 and iteration > 0 and iteration % self.checkpoint_freq == 0

    def should_recover(self) -> bool:
        """After ``num_failures`` was incremented: may the trial be retried?"""
        return self.max_failures < 0 or self.num_failures <= self.max_failures

    def reset_for_rerun(self) -> None:
        """Put an ERROR trial back to PENDING for a fresh series of retries (resume
        errored-only)."""
        self.set_status(TrialStatus.PENDING)
        self.num_failures = 0
        self.error_msg = None
        self.stop_reason = None
        self.stop_kind = None

    # -- serialisation ----------------------------------------------------------------------------
    def to_json_state(self) -> dict[str, Any]:
        criterion = (
            self.stopping_criterion if isinstance(self.stopping_criterion, Mapping) else None
        )
        return {
            "trial_id": self.trial_id,
            "experiment_name": self.experiment_name,
            "trainable": self.trainable,
            "trainable_parameters": list(self.parameter_names),
            "config": self.config,
            "resources": self.resources.to_dict(),
            "stopping_criterion": criterion,
            "checkpoint_freq": self.checkpoint_freq,
            "checkpoint_at_end": self.checkpoint_at_end,
            "keep_checkpoints_num": self.keep_checkpoints_num,
            "checkpoint_score_attr": self.checkpoint_score_attr,
            "max_failures": self.max_failures,
            "restore_path": self.restore_path,
            "status": self.status.value,
            "num_failures": self.num_failures,
            "last_result": _jsonable_result(self.last_result),
            "metric_analysis": self.metric_analysis.to_dict(),
            "error_msg": self.error_msg,
            "stop_reason": self.stop_reason,
            "stop_kind": None if self.stop_kind is None else self.stop_kind.value,
            "start_time": self.start_time,
            "end_time": self.end_time,
            "last_recorded_iteration": self.last_recorded_iteration,
            "checkpoints": self.checkpoint_manager.to_dict(),
        }

    @classmethod
    def from_json_state(
        cls,
        state: Mapping[str, Any],
        stopping_criterion: Mapping[str, float] | StopFn | Stopper | None = None,
    ) -> Trial:
        """Rebuild a trial; pass ``stopping_criterion`` again when it was a callable (not saved)."""
        trial = cls(
            state["trainable"],
            state["config"],
            trial_id=state["trial_id"],
            experiment_name=state["experiment_name"],
            resources=state["resources"],
            stopping_criterion=stopping_criterion or state.get("stopping_criterion"),
            checkpoint_freq=state["checkpoint_freq"],
            checkpoint_at_end=state["checkpoint_at_end"],
            keep_checkpoints_num=state["keep_checkpoints_num"],
            checkpoint_score_attr=state["checkpoint_score_attr"],
            max_failures=state["max_failures"],
            restore_path=state["restore_path"],
        )
        trial.parameter_names = tuple(state.get("trainable_parameters", ()))
        trial.status = TrialStatus(state["status"])
        trial.num_failures = state["num_failures"]
        trial.last_result = dict(state["last_result"])
        trial.metric_analysis = MetricAnalysis.from_dict(state["metric_analysis"])
        trial.error_msg = state["error_msg"]
        trial.stop_reason = state.get("stop_reason")
        trial.stop_kind = stop_kind_or_none(state.get("stop_kind"))
        trial.start_time = state["start_time"]
        trial.end_time = state["end_time"]
        trial.last_recorded_iteration = state["last_recorded_iteration"]
        trial.checkpoint_manager.load(state["checkpoints"])
        return trial

    def __repr__(self) -> str:
        return f"Trial({self.trial_id}, {self.status.value})"

    def __str__(self) -> str:
        return self.trial_id


def _jsonable_result(result: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in result.items():
        try:
            json.dumps(value)
        except (TypeError, ValueError):
            value = repr(value)
        out[key] = value
    return out


def check_max_failures(max_failures: Any, *, trial_id: str | None = None) -> int:
    """``max_failures`` once checked: -1 (unlimited) or an integer >= 0; else ValueError.

    The one check of ``max_failures``, for a :class:`Trial`, a trial task and an experiment's
    settings. A JSON number such as ``1.0`` (a run's conf) and a bool are refused: neither is a
    count.

    :param trial_id: the trial it is for, named in the error; default None (not named).
    """
    if isinstance(max_failures, bool) or not isinstance(max_failures, int) or max_failures < -1:
        whose = f"Trial {trial_id}: " if trial_id is not None else ""
        raise ValueError(
            f"{whose}max_failures must be -1 (unlimited) or an integer >= 0, got {max_failures!r}."
        )
    return max_failures
