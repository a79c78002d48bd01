"""Experiment settings: what one DAG run of an experiment uses, its seed, trial ids and Asset."""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections.abc import Mapping, Sequence
from typing import Any

from airflow.sdk import Asset

from airflow_trials.core.pareto import MetricSpec, ModeSpec, check_several, encode_metrics
from airflow_trials.core.resources import Resources
from airflow_trials.core.search import validate_search_space
from airflow_trials.core.trial import check_max_failures


def run_seed(experiment_name: str, dag_id: str, run_id: str) -> int:
    """The seed of a DAG run's configs when none is given: the same run always suggests the same."""
    return int(hashlib.sha1(f"{experiment_name}\0{dag_id}\0{run_id}".encode()).hexdigest()[:8], 16)


def trial_ids(experiment_name: str, dag_id: str, run_id: str, count: int) -> list[str]:
    prefix = hashlib.sha1(f"{experiment_name}\0{dag_id}\0{run_id}".encode()).hexdigest()[:12]
    return [f"r{prefix}-{i:04d}" for i in range(count)]


def best_trial_asset(experiment_name: str) -> Asset:
    """The Asset the experiment updates with its best trial (schedule downstream DAGs on it)."""
    return Asset(
        name=f"{experiment_name}_best_trial", uri=f"airflow-trials://{experiment_name}/best"
    )


#: The settings a ``from_params`` function may return for one DAG run.
PARAM_SETTINGS = (
    "search_space",
    "num_samples",
    "metric",
    "mode",
    "stop",
    "resources_per_trial",
    "max_failures",
)


@dataclasses.dataclass(frozen=True)
class ExperimentSettings:
    """What one DAG run of an experiment uses: the DAG file's values, with ``from_params`` applied.

    Build it with :meth:`checked` (messages name the experiment) or :meth:`validated`, which
    validate every field.
    """

    search_space: dict[str, Any]
    num_samples: int
    metric: MetricSpec
    mode: ModeSpec
    stop: dict[str, float] | None
    resources: Resources
    max_failures: int

    @classmethod
    def checked(cls, experiment_name: str, **settings: Any) -> ExperimentSettings:  # (sweep= too)
        """:meth:`validated`, its ValueError prefixed with ``Experiment <experiment_name>:``."""
        try:
            return cls.validated(**settings)
        except ValueError as e:
            raise ValueError(f"Experiment {experiment_name}: {e}") from e

    @classmethod
    def validated(
        cls,
        *,
        search_space: Mapping[str, Any],
        num_samples: int,
        metric: MetricSpec,
        mode: ModeSpec,
        stop: Mapping[str, float] | None,
        resources_per_trial: Mapping[str, Any] | Resources | None,
        max_failures: int,
        sweep: bool = False,
    ) -> ExperimentSettings:
        """Validate and build; raises ValueError naming the setting, the bad value and the fix.
        ``sweep``: the trials run in one sweep task, not one mapped task each, so Airflow's
        ``max_map_length`` does not bound them."""
        # sample_from functions are user code: imported when the configs are generated, not here,
        # since this also runs when the DAG file is parsed (as the trainable's path is).
        validate_search_space(search_space, import_functions=False)
        metric, mode = cls._checked_metrics(metric, mode)
        if not cls._is_int(num_samples) or num_samples < 1:
            raise ValueError(
                f"num_samples must be an integer >= 1 such as 4 (not 4.0), got {num_samples!r}."
            )
        if not sweep:
            cls._check_trial_count(search_space, num_samples)
        if stop is not None and (
            not isinstance(stop, Mapping)
            or not all(isinstance(k, str) and cls._is_finite(v) for k, v in stop.items())
        ):
            raise ValueError(f"stop must map metric names to finite numbers, got {stop!r}.")
        max_failures = check_max_failures(max_failures)
        return cls(
            dict(search_space),
            num_samples,
            metric,
            mode,
            dict(stop) if stop else None,
            cls._checked_resources(resources_per_trial),
            max_failures,
        )

    @staticmethod
    def _checked_metrics(metric: Any, mode: Any) -> tuple[MetricSpec, ModeSpec]:
        """One metric and its mode, or several (lists of the same length, one mode each)."""
        if isinstance(metric, list | tuple) or isinstance(mode, list | tuple):
            if not isinstance(metric, list | tuple):
                raise ValueError(
                    f"mode={mode!r} is a list but metric={metric!r} is not; give metric as a "
                    "list too, one name per mode, e.g. metric=['val_acc', 'latency'], "
                    "mode=['max', 'min']."
                )
            names, modes = check_several("metric/mode", metric, mode)
            encode_metrics(names, modes)  # they fit the trials DB's metric column together
            return names, modes
        if mode not in ("min", "max"):
            raise ValueError(f"mode must be 'min' or 'max', got {mode!r}.")
        if not isinstance(metric, str) or not metric:
            raise ValueError(f"metric must be the name of a reported metric, got {metric!r}.")
        return metric, mode

    @property
    def several_metrics(self) -> bool:
        """Does the experiment optimise several metrics at once (metric and mode are lists)?"""
        return isinstance(self.metric, list)

    def one_metric(self, what: str) -> tuple[str, str]:
        """The metric and mode of an experiment of one metric; ValueError naming ``what`` (which
        takes one) with several."""
        if isinstance(self.metric, str) and isinstance(self.mode, str):
            return self.metric, self.mode
        raise ValueError(
            f"{what} takes one metric, got metric={self.metric!r}; give metric and mode as strings."
        )

    @staticmethod
    def _is_int(value: Any) -> bool:
        # JSON has one number type: a conf's 4.0 arrives as a float, and bool is an int subclass.
        return isinstance(value, int) and not isinstance(value, bool)

    @staticmethod
    def _is_finite(value: Any) -> bool:
        import math

        number = isinstance(value, int | float) and not isinstance(value, bool)
        return number and math.isfinite(value)

    @staticmethod
    def _check_trial_count(search_space: Mapping[str, Any], num_samples: int) -> None:
        # suggest_configs' list becomes the trial tasks' mapped instances, and Airflow fails a task
        # whose list is longer than this, after the experiment run is written: refuse it first.
        from airflow.sdk.configuration import conf

        from airflow_trials.core.search import count_configs

        limit = conf.getint("core", "max_map_length", fallback=1024)
        total = count_configs(search_space, num_samples)
        if total > limit:
            grids = total // num_samples
            made = f"num_samples {num_samples}" + (
                f" x {grids} grid combinations" if grids > 1 else ""
            )
            fewer = (
                f"ask for at most {limit // grids} samples"
                if grids <= limit
                else "use fewer grid_search values"
            )
            raise ValueError(
                f"{made} is {total} trials, more than {limit}, the most one mapped task may have "
                "(Airflow's [core] max_map_length); pass sweep=True to run them all in one sweep "
                "task, "
                f"raise [core] max_map_length to at least {total}, or {fewer}."
            )

    @staticmethod
    def _checked_resources(spec: Mapping[str, Any] | Resources | None) -> Resources:
        try:
            resources = Resources.from_dict(spec)
        except OverflowError as e:  # an infinite amount, when Resources converts it to Ray's units
            raise ValueError(
                f"resources_per_trial must hold finite amounts >= 0, got {spec!r}."
            ) from e
        except ValueError as e:  # NaN fails the same conversion with a ValueError
            if isinstance(spec, Mapping) and "bundles" in spec:  # its bundles' own one-line error
                raise ValueError(f"resources_per_trial: {e}") from e
            raise ValueError(
                f"resources_per_trial must hold finite amounts >= 0, got {spec!r} ({e})."
            ) from e
        if not resources.is_nonnegative():
            raise ValueError(f"resources_per_trial must hold finite amounts >= 0, got {spec!r}.")
        return resources

    def as_kwargs(self) -> dict[str, Any]:
        return {
            "search_space": self.search_space,
            "num_samples": self.num_samples,
            "metric": self.metric,
            "mode": self.mode,
            "stop": self.stop,
            "resources_per_trial": self.resources,
            "max_failures": self.max_failures,
        }

    @property
    def checkpoint_score_attr(self) -> str | None:
        """What ranks a trial's checkpoints: the metric (``min-`` prefix: lower is better); with
        several metrics None: no one of them ranks them, so the newest are kept."""
        if not isinstance(self.metric, str):
            return None
        return self.metric if self.mode == "max" else f"min-{self.metric}"


def gpu_task_suffix(gpu: float) -> str:
    """``0.25`` -> ``"0_25"``, ``1.0`` -> ``"1"``: the suffix of a GPU class's trial task id."""
    return f"{gpu:g}".replace(".", "_")


def trial_gpu_classes(
    experiment_name: str, gpu: float, gpu_pool: str | None, choices: Sequence[float] | None
) -> list[float]:
    """The GPUs per trial that get a trial task of their own (one, unless choices are given)."""
    if choices is None:
        return [gpu]
    where = f"Experiment {experiment_name}: gpus_per_trial_choices"
    if not gpu_pool:
        raise ValueError(
            f"{where} only matter with a gpu_pool (they set pool slots); pass "
            "gpu_pool= or drop them."
        )
    classes = sorted({float(c) for c in choices})
    if not classes or any(c < 0 for c in classes):
        raise ValueError(f"{where} must be non-empty and >= 0, got {list(choices)!r}.")
    if gpu not in classes:
        raise ValueError(
            f"{where} {classes} must include resources_per_trial's gpu ({gpu:g}), the default."
        )
    return classes


def check_params(params: Mapping[str, Any], context: Mapping[str, Any]) -> None:
    """Refuse what the trigger form's JSON Schema lets through: NaN, conf keys that are no param
    (they would be ignored while the caller believes they chose something), floats for counts."""
    for key, value in sorted(params.items()):
        # No JSON Schema range keyword refuses NaN: every comparison with it is false.
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(
                f"param {key} is {value!r}, not a finite number; set it to a finite number"
            )
    dag = context.get(
        "dag"
    )  # absent only from hand-made contexts: then the values alone are checked
    if dag is None:
        return
    declared = set(dag.params)
    ignored = sorted(set(getattr(context.get("dag_run"), "conf", None) or {}) - declared)
    if ignored:
        raise ValueError(
            f"conf keys {ignored} are not params of this DAG and would be ignored (the "
            f"trainable, the search space and the experiment name are fixed in the DAG file); "
            f"the trigger form accepts only {sorted(declared)}, so leave out {ignored}"
        )
    for key in sorted(declared & set(params)):
        kinds = dag.params.get_param(key).schema.get("type")
        kinds = kinds if isinstance(kinds, list) else [kinds]
        # JSON Schema counts 4.0 as an integer; a count must be sent as 4.
        if isinstance(params[key], float) and "integer" in kinds and "number" not in kinds:
            raise ValueError(
                f"param {key} is {params[key]!r}, a float, but it must be an integer; send "
                f"{round(params[key])}"
            )
