"""The experiment builder: one tuning experiment as a task group (suggest -> mapped trials -> select best)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from airflow.sdk import Asset, TaskGroup, task
from airflow.sdk.exceptions import AirflowFailException

from airflow_trials.core.resources import Resources
from airflow_trials.core.search import generate_configs, validate_search_space
from airflow_trials.core.trial import Trial, validate_name
from airflow_trials.hooks.trials import DEFAULT_RAY_CONN_ID, DEFAULT_TRIALS_CONN_ID, TrialsHook
from airflow_trials.operators.trial import UNLIMITED_RETRIES, RunTrialOperator
from airflow_trials.pools import DEFAULT_SLOTS_PER_GPU, gpu_pool_slots


def run_seed(experiment_name: str, dag_id: str, run_id: str) -> int:
    """The seed of a DAG run's configs when none is given: the same run always suggests the same."""
    return int(hashlib.sha1(f"{experiment_name}\0{dag_id}\0{run_id}".encode()).hexdigest()[:8], 16)


def trial_ids(experiment_name: str, dag_id: str, run_id: str, count: int) -> list[str]:
    prefix = hashlib.sha1(f"{experiment_name}\0{dag_id}\0{run_id}".encode()).hexdigest()[:12]
    return [f"r{prefix}-{i:04d}" for i in range(count)]


def best_trial_asset(experiment_name: str) -> Asset:
    """The Asset the experiment updates with its best trial (schedule downstream DAGs on it)."""
    return Asset(name=f"{experiment_name}_best_trial", uri=f"airflow-trials://{experiment_name}/best")


#: The settings a ``from_params`` function may return for one DAG run.
PARAM_SETTINGS = ("search_space", "num_samples", "metric", "mode", "stop", "resources_per_trial", "max_failures")


@dataclasses.dataclass(frozen=True)
class ExperimentSettings:
    """What one DAG run of an experiment uses: the DAG file's values, with ``from_params`` applied.

    Build it with :meth:`checked`, which validates every field.
    """

    search_space: dict[str, Any]
    num_samples: int
    metric: str
    mode: str
    stop: dict[str, float] | None
    resources: Resources
    max_failures: int

    @classmethod
    def checked(
        cls,
        experiment_name: str,
        *,
        search_space: Mapping[str, Any],
        num_samples: int,
        metric: str,
        mode: str,
        stop: Mapping[str, float] | None,
        resources_per_trial: Mapping[str, Any] | Resources | None,
        max_failures: int,
    ) -> ExperimentSettings:
        """Validate and build; raises ValueError naming the experiment, the setting and the fix."""
        where = f"Experiment {experiment_name}"
        try:
            validate_search_space(search_space)
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from e
        if mode not in ("min", "max"):
            raise ValueError(f"{where}: mode must be 'min' or 'max', got {mode!r}.")
        if not isinstance(metric, str) or not metric:
            raise ValueError(f"{where}: metric must be the name of a reported metric, got {metric!r}.")
        if not isinstance(num_samples, int) or isinstance(num_samples, bool) or num_samples < 1:
            raise ValueError(f"{where}: num_samples must be a whole number >= 1, got {num_samples!r}.")
        if stop is not None and (
            not isinstance(stop, Mapping)
            or not all(isinstance(k, str) and isinstance(v, int | float) and not isinstance(v, bool)
                       for k, v in stop.items())
        ):
            raise ValueError(f"{where}: stop must map metric names to numbers, got {stop!r}.")
        if not isinstance(max_failures, int) or isinstance(max_failures, bool) or max_failures < -1:
            raise ValueError(f"{where}: max_failures must be -1 (unlimited) or a whole number >= 0, got {max_failures!r}.")
        return cls(dict(search_space), num_samples, metric, mode, dict(stop) if stop else None,
                   Resources.from_dict(resources_per_trial), max_failures)

    def as_kwargs(self) -> dict[str, Any]:
        return {"search_space": self.search_space, "num_samples": self.num_samples, "metric": self.metric,
                "mode": self.mode, "stop": self.stop, "resources_per_trial": self.resources,
                "max_failures": self.max_failures}

    @property
    def checkpoint_score_attr(self) -> str:
        return self.metric if self.mode == "max" else f"min-{self.metric}"


def _gpu_key(gpu: float) -> str:
    """``0.25`` -> ``"0_25"``, ``1.0`` -> ``"1"``: the suffix of a GPU class's trial task id."""
    return f"{gpu:g}".replace(".", "_")


def tuning_experiment(
    *,
    experiment_name: str,
    trainable: str,
    search_space: Mapping[str, Any],
    metric: str,
    mode: str = "min",
    num_samples: int = 1,
    seed: int | None = None,
    stop: Mapping[str, float] | None = None,
    resources_per_trial: Mapping[str, Any] | None = None,
    max_failures: int = 0,
    retry_delay: dt.timedelta | None = None,
    checkpoint_freq: int = 0,
    checkpoint_at_end: bool = True,
    keep_checkpoints_num: int | None = None,
    checkpoint_score_attr: str | None = None,
    gpu_pool: str | None = None,
    slots_per_gpu: int = DEFAULT_SLOTS_PER_GPU,
    gpus_per_trial_choices: Sequence[float] | None = None,
    from_params: Callable[[Mapping[str, Any]], Mapping[str, Any]] | None = None,
    asset: Asset | None = None,
    group_id: str | None = None,
    ray_conn_id: str = DEFAULT_RAY_CONN_ID,
    trials_conn_id: str = DEFAULT_TRIALS_CONN_ID,
    poll_interval_seconds: float = 2.0,
    deferrable: bool = True,
) -> TaskGroup:
    """Declare a tuning experiment inside a ``with DAG(...)`` block; returns its task group.

    Tasks: ``suggest_configs`` (generates the configs, reproducible per DAG run, and registers the
    experiment run in the trials store), ``trial`` (one mapped :class:`RunTrialOperator` per
    config, each visible in the grid view by its trial id) and ``select_best`` (picks the best
    finished trial by ``metric``/``mode``, returns it as XCom and emits an event on ``asset``,
    default :func:`best_trial_asset`).

    ``max_failures`` becomes the trial tasks' ``retries`` (a retry resumes the trial from its latest
    checkpoint); ``retry_delay`` defaults to Airflow's ``[core] default_task_retry_delay``.
    With ``gpu_pool``, each trial task takes ``ceil(gpu * slots_per_gpu)`` slots of that pool (create
    it with :func:`airflow_trials.pools.ensure_gpu_pool`, which sets ``include_deferred``).

    **Settings from the DAG run's params.** ``from_params(params)`` returns, for each run, values
    that replace any of :data:`PARAM_SETTINGS` (a search space built from bounds in the params,
    say). The trainable is never among them: params choose values, not code. ``suggest_configs``
    validates the result before anything starts or is written, and fails the run, naming the
    setting, if it is out of range. Airflow fixes ``retries`` and pool slots when it creates a
    task instance, so the DAG file's ``max_failures`` is the most a run may ask for (the operator
    stops retrying at the run's own value), and a run's GPUs per trial must be one of
    ``gpus_per_trial_choices`` (default: the DAG file's): each choice gets its own mapped trial
    task ``trial_gpu_<n>`` with exact pool slots, and a ``route_trials`` branch runs the one
    that matches.

    Everything that can be checked at parse time is (names, search space, resources, mode); the
    trainable's import path and the cluster's capacity are checked by ``suggest_configs`` before
    any trial starts or anything is written.
    """
    validate_name("Experiment name", experiment_name)
    settings = ExperimentSettings.checked(
        experiment_name, search_space=search_space, num_samples=num_samples, metric=metric, mode=mode,
        stop=stop, resources_per_trial=resources_per_trial, max_failures=max_failures,
    )
    gpu_classes = _gpu_classes(experiment_name, settings.resources.gpu, gpu_pool, gpus_per_trial_choices)
    asset = asset or best_trial_asset(experiment_name)

    def settings_for_run(context: Mapping[str, Any]) -> ExperimentSettings:
        if from_params is None:
            return settings
        run_id = context["ti"].run_id
        try:
            overrides = from_params(dict(context["params"]))
            if not isinstance(overrides, Mapping):
                raise ValueError(f"from_params must return a dict of settings, got {type(overrides).__name__}")
            unknown = sorted(set(overrides) - set(PARAM_SETTINGS))
            if unknown:
                raise ValueError(f"from_params returned {unknown}; it may set only {list(PARAM_SETTINGS)}")
            run = ExperimentSettings.checked(experiment_name, **{**settings.as_kwargs(), **overrides})
            if settings.max_failures >= 0 and not 0 <= run.max_failures <= settings.max_failures:
                raise ValueError(
                    f"max_failures {run.max_failures} is above {settings.max_failures}, the DAG file's "
                    "max_failures, which sets the trial tasks' retries; ask for at most that"
                )
            if gpu_pool and run.resources.gpu not in gpu_classes:
                raise ValueError(
                    f"{run.resources.gpu:g} GPUs per trial is not one of {[f'{g:g}' for g in gpu_classes]}, "
                    "the GPU pool's trial classes (gpus_per_trial_choices); pick one of those"
                )
        except (ValueError, TypeError, KeyError) as e:
            raise AirflowFailException(
                f"Experiment {experiment_name}, DAG run {run_id}: the run's params are refused: {e}. "
                "No trial was started and nothing was written; trigger the DAG again with corrected params."
            ) from e
        return run

    with TaskGroup(group_id or experiment_name.replace(".", "_")) as group:

        @task(task_id="suggest_configs")
        def suggest_configs(**context: Any) -> list[dict[str, Any]]:
            from airflow_trials.execution.trainable import load_trainable

            ti = context["ti"]
            run = settings_for_run(context)
            load_trainable(trainable)  # unknown path: fail before any Ray or DB work
            run_seed_value = seed if seed is not None else run_seed(experiment_name, ti.dag_id, ti.run_id)
            configs = generate_configs(run.search_space, run.num_samples, run_seed_value)
            ids = trial_ids(experiment_name, ti.dag_id, ti.run_id, len(configs))
            # Validate every trial (ids, JSON configs) and the cluster's capacity before writing.
            trials = [Trial(trainable, c, trial_id=i, experiment_name=experiment_name, resources=run.resources,
                            stopping_criterion=run.stop)
                      for i, c in zip(ids, configs, strict=True)]
            hook = TrialsHook(ray_conn_id, trials_conn_id)
            hook.get_executor().check_fits_cluster(trials[0])
            store = hook.get_store()
            try:
                store.ensure_experiment(experiment_name, metric=run.metric, mode=run.mode)
                run_pk = store.create_experiment_run(
                    experiment_name, ti.run_id, dag_id=ti.dag_id, run_id=ti.run_id,
                    search_space=run.search_space, seed=run_seed_value, num_samples=run.num_samples,
                )
            finally:
                store.dispose()
            per_run = {}
            if from_params is not None:
                # Settings that vary by run travel with each trial (they are mapped arguments).
                per_run = {
                    "resources_per_trial": run.resources.to_dict(),
                    "stopping_criterion": run.stop,
                    "max_failures": run.max_failures,
                    "checkpoint_score_attr": checkpoint_score_attr or run.checkpoint_score_attr,
                }
            return [{"trial_id": t.trial_id, "config": t.config, "experiment_run_id": run_pk, **per_run}
                    for t in trials]

        suggested = suggest_configs()
        common: dict[str, Any] = {
            "trainable": trainable,
            "experiment_name": experiment_name,
            "checkpoint_freq": checkpoint_freq,
            "checkpoint_at_end": checkpoint_at_end,
            "keep_checkpoints_num": keep_checkpoints_num,
            "retries": UNLIMITED_RETRIES if settings.max_failures < 0 else settings.max_failures,
            "ray_conn_id": ray_conn_id,
            "trials_conn_id": trials_conn_id,
            "poll_interval_seconds": poll_interval_seconds,
            "deferrable": deferrable,
            "map_index_template": "{{ task.trial_id }}",
        }
        if from_params is None:
            common.update(
                resources_per_trial=settings.resources.to_dict(),
                stopping_criterion=settings.stop,
                max_failures=settings.max_failures,
                checkpoint_score_attr=checkpoint_score_attr or settings.checkpoint_score_attr,
            )
        if retry_delay is not None:
            common["retry_delay"] = retry_delay

        def trial_task(task_id: str, gpu: float) -> Any:
            pool: dict[str, Any] = {}
            if gpu_pool and gpu > 0:
                # Mapped tasks take pool and slots from these partial arguments, fixed per task.
                pool = {"pool": gpu_pool, "pool_slots": gpu_pool_slots(gpu, slots_per_gpu)}
            return RunTrialOperator.partial(task_id=task_id, **common, **pool).expand_kwargs(suggested)

        if len(gpu_classes) == 1:
            trial_tasks = [trial_task("trial", gpu_classes[0])]
            suggested >> trial_tasks[0]
        else:
            by_gpu = {gpu: trial_task(f"trial_gpu_{_gpu_key(gpu)}", gpu) for gpu in gpu_classes}
            trial_tasks = list(by_gpu.values())

            @task.branch(task_id="route_trials")
            def route_trials(**context: Any) -> str:
                """Run the trial task whose pool slots match this run's GPUs per trial."""
                return str(by_gpu[settings_for_run(context).resources.gpu].task_id)

            suggested >> route_trials() >> trial_tasks

        @task(task_id="select_best", trigger_rule="all_done", outlets=[asset])
        def select_best(suggested: list[dict[str, Any]] | None, **context: Any) -> dict[str, Any]:
            if not suggested:
                raise AirflowFailException(
                    f"Experiment {experiment_name}: suggest_configs produced no trials in run "
                    f"{context['ti'].run_id}; see its log for the reason."
                )
            run = settings_for_run(context)
            run_pk = suggested[0]["experiment_run_id"]
            store = TrialsHook(ray_conn_id, trials_conn_id).get_store()
            try:
                board = store.leaderboard(run_pk, run.metric, run.mode)
                finished = [r for r in board if r.status.value == "TERMINATED" and r.best_value is not None]
                if not finished:
                    store.finish_experiment_run(run_pk, "FAILED")
                    raise AirflowFailException(
                        f"Experiment {experiment_name}: no trial of run {context['ti'].run_id} finished "
                        f"with metric {run.metric!r}; see the trial tasks' logs."
                    )
                store.finish_experiment_run(run_pk, "SUCCESS")
            finally:
                store.dispose()
            top = finished[0]
            best = {
                "experiment_name": experiment_name,
                "experiment_run_id": run_pk,
                "trial_id": top.trial_id,
                "config": top.config,
                "metric": run.metric,
                "mode": run.mode,
                "value": top.best_value,
                "iteration": top.best_iteration,
                "checkpoint": top.checkpoint_path,
                "finished_trials": len(finished),
                "trials": len(board),
            }
            context["outlet_events"][asset].extra = best
            return best

        trial_tasks >> select_best(suggested)
    return group


def _gpu_classes(
    experiment_name: str, gpu: float, gpu_pool: str | None, choices: Sequence[float] | None
) -> list[float]:
    """The GPUs per trial that get a trial task of their own (one, unless choices are given)."""
    if choices is None:
        return [gpu]
    where = f"Experiment {experiment_name}: gpus_per_trial_choices"
    if not gpu_pool:
        raise ValueError(f"{where} only matter with a gpu_pool (they set pool slots); pass gpu_pool= or drop them.")
    classes = sorted({float(c) for c in choices})
    if not classes or any(c < 0 for c in classes):
        raise ValueError(f"{where} must be non-empty and >= 0, got {list(choices)!r}.")
    if gpu not in classes:
        raise ValueError(f"{where} {classes} must include resources_per_trial's gpu ({gpu:g}), the default.")
    return classes
