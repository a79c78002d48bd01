"""The experiment builder: one tuning experiment as a task group (suggest -> mapped trials -> select best)."""

from __future__ import annotations

import datetime as dt
import hashlib
from collections.abc import Mapping
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

    Everything that can be checked at parse time is (names, search space, resources, mode); the
    trainable's import path and the cluster's capacity are checked by ``suggest_configs`` before
    any trial starts or anything is written.
    """
    validate_name("Experiment name", experiment_name)
    validate_search_space(search_space)
    if mode not in ("min", "max"):
        raise ValueError(f"Experiment {experiment_name}: mode must be 'min' or 'max', got {mode!r}.")
    if not isinstance(num_samples, int) or num_samples < 1:
        raise ValueError(f"Experiment {experiment_name}: num_samples must be >= 1, got {num_samples!r}.")
    resources = Resources.from_dict(resources_per_trial)
    space = dict(search_space)
    asset = asset or best_trial_asset(experiment_name)
    score_attr = checkpoint_score_attr or (metric if mode == "max" else f"min-{metric}")

    with TaskGroup(group_id or experiment_name.replace(".", "_")) as group:

        @task(task_id="suggest_configs")
        def suggest_configs(**context: Any) -> list[dict[str, Any]]:
            from airflow_trials.execution.trainable import load_trainable

            ti = context["ti"]
            load_trainable(trainable)  # unknown path: fail before any Ray or DB work
            run_seed_value = seed if seed is not None else run_seed(experiment_name, ti.dag_id, ti.run_id)
            configs = generate_configs(space, num_samples, run_seed_value)
            ids = trial_ids(experiment_name, ti.dag_id, ti.run_id, len(configs))
            # Validate every trial (ids, JSON configs) and the cluster's capacity before writing.
            trials = [Trial(trainable, c, trial_id=i, experiment_name=experiment_name, resources=resources)
                      for i, c in zip(ids, configs, strict=True)]
            hook = TrialsHook(ray_conn_id, trials_conn_id)
            hook.get_executor().check_fits_cluster(trials[0])
            store = hook.get_store()
            try:
                store.ensure_experiment(experiment_name, metric=metric, mode=mode)
                run_pk = store.create_experiment_run(
                    experiment_name, ti.run_id, dag_id=ti.dag_id, run_id=ti.run_id,
                    search_space=space, seed=run_seed_value, num_samples=num_samples,
                )
            finally:
                store.dispose()
            return [{"trial_id": t.trial_id, "config": t.config, "experiment_run_id": run_pk} for t in trials]

        suggested = suggest_configs()
        partial_kwargs: dict[str, Any] = {}
        if retry_delay is not None:
            partial_kwargs["retry_delay"] = retry_delay
        if gpu_pool and resources.gpu > 0:
            # Mapped tasks take pool and slots from these partial arguments.
            partial_kwargs.update(pool=gpu_pool, pool_slots=gpu_pool_slots(resources.gpu, slots_per_gpu))
        trials = RunTrialOperator.partial(
            task_id="trial",
            trainable=trainable,
            experiment_name=experiment_name,
            resources_per_trial=resources.to_dict(),
            stopping_criterion=dict(stop) if stop else None,
            checkpoint_freq=checkpoint_freq,
            checkpoint_at_end=checkpoint_at_end,
            keep_checkpoints_num=keep_checkpoints_num,
            checkpoint_score_attr=score_attr,
            max_failures=max_failures,
            retries=UNLIMITED_RETRIES if max_failures < 0 else max_failures,
            ray_conn_id=ray_conn_id,
            trials_conn_id=trials_conn_id,
            poll_interval_seconds=poll_interval_seconds,
            deferrable=deferrable,
            map_index_template="{{ task.trial_id }}",
            **partial_kwargs,
        ).expand_kwargs(suggested)

        @task(task_id="select_best", trigger_rule="all_done", outlets=[asset])
        def select_best(suggested: list[dict[str, Any]] | None, **context: Any) -> dict[str, Any]:
            if not suggested:
                raise AirflowFailException(
                    f"Experiment {experiment_name}: suggest_configs produced no trials in run "
                    f"{context['ti'].run_id}; see its log for the reason."
                )
            run_pk = suggested[0]["experiment_run_id"]
            store = TrialsHook(ray_conn_id, trials_conn_id).get_store()
            try:
                board = store.leaderboard(run_pk, metric, mode)
                finished = [r for r in board if r.status.value == "TERMINATED" and r.best_value is not None]
                if not finished:
                    store.finish_experiment_run(run_pk, "FAILED")
                    raise AirflowFailException(
                        f"Experiment {experiment_name}: no trial of run {context['ti'].run_id} finished "
                        f"with metric {metric!r}; see the trial tasks' logs."
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
                "metric": metric,
                "mode": mode,
                "value": top.best_value,
                "iteration": top.best_iteration,
                "checkpoint": top.checkpoint_path,
                "finished_trials": len(finished),
                "trials": len(board),
            }
            context["outlet_events"][asset].extra = best
            return best

        suggested >> trials >> select_best(suggested)
    return group
