"""The experiment builder: one tuning experiment as a task group (suggest -> mapped trials -> select best)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from airflow.sdk import Asset, TaskGroup, task
from airflow.sdk.exceptions import AirflowFailException

from airflow_trials.core.fate import Transition
from airflow_trials.core.resources import Resources
from airflow_trials.core.search import generate_configs, validate_search_space
from airflow_trials.core.trial import Trial, validate_name
from airflow_trials.hooks.trials import DEFAULT_RAY_CONN_ID, DEFAULT_TRIALS_CONN_ID, TrialsHook
from airflow_trials.operators.trial import RunTrialOperator, task_retries
from airflow_trials.pools import DEFAULT_SLOTS_PER_GPU, gpu_pool_slots

log = logging.getLogger(__name__)


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

    Build it with :meth:`checked` (messages name the experiment) or :meth:`validated`, which
    validate every field.
    """

    search_space: dict[str, Any]
    num_samples: int
    metric: str
    mode: str
    stop: dict[str, float] | None
    resources: Resources
    max_failures: int

    @classmethod
    def checked(cls, experiment_name: str, **settings: Any) -> ExperimentSettings:
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
        metric: str,
        mode: str,
        stop: Mapping[str, float] | None,
        resources_per_trial: Mapping[str, Any] | Resources | None,
        max_failures: int,
    ) -> ExperimentSettings:
        """Validate and build; raises ValueError naming the setting, the bad value and the fix."""
        validate_search_space(search_space)
        if mode not in ("min", "max"):
            raise ValueError(f"mode must be 'min' or 'max', got {mode!r}.")
        if not isinstance(metric, str) or not metric:
            raise ValueError(f"metric must be the name of a reported metric, got {metric!r}.")
        if not cls._is_int(num_samples) or num_samples < 1:
            raise ValueError(f"num_samples must be an integer >= 1 such as 4 (not 4.0), got {num_samples!r}.")
        cls._check_trial_count(search_space, num_samples)
        if stop is not None and (
            not isinstance(stop, Mapping)
            or not all(isinstance(k, str) and cls._is_finite(v) for k, v in stop.items())
        ):
            raise ValueError(f"stop must map metric names to finite numbers, got {stop!r}.")
        if not cls._is_int(max_failures) or max_failures < -1:
            raise ValueError(f"max_failures must be -1 (unlimited) or an integer >= 0, got {max_failures!r}.")
        return cls(dict(search_space), num_samples, metric, mode, dict(stop) if stop else None,
                   cls._checked_resources(resources_per_trial), max_failures)

    @staticmethod
    def _is_int(value: Any) -> bool:
        # JSON has one number type: a conf's 4.0 arrives as a float, and bool is an int subclass.
        return isinstance(value, int) and not isinstance(value, bool)

    @staticmethod
    def _is_finite(value: Any) -> bool:
        import math

        return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)

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
            made = f"num_samples {num_samples}" + (f" x {grids} grid combinations" if grids > 1 else "")
            fix = f"ask for at most {limit // grids} samples" if grids <= limit else "use fewer grid_search values"
            raise ValueError(
                f"{made} is {total} trials, more than {limit}, the most one mapped task may have "
                f"(Airflow's [core] max_map_length); {fix}."
            )

    @staticmethod
    def _checked_resources(spec: Mapping[str, Any] | Resources | None) -> Resources:
        try:
            resources = Resources.from_dict(spec)
        except OverflowError as e:  # an infinite amount, when Resources converts it to Ray's units
            raise ValueError(f"resources_per_trial must hold finite amounts >= 0, got {spec!r}.") from e
        except ValueError as e:  # NaN fails the same conversion with a ValueError
            raise ValueError(f"resources_per_trial must hold finite amounts >= 0, got {spec!r} ({e}).") from e
        if not resources.is_nonnegative():
            raise ValueError(f"resources_per_trial must hold finite amounts >= 0, got {spec!r}.")
        return resources

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

    ``max_failures`` plus 3 (``MAX_INFRASTRUCTURE_RESTARTS``, for trials lost to infrastructure,
    which do not count as failures) becomes the trial tasks' ``retries`` (a retry resumes the trial
    from its latest checkpoint); ``retry_delay`` defaults to Airflow's ``[core] default_task_retry_delay``.
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
        import math

        if from_params is None:
            return settings
        run_id = context["ti"].run_id
        dag = context.get("dag")  # absent only from hand-made contexts: then the values alone are checked
        try:
            params = dict(context["params"])
            for key, value in sorted(params.items()):
                # No JSON Schema range keyword refuses NaN: every comparison with it is false.
                if isinstance(value, float) and not math.isfinite(value):
                    raise ValueError(f"param {key} is {value!r}, not a finite number; set it to a finite number")
            if dag is not None:
                declared = set(dag.params)
                # Airflow merges every conf key into the params, but from_params reads the declared
                # ones: any other key would be ignored while the caller believes it chose something.
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
                            f"param {key} is {params[key]!r}, a float, but it must be an integer; "
                            f"send {round(params[key])}"
                        )
            overrides = from_params(params)
            if not isinstance(overrides, Mapping):
                raise ValueError(f"from_params must return a dict of settings, got {type(overrides).__name__}")
            unknown = sorted(set(overrides) - set(PARAM_SETTINGS))
            if unknown:
                raise ValueError(f"from_params returned {unknown}; it may set only {list(PARAM_SETTINGS)}")
            run = ExperimentSettings.validated(**{**settings.as_kwargs(), **overrides})
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
                f"Experiment {experiment_name}, DAG run {run_id}: the run's params are refused: "
                f"{str(e).rstrip('.')}. No trial was started and nothing was written; trigger the DAG "
                "again with corrected params."
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
            "retries": task_retries(settings.max_failures),
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
            hook = TrialsHook(ray_conn_id, trials_conn_id)
            store = hook.get_store()
            try:
                counts = reconcile_trial_ends(hook, store, experiment_name, run_pk, [s["trial_id"] for s in suggested])
                board = store.leaderboard(run_pk, run.metric, run.mode)
                finished = [r for r in board if r.status.value == "TERMINATED" and r.best_value is not None]
                if not finished:
                    store.finish_experiment_run(run_pk, "FAILED")
                    raise AirflowFailException(
                        f"Experiment {experiment_name}: no trial of run {context['ti'].run_id} finished "
                        f"with metric {run.metric!r} ({_describe(counts)}); see the trial tasks' logs."
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
                "failed_trials": counts["failed"],
                "never_ran_trials": counts["never_ran"],
                "trials": len(suggested),
            }
            context["outlet_events"][asset].extra = best
            return best

        trial_tasks >> select_best(suggested)  # type: ignore[arg-type]  # an XComArg, resolved at run time
    return group


def reconcile_trial_ends(
    hook: TrialsHook, store: Any, experiment_name: str, run_pk: int, trial_ids: Sequence[str]
) -> dict[str, int]:
    """Make the store tell the truth once every trial task of a run is done, and count the ends.

    A trial still PENDING, RUNNING or PAUSED here lost its task for good (a worker killed, a
    trigger that failed) without its end being recorded: it is stopped on Ray, if anything of it
    is left there, and recorded as ERROR. A suggested trial the store never saw never ran.
    Returns counts of ``finished`` (TERMINATED), ``failed`` (ERROR) and ``never_ran`` trials.
    """
    records = {r.trial_id: r for r in store.list_trials(experiment_run_id=run_pk)}
    stuck = [r for r in records.values() if not r.status.is_terminal()]
    if stuck:
        executor = hook.get_executor()
        for record in stuck:
            executor.terminate(experiment_name, record.trial_id)
            store.record_transition(
                record.trial_id, Transition.ABANDONED,
                why=(
                    f"Trial {record.trial_id} of experiment {experiment_name} was still {record.status.value} when "
                    f"every trial task of its run had ended: its task (try {record.try_number}) failed without "
                    "recording the trial's end. It was stopped on Ray; see that task's log for the cause."
                ),
            )
        log.warning("Recorded %d trial(s) whose tasks ended without recording their end as ERROR: %s",
                    len(stuck), ", ".join(r.trial_id for r in stuck))
    statuses = [r.status.value for r in store.list_trials(experiment_run_id=run_pk)]
    counts = {
        "finished": statuses.count("TERMINATED"),
        "failed": statuses.count("ERROR"),
        "never_ran": len(set(trial_ids) - set(records)),
    }
    log.info("Experiment %s, run %s: %s.", experiment_name, run_pk, _describe(counts))
    return counts


def _describe(counts: Mapping[str, int]) -> str:
    return f"{counts['finished']} trial(s) finished, {counts['failed']} failed, {counts['never_ran']} never ran"


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
