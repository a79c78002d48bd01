"""The experiment builder: one tuning experiment as a task group (suggest -> mapped trials -> select
best).

What :func:`tuning_experiment`'s arguments add to its tasks. ``sweep=True`` runs all the trials in
one task, ``sweep`` (a :class:`RunSweepOperator`, its driver on Ray). ``max_failures`` + 3 is the
trial tasks' ``retries``; a retry resumes from the latest checkpoint. ``resources_per_trial`` is
one bundle (``{"cpu": 1, "gpu": 0.5}``) or a ``PlacementGroupFactory`` of several. ``gpu_pool``:
each trial task takes ``ceil(gpu * slots_per_gpu)`` slots, ``gpu`` the sum over the bundles.
``from_params(params)`` sets :data:`PARAM_SETTINGS` per
run (:class:`TuningPlan`), and each of ``gpus_per_trial_choices`` gets a trial task
``trial_gpu_<n>``, run by ``route_trials``. ``gpu_queue``: the executor queue of GPU trials' tasks
(default Airflow's ``[airflow_trials] gpu_queue``, else the default queue), e.g. Celery workers on
GPU nodes. ``scheduler`` stops trials early, ``search_alg=OptunaSearch(...)`` learns from ended
trials, ``max_concurrent_trials`` caps trials at once, and ``warm_start=WarmStart(...)`` (or
``"previous"``, ``"asset"``, a run key) runs an earlier run's best configs first (docs/airflow.md).
``data_version`` (the dataset's Asset, or a template) records the version of the data each run
tunes on, with the run and in its Asset event (:mod:`airflow_trials.experiment.data_version`).

**Several metrics.** ``metric=["val_acc", "latency"], mode=["max", "min"]`` (one mode per
metric) tunes both, with ``search_alg=OptunaSearch(...)`` (a multi-objective study).
``select_best`` then returns the run's Pareto front (``pareto_front``, ``pareto_ranks``) and
the trial ``pick`` chooses from it: ``{"weights": {"val_acc": 1.0, "latency": -0.01}}`` (the
highest weighted sum on the front) or ``{"metric": "val_acc", "bounds": {"latency": [None,
5.0]}}`` (the best val_acc within the bounds); default ``{"metric": <the first metric>}``
(:mod:`airflow_trials.core.pick`). A scheduler judges one of the metrics
(``ASHAScheduler(metric="latency")``) unless it takes several (``MOASHA(...)``);
``sweep`` runs them in its driver; ``warm_start`` seeds the source run's Pareto front first.
Each is checked when the DAG file is parsed.

**Regression check.** ``regression_tolerance={"relative": 0.05}`` (a fraction of the previous
value) or ``{"absolute": 0.01}`` (in the metric's units) adds a task ``check_regression``
after ``select_best``: it fails (:class:`~airflow_trials.exceptions.RegressionError`) when
the run's best is worse, in ``mode``, than the previous successful run's by more than that;
with several metrics, when its Pareto front's hypervolume is lower by more than the relative
tolerance (:mod:`airflow_trials.core.regression_tolerance`). Default None: no check
(docs/airflow.md).

**MLflow export.** ``mlflow_export="http://mlflow:5000"`` (a tracking URI) or
``MlflowExport(...)`` adds a task ``export_mlflow`` after ``select_best``: it exports the run
from the trials DB to MLflow, a parent run and one child run per trial, and a retry updates
them (:mod:`airflow_trials.export.mlflow`; needs ``airflow-trials[mlflow]``). Default None. It is
no leaf of the group (:class:`ExperimentGroup`): ``group >> deploy()`` does not wait for it.

**Extending a finished run.** The DAG gets three params, ``extend_run``, ``extend_num_samples``
and ``extend_stop`` (the trigger form's "Extend a finished run"; ``airflow-trials extend`` sets
them): a DAG run that names a finished run of the experiment adds samples to its search and
continues its TERMINATED trials from their latest checkpoints to the raised stop, in that run
(:mod:`airflow_trials.experiment.extension`, docs/airflow.md). Unset, a run is a normal run.

**Approval.** ``approval=True, approvers=["alice", "bob"]``: ``select_best`` no longer emits
the Asset event; Airflow's ApprovalOperator, ``approve_best``, shows the best trial and waits
for one of ``approvers`` (user ids, Airflow's ``assigned_users``), and ``publish_best`` emits
the event once the answer recorded in the trials DB says approved, by an approver who did not
trigger the run (four eyes; ``allow_self_approval=True`` lets them, for one-person teams). A
rejection is final (:mod:`airflow_trials.experiment.approval`). Default False.

**Deadline.** ``deadline=datetime.timedelta(hours=4)`` (from when the run was queued) or
``ExperimentDeadline(interval, reference="logical_date", callback="my_team.alerts.page")`` adds an
Airflow Deadline Alert to the enclosing DAG: past it, the triggerer logs a warning naming the
experiment and the run, then calls the team's callback (:mod:`airflow_trials.experiment.deadline`,
docs/airflow.md). Default None.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Generator, Mapping, Sequence
from typing import Any

from airflow.sdk import Asset, BaseOperator, TaskGroup, task

from airflow_trials.core.parameters import refuse_in_airflow
from airflow_trials.core.pareto import MetricSpec, ModeSpec
from airflow_trials.core.resources import Resources
from airflow_trials.core.trial import validate_name
from airflow_trials.core.warm_start import ASSET, WarmStart
from airflow_trials.experiment.approval import approve_and_publish, checked_approval
from airflow_trials.experiment.best_task import select_best_task
from airflow_trials.experiment.data_version import (
    add_data_version_param,
    checked_data_version,
    recorded_data_version,
    run_data_version,
    template_of,
)
from airflow_trials.experiment.deadline import ExperimentDeadline, add_deadline_alert
from airflow_trials.experiment.extension import add_extension_params
from airflow_trials.experiment.mlflow_export import EXPORT_TASK_ID, export_mlflow_task
from airflow_trials.experiment.plan import TuningPlan
from airflow_trials.experiment.regression_check import check_regression, checked_tolerance
from airflow_trials.experiment.settings import (
    PARAM_SETTINGS,
    ExperimentSettings,
    best_trial_asset,
    gpu_task_suffix,
    run_seed,
    trial_gpu_classes,
    trial_ids,
)
from airflow_trials.experiment.sweep_trials import registered_sweep
from airflow_trials.experiment.trial_ends import reconcile_trial_ends
from airflow_trials.export.mlflow_mapping import MlflowExport
from airflow_trials.hooks.trials import DEFAULT_RAY_CONN_ID, DEFAULT_TRIALS_CONN_ID, TrialsHook
from airflow_trials.pools import DEFAULT_SLOTS_PER_GPU, default_gpu_queue

__all__ = [
    "PARAM_SETTINGS",
    "ExperimentDeadline",
    "ExperimentSettings",
    "TuningPlan",
    "WarmStart",
    "best_trial_asset",
    "reconcile_trial_ends",
    "run_seed",
    "trial_ids",
    "tuning_experiment",
]


def tuning_experiment(
    *,
    experiment_name: str,
    trainable: str,
    search_space: Mapping[str, Any],
    metric: MetricSpec,
    mode: ModeSpec = "min",
    num_samples: int = 1,
    seed: int | None = None,
    stop: Mapping[str, float] | None = None,
    resources_per_trial: Mapping[str, Any] | Resources | None = None,
    max_failures: int = 0,
    retry_delay: dt.timedelta | None = None,
    checkpoint_freq: int = 0,
    checkpoint_at_end: bool = True,
    keep_checkpoints_num: int | None = None,
    checkpoint_score_attr: str | None = None,
    gpu_pool: str | None = None,
    slots_per_gpu: int = DEFAULT_SLOTS_PER_GPU,
    gpus_per_trial_choices: Sequence[float] | None = None,
    gpu_queue: str | None = None,
    from_params: Callable[[Mapping[str, Any]], Mapping[str, Any]] | None = None,
    asset: Asset | None = None,
    group_id: str | None = None,
    ray_conn_id: str = DEFAULT_RAY_CONN_ID,
    trials_conn_id: str = DEFAULT_TRIALS_CONN_ID,
    poll_interval_seconds: float | None = None,  # None: [airflow_trials] poll_interval_seconds
    deferrable: bool = True,
    scheduler: Any = None,
    search_alg: Any = None,
    max_concurrent_trials: int | None = None,
    sweep: bool = False,
    warm_start: WarmStart | str | None = None,
    data_version: Asset | str | None = None,
    pick: Mapping[str, Any] | None = None,
    regression_tolerance: Mapping[str, float] | None = None,
    mlflow_export: MlflowExport | str | None = None,
    approval: bool = False,
    approvers: Sequence[str | Mapping[str, str]] | None = None,
    allow_self_approval: bool = False,
    deadline: ExperimentDeadline | dt.timedelta | None = None,
) -> TaskGroup:
    """Declare a tuning experiment inside a ``with DAG(...)`` block; returns its task group.

    Tasks: ``suggest_configs`` (the run's configs, registered), ``trial`` (one mapped
    :class:`RunTrialOperator` per config, shown by its trial id) and ``select_best`` (the best
    finished trial by ``metric``/``mode``, as XCom and as an event on ``asset``). The module's
    docstring (:mod:`airflow_trials.experiment.builder`) tells what the other arguments add:
    sweeps, retries, GPU pools and classes, the search, several metrics, the regression check,
    the MLflow export, extending a finished run and approval (docs/airflow.md too).
    """
    # Here, before any other name is bound, locals() holds exactly the arguments.
    plan = _checked_plan(dict(locals()))
    checked_deadline = ExperimentDeadline.of(deadline, experiment_name)
    group = _task_group(plan, group_id)
    if checked_deadline is not None:
        add_deadline_alert(group.dag, checked_deadline, experiment_name)
    return group


def _checked_plan(args: Mapping[str, Any]) -> TuningPlan:
    """The experiment's plan, once :func:`tuning_experiment`'s arguments are checked (each error
    raised as the DAG file is parsed)."""
    experiment_name = args["experiment_name"]
    validate_name("Experiment name", experiment_name)
    refuse_in_airflow(args["trainable"], f"Experiment {experiment_name}")
    settings = ExperimentSettings.checked(
        experiment_name,
        search_space=args["search_space"],
        num_samples=args["num_samples"],
        metric=args["metric"],
        mode=args["mode"],
        stop=args["stop"],
        resources_per_trial=args["resources_per_trial"],
        max_failures=args["max_failures"],
        sweep=args["sweep"],
    )
    return TuningPlan(
        experiment_name=experiment_name,
        trainable=args["trainable"],
        settings=settings,
        gpu_classes=trial_gpu_classes(
            experiment_name,
            settings.resources.gpu,
            args["gpu_pool"],
            args["gpus_per_trial_choices"],
        ),
        asset=args["asset"] or best_trial_asset(experiment_name),
        seed=args["seed"],
        retry_delay=args["retry_delay"],
        checkpoint_freq=args["checkpoint_freq"],
        checkpoint_at_end=args["checkpoint_at_end"],
        keep_checkpoints_num=args["keep_checkpoints_num"],
        checkpoint_score_attr=args["checkpoint_score_attr"],
        gpu_pool=args["gpu_pool"],
        slots_per_gpu=args["slots_per_gpu"],
        from_params=args["from_params"],
        ray_conn_id=args["ray_conn_id"],
        trials_conn_id=args["trials_conn_id"],
        poll_interval_seconds=args["poll_interval_seconds"],
        deferrable=args["deferrable"],
        scheduler=args["scheduler"],
        search_alg=args["search_alg"],
        max_concurrent_trials=args["max_concurrent_trials"],
        sweep=args["sweep"],
        warm_start=WarmStart.of(args["warm_start"]),
        data_version=checked_data_version(experiment_name, args["data_version"]),
        gpu_queue=args["gpu_queue"] if args["gpu_queue"] is not None else default_gpu_queue(),
        pick=args["pick"],
        regression_tolerance=checked_tolerance(
            experiment_name, args["regression_tolerance"], settings
        ),
        mlflow_export=MlflowExport.of(args["mlflow_export"], experiment_name),
        approval=checked_approval(
            experiment_name, args["approval"], args["approvers"], args["allow_self_approval"]
        ),
    )


class ExperimentGroup(TaskGroup):
    """An experiment's task group, whose leaves (the tasks ``group >> task`` and ``task <<
    group`` make ``task`` wait for) leave out its side tasks: ``export_mlflow``, which publishes
    nothing, so that an MLflow outage does not hold back what follows the experiment. The leaves
    are the group's tasks without a downstream task in the group once the side tasks are left
    out: ``select_best``, or what follows it (``check_regression``, ``publish_best``)."""

    #: The side tasks' ids within the group (without the group's prefix).
    SIDE_TASK_IDS = (EXPORT_TASK_ID,)

    def get_leaves(self) -> Generator[BaseOperator, None, None]:
        side = {self.child_id(task_id) for task_id in self.SIDE_TASK_IDS}
        tasks = [task for task in self if task.task_id not in side]
        ids = {task.task_id for task in tasks}
        yield from (task for task in tasks if task.downstream_task_ids.isdisjoint(ids))


def _task_group(plan: TuningPlan, group_id: str | None) -> TaskGroup:
    """The experiment's task group (``group_id``, default its name with ``_`` for ``.``), its
    tasks declared, and the DAG's params to extend a finished run."""
    with ExperimentGroup(group_id or plan.experiment_name.replace(".", "_")) as group:
        if group.dag is not None:  # the trigger form's "Extend a finished run" section
            add_extension_params(group.dag)
        if group.dag is not None and plan.data_version is not None:
            add_data_version_param(group.dag)
        _declare_tasks(plan)
        return group


def _declare_tasks(plan: TuningPlan) -> None:
    """suggest_configs -> [route_trials ->] trial task(s) -> select_best, in the current task
    group."""

    from_asset = plan.warm_start is not None and plan.warm_start.source == ASSET

    @task(task_id="suggest_configs", inlets=[plan.asset] if from_asset else [])
    def suggest_configs(
        data_version: str | None = None, **context: Any
    ) -> list[dict[str, Any]] | dict[str, Any]:
        # data_version: the template of tuning_experiment(data_version=...), rendered.
        version = run_data_version(plan.experiment_name, plan.data_version, data_version, context)
        entries = plan.suggest(context, data_version=version)
        # A sweep's trials are read from the trials DB: its XCom does not grow with them.
        return registered_sweep(plan, entries) if plan.sweep else entries

    suggested = suggest_configs(template_of(plan.data_version))
    trial_tasks = _trial_tasks(plan, suggested)
    # With approval, publish_best emits the Asset event once a person approves.
    select_outlets = [] if plan.approval is not None else [plan.asset]

    # @task, whose operator also gives OpenLineage the run's best trial (best_task.py).
    @select_best_task(
        plan.trainable,
        plan.ray_conn_id,
        plan.trials_conn_id,
        task_id="select_best",
        trigger_rule="all_done",
        outlets=select_outlets,
    )
    def select_best(suggested: list[Any] | dict[str, Any] | None, **context: Any) -> dict[str, Any]:
        best = plan.select_best(suggested, context)
        if plan.data_version is not None:  # the Asset event tells the data it tuned on
            best["data_version"] = recorded_data_version(
                TrialsHook(plan.ray_conn_id, plan.trials_conn_id),
                plan.experiment_name,
                best["experiment_run_id"],
            )
        if plan.approval is None:
            context["outlet_events"][plan.asset].extra = best
        return best

    best = select_best(suggested)  # type: ignore[arg-type]  # an XComArg, resolved at run time
    trial_tasks >> best
    _after_best(plan, best)


def _trial_tasks(plan: TuningPlan, suggested: Any) -> list[Any]:
    """The trial task(s) after ``suggested``: the sweep, the one mapped trial task, or one per GPU
    class behind ``route_trials``."""
    if plan.sweep:
        trial_tasks = [plan.sweep_task(suggested)]
    elif len(plan.gpu_classes) == 1:
        trial_tasks = [plan.trial_task("trial", plan.gpu_classes[0], suggested)]
        suggested >> trial_tasks[0]
    else:
        by_gpu = {
            gpu: plan.trial_task(f"trial_gpu_{gpu_task_suffix(gpu)}", gpu, suggested)
            for gpu in plan.gpu_classes
        }
        trial_tasks = list(by_gpu.values())

        @task.branch(task_id="route_trials")
        def route_trials(**context: Any) -> str:
            """Run the trial task whose pool slots match this run's GPUs per trial."""
            return str(by_gpu[plan.settings_for_run(context).resources.gpu].task_id)

        suggested >> route_trials() >> trial_tasks
    return trial_tasks


def _after_best(plan: TuningPlan, best: Any) -> None:
    """The tasks that follow select_best when asked for: export_mlflow, approve_best and
    publish_best, check_regression."""
    if plan.mlflow_export is not None:
        export_mlflow_task(plan, best)
    if plan.approval is not None:
        approve_and_publish(plan, plan.approval, best)
    if plan.regression_tolerance is not None:

        @task(task_id="check_regression")
        def check_run_regression(best: dict[str, Any], **context: Any) -> dict[str, Any]:
            """Fail when the run's best is worse than the previous successful run's by more
            than the experiment's regression_tolerance."""
            return check_regression(plan, best, context)

        check_run_regression(best)  # type: ignore[arg-type]  # an XComArg
