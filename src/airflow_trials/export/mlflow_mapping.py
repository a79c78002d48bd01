"""What a run and its trials become in MLflow: the export's settings and the pure conversions of
configs, results and statuses into MLflow's params, metrics, tags and run statuses (imports
neither mlflow nor the store)."""

from __future__ import annotations

import dataclasses
import json
import math
import posixpath
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from airflow_trials.core.result import TIMESTAMP, TRAINING_ITERATION

# MLflow's limits (mlflow.utils.validation): longer values are refused, not cut.
MAX_KEY_LENGTH = 250
MAX_PARAM_VALUE_LENGTH = 6000
MAX_TAG_VALUE_LENGTH = 8000
MAX_METRICS_PER_BATCH = 1000
MAX_PARAMS_TAGS_PER_BATCH = 100

#: The tags the export sets; a retried export finds its runs by them.
TAG_PREFIX = "airflow_trials."
KIND_TAG = "airflow_trials.kind"  # "experiment_run" (the parent) or "trial"
EXPERIMENT_TAG = "airflow_trials.experiment"
RUN_KEY_TAG = "airflow_trials.run_key"
TRIAL_ID_TAG = "airflow_trials.trial_id"
STATUS_TAG = "airflow_trials.status"
STOP_REASON_TAG = "airflow_trials.stop_reason"
STOP_KIND_TAG = "airflow_trials.stop_kind"
CHECKPOINT_TAG = "airflow_trials.best_checkpoint"  # its URI, logged or not
CHECKPOINT_ARTIFACT_TAG = "airflow_trials.best_checkpoint_artifact"  # the artifact path, logged
# Results up to this training_iteration are logged: a retried export logs only later ones.
EXPORTED_ITERATION_TAG = "airflow_trials.exported_iteration"
PARENT_RUN_TAG = "mlflow.parentRunId"
EXPERIMENT_RUN = "experiment_run"
TRIAL = "trial"

CHECKPOINT_CHOICES = ("best", "all", "none")
DEFAULT_MAX_ARTIFACT_BYTES = 100 * 1024 * 1024

# A trial's status as an MLflow run status; a trial not yet ended stays RUNNING there.
_RUN_STATUS = {"TERMINATED": "FINISHED", "ERROR": "FAILED", "SUCCESS": "FINISHED"}
_KEY_CHARACTERS = re.compile(r"[^\w.\- :/]")


@dataclasses.dataclass(frozen=True)
class MlflowExport:
    """Where and how :func:`~airflow_trials.export.mlflow.export_to_mlflow` exports a run: its
    parent run, and one child run per trial.

    Example::

        tuning_experiment(..., mlflow_export=MlflowExport("http://mlflow:5000"))

    :param tracking_uri: the MLflow tracking server, e.g. ``"http://mlflow:5000"``; default
        None: ``$MLFLOW_TRACKING_URI`` where the export runs.
    :param experiment_name: the MLflow experiment; default None: the trials experiment's name.
    :param checkpoints: whose best checkpoint is logged as an artifact: ``"best"`` (default: the
        run's best trial's), ``"all"`` (every trial's) or ``"none"``. Every trial's best
        checkpoint is referenced by its URI (the tag ``airflow_trials.best_checkpoint``) all
        the same.
    :param max_artifact_bytes: a checkpoint larger than this is referenced, not logged; default
        100 MiB.
    """

    tracking_uri: str | None = None
    experiment_name: str | None = None
    checkpoints: str = "best"
    max_artifact_bytes: int = DEFAULT_MAX_ARTIFACT_BYTES

    def __post_init__(self) -> None:
        if self.tracking_uri is not None and (
            not isinstance(self.tracking_uri, str) or not self.tracking_uri.strip()
        ):
            raise ValueError(
                f"tracking_uri={self.tracking_uri!r} is not a URI; give the MLflow tracking "
                "server's, e.g. 'http://mlflow:5000', or None for $MLFLOW_TRACKING_URI."
            )
        if self.experiment_name is not None and (
            not isinstance(self.experiment_name, str) or not self.experiment_name.strip()
        ):
            raise ValueError(
                f"experiment_name={self.experiment_name!r} is not an MLflow experiment name; "
                "give a non-empty string, or None for the trials experiment's name."
            )
        if self.checkpoints not in CHECKPOINT_CHOICES:
            raise ValueError(
                f"checkpoints={self.checkpoints!r} is not one of {list(CHECKPOINT_CHOICES)}: "
                "'best' logs the run's best trial's best checkpoint, 'all' every trial's, "
                "'none' none (each is referenced by its URI all the same)."
            )
        if (
            isinstance(self.max_artifact_bytes, bool)
            or not isinstance(self.max_artifact_bytes, int)
            or self.max_artifact_bytes < 0
        ):
            raise ValueError(
                f"max_artifact_bytes={self.max_artifact_bytes!r} is not a size in bytes; give "
                "an integer of 0 or more (0: reference every checkpoint, log none)."
            )

    @classmethod
    def of(cls, value: MlflowExport | str | None, experiment_name: str) -> MlflowExport | None:
        """``tuning_experiment(mlflow_export=...)`` checked when the DAG file is parsed: an
        MlflowExport, a tracking URI (the other settings their defaults), or None (no export)."""
        if value is None or isinstance(value, MlflowExport):
            return value
        if isinstance(value, str):
            try:
                return cls(tracking_uri=value)
            except ValueError as e:
                raise ValueError(f"Experiment {experiment_name}: mlflow_export: {e}") from e
        raise ValueError(
            f"Experiment {experiment_name}: mlflow_export={value!r} is neither a tracking URI "
            "nor an MlflowExport; give MlflowExport(tracking_uri=...), a URI such as "
            "'http://mlflow:5000', or leave it out (no export)."
        )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def mlflow_key(name: str) -> str:
    """``name`` as an MLflow param or metric key: characters MLflow refuses become ``_``, and a
    key that would read as another path (``a//b``, ``/a``) has its slashes replaced too."""
    key = _KEY_CHARACTERS.sub("_", str(name))[:MAX_KEY_LENGTH]
    if posixpath.normpath(key) != key or key.startswith(("/", "..")):
        key = key.replace("/", "_")
    if key.startswith(".."):
        key = "_" + key[1:]
    return key if key not in ("", ".") else f"_{key}"


def flatten(values: Mapping[str, Any], separator: str = "/") -> dict[str, Any]:
    """Nested dicts as one level, their keys joined by ``separator`` (as Ray Tune's loggers
    flatten configs and results)."""
    flat: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, Mapping) and value:
            for inner, leaf in flatten(value, separator).items():
                flat[f"{key}{separator}{inner}"] = leaf
        else:
            flat[str(key)] = value
    return flat


def param_values(config: Mapping[str, Any]) -> dict[str, str]:
    """A config as MLflow params: flattened, each value as text (lists and the like as JSON),
    cut to MLflow's limit."""
    return {
        mlflow_key(key): _text(value, MAX_PARAM_VALUE_LENGTH)
        for key, value in flatten(config).items()
    }


def tag_value(value: Any) -> str:
    """A value as an MLflow tag's text, cut to MLflow's limit."""
    return _text(value, MAX_TAG_VALUE_LENGTH)


def _text(value: Any, limit: int) -> str:
    if isinstance(value, str):
        text = value
    elif value is None or isinstance(value, bool | int | float):
        text = str(value)
    else:
        text = json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= limit else text[: limit - 3] + "..."


MetricPoint = tuple[str, float, int, int]
"""``(key, value, timestamp in ms, step)``: one point of one metric, as MLflow logs it."""


def metric_points(results: Sequence[Mapping[str, Any]], after_iteration: int) -> list[MetricPoint]:
    """Every number the results reported after ``after_iteration``, at its training_iteration
    as the step, at its result's timestamp; booleans, text and None (a NaN, as the store keeps
    it) are left out, and so are the step and the timestamp themselves."""
    points: list[MetricPoint] = []
    for result in results:
        step = result.get(TRAINING_ITERATION)
        if not isinstance(step, int) or step <= after_iteration:
            continue
        seconds = result.get(TIMESTAMP)
        millis = int(seconds * 1000) if isinstance(seconds, int | float) else 0
        for key, value in flatten(result).items():
            if key in (TRAINING_ITERATION, TIMESTAMP) or isinstance(value, bool):
                continue
            if isinstance(value, int | float) and math.isfinite(value):
                points.append((mlflow_key(key), float(value), millis, step))
    return points


def run_status(status: str) -> str | None:
    """A trial's or an experiment run's status as an MLflow run status; None while it runs."""
    return _RUN_STATUS.get(status)


def batches(items: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    """``items`` in slices of at most ``size``."""
    for start in range(0, len(items), size):
        yield items[start : start + size]


def changed(wanted: Mapping[str, str], present: Mapping[str, str]) -> dict[str, str]:
    """The entries of ``wanted`` that ``present`` lacks or holds with another value."""
    return {key: value for key, value in wanted.items() if present.get(key) != value}


def metric_batches(
    points: Sequence[MetricPoint], size: int = MAX_METRICS_PER_BATCH
) -> list[tuple[list[MetricPoint], int | None]]:
    """``points`` (in step order) in batches of at most ``size``, each with the last step it
    holds whole: the export's watermark, sent in the same request as the batch, so a retried
    export neither skips nor repeats a point. A batch that ends inside a step (a result of more
    than ``size`` numbers) holds the step before it (None: none), so an export that fails
    right after it logs that step's first points again when retried."""
    found: list[tuple[list[MetricPoint], int | None]] = []
    for start in range(0, len(points), size):
        batch = list(points[start : start + size])
        following = points[start + size] if start + size < len(points) else None
        last = batch[-1][3]
        if following is None or following[3] != last:
            found.append((batch, last))
        else:
            earlier = [p[3] for p in batch if p[3] != last]
            found.append((batch, earlier[-1] if earlier else None))
    return found
