"""RunSweepOperator: runs a whole tuning experiment as one deferrable Airflow task, its driver on
Ray."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator, Context, conf
from airflow.sdk.exceptions import AirflowFailException

from airflow_trials.core.end import SweepEnd, SweepStatus
from airflow_trials.core.goal import Goal
from airflow_trials.core.parameters import refuse_in_airflow
from airflow_trials.core.pareto import MetricSpec, ModeSpec, check_metrics
from airflow_trials.core.resources import Resources
from airflow_trials.core.scheduler import judged_metric_and_mode
from airflow_trials.core.sweep_progress import end_line, sweep_summary
from airflow_trials.exceptions import AirflowTrialsError
from airflow_trials.hooks.trials import DEFAULT_RAY_CONN_ID, DEFAULT_TRIALS_CONN_ID, TrialsHook
from airflow_trials.operators.links import SweepDashboardLink, sweep_run_pk
from airflow_trials.operators.suggested_trials import SuggestedTrials, warm_started
from airflow_trials.operators.trial_operator import MAX_INFRASTRUCTURE_RESTARTS
from airflow_trials.operators.tuning import airflow_searcher
from airflow_trials.pools import DEFAULT_SLOTS_PER_GPU, gpu_pool_slots
from airflow_trials.provider_config import setting_float
from airflow_trials.triggers.sweep_trigger import SweepTrigger

if TYPE_CHECKING:
    from airflow.providers.openlineage.extractors import OperatorLineage

# What a run's params may set per run (TuningPlan._per_trial_settings), carried by each suggested
# trial.
_PER_RUN = ("resources_per_trial", "stopping_criterion", "max_failures", "checkpoint_score_attr")


class SweepLostError(AirflowTrialsError):
    """The sweep's driver is gone or failed with trials unfinished: Airflow retries the task, whose
    next try resumes the run from the trials DB."""


class RunSweepOperator(BaseOperator):
    """Runs every trial of one experiment run in one task: a driver on the Ray cluster (a detached
    named actor running the :class:`~airflow_trials.TrialRunner`) launches them, applies the
    scheduler, and records each trial in the trials DB as the mapped trial tasks do.

    ``execute`` starts the run's driver, or re-attaches to the live one (a worker that died, a
    cleared task, a second try): there is never a second driver for a run. It then defers to
    :class:`~airflow_trials.triggers.sweep_trigger.SweepTrigger`, which logs progress lines to this
    task's log. A driver lost with its node or a Ray head restart fails the try; Airflow retries it,
    and the new driver resumes the run: finished trials are not run again, the others continue from
    their latest recorded checkpoints. Each trial's own failures are retried by the driver, up to
    ``max_failures``; ``retries`` (default 3) are for losses of the driver.

    :param trainable: import path, ``"package.module:name"``. Templated.
    :param trials: the run's trials: ``suggest_configs``' XCom with ``sweep=True``, a reference
        to the trials it registered in the trials DB (``{"experiment_run_id", "num_trials", ...}``,
        whose size does not grow with the trials: the driver reads them by the run's id), or a
        list of ``{"trial_id", "config", "experiment_run_id"}``; one task however many. Templated.
    :param metric: the metric trials are ranked by. :param mode: ``"min"`` or ``"max"``; default
        ``"min"``. Several at once as lists (``metric=["val_acc", "latency"], mode=["max",
        "min"]``): the searcher optimises all of them, a scheduler judges the one it names (or all,
        ``MOASHA``), and the progress lines and checkpoints go by the first.
    :param experiment_name: default: the DAG id. Templated.
    :param resources_per_trial: e.g. ``{"cpu": 1, "gpu": 0.5}``, or several bundles as a
        :class:`~airflow_trials.PlacementGroupFactory`; default 1 CPU.
    :param stopping_criterion: e.g. ``{"training_iteration": 10}``; default none.
    :param checkpoint_freq: default 0. :param checkpoint_at_end: default True.
    :param keep_checkpoints_num: default all. :param checkpoint_score_attr: default the metric.
    :param max_failures: each trial's retries from its latest checkpoint; default 0.
    :param scheduler: any engine scheduler (``ASHAScheduler``, ``HyperBandScheduler``,
        ``MedianStoppingRule``, ``PopulationBasedTraining``); it runs in the driver. Default FIFO.
    :param search_alg: an ``OptunaSearch`` with its space, metric and mode set; it runs in the
        driver and suggests the config of each trial given with an empty ``config``, as slots free,
        learning from the trials that ended. A resumed run tells it the run's ended trials first
        (``add_evaluated_point``) and keeps each trial id's stored config. Default none.
    :param max_concurrent_trials: the most trials at once; default None: as many as Ray fits.
        Needed with ``gpu_pool``.
    :param gpu_pool: with GPUs per trial, the task takes ``max_concurrent_trials`` trials' slots
        (``ceil(gpu * slots_per_gpu)`` each) of this pool; default none.
    :param slots_per_gpu: default 4.
    :param ray_conn_id: default ``ray_default``. :param trials_conn_id: default ``trials_default``.
    :param poll_interval_seconds: how often the trigger asks the driver; default
        ``[airflow_trials] poll_interval_seconds`` (2).
    :param progress_interval_seconds: the most time between two progress lines; default 30.
    :param deferrable: defer while the sweep runs, watched by the triggerer, holding no worker slot;
        default ``[operators] default_deferrable`` (False in stock Airflow: the task then watches
        the
        sweep from the worker, holding a slot for the whole run). ``tuning_experiment`` passes True.
    """

    template_fields: Sequence[str] = ("trainable", "trials", "experiment_name")
    ui_color = "#b5d8ff"
    operator_extra_links = (SweepDashboardLink(),)

    def __init__(
        self,
        *,
        trainable: str,
        trials: Any,
        metric: MetricSpec,
        mode: ModeSpec = "min",
        experiment_name: str | None = None,
        resources_per_trial: Mapping[str, Any] | Resources | None = None,
        stopping_criterion: Mapping[str, float] | None = None,
        checkpoint_freq: int = 0,
        checkpoint_at_end: bool = True,
        keep_checkpoints_num: int | None = None,
        checkpoint_score_attr: str | None = None,
        max_failures: int = 0,
        scheduler: Any = None,
        search_alg: Any = None,
        max_concurrent_trials: int | None = None,
        gpu_pool: str | None = None,
        slots_per_gpu: int = DEFAULT_SLOTS_PER_GPU,
        ray_conn_id: str = DEFAULT_RAY_CONN_ID,
        trials_conn_id: str = DEFAULT_TRIALS_CONN_ID,
        poll_interval_seconds: float | None = None,
        progress_interval_seconds: float = 30.0,
        deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
        **kwargs: Any,
    ) -> None:
        owner = f"RunSweepOperator {kwargs.get('task_id')!r}"
        refuse_in_airflow(trainable, owner)
        metric, mode = _checked_goal(owner, metric, mode, scheduler)
        if search_alg is not None:
            search_alg = _checked_searcher(owner, search_alg, metric, mode)
        gpu = Resources.from_dict(resources_per_trial).gpu
        if gpu_pool and gpu > 0 and "pool" not in kwargs:
            _hold_pool_slots(owner, kwargs, gpu_pool, gpu, slots_per_gpu, max_concurrent_trials)
        kwargs.setdefault("retries", MAX_INFRASTRUCTURE_RESTARTS)
        super().__init__(**kwargs)
        self.trainable = trainable
        self.trials = trials
        self.metric, self.mode = metric, mode
        self.experiment_name = experiment_name
        self.resources_per_trial = Resources.spec_of(resources_per_trial)
        self.stopping_criterion = dict(stopping_criterion) if stopping_criterion else None
        self.checkpoint_freq, self.checkpoint_at_end = checkpoint_freq, checkpoint_at_end
        self.keep_checkpoints_num = keep_checkpoints_num
        self.checkpoint_score_attr = checkpoint_score_attr or _best_first(metric, mode)
        self.max_failures = max_failures
        self.scheduler = scheduler
        self.search_alg = search_alg
        self.max_concurrent_trials = max_concurrent_trials
        self.gpu_pool, self.slots_per_gpu = gpu_pool, slots_per_gpu
        self.ray_conn_id, self.trials_conn_id = ray_conn_id, trials_conn_id
        self.poll_interval_seconds = (
            setting_float("poll_interval_seconds")
            if poll_interval_seconds is None
            else poll_interval_seconds
        )
        self.progress_interval_seconds = progress_interval_seconds
        self.deferrable = deferrable

    def _hook(self) -> TrialsHook:
        return TrialsHook(self.ray_conn_id, self.trials_conn_id)

    def _run_ids(self, context: Context) -> tuple[str, SuggestedTrials]:
        """The experiment and the run's trials (:class:`SuggestedTrials`)."""
        from airflow_trials.operators.trial_operator import experiment_name_for

        ti = context["ti"]
        experiment = self.experiment_name or experiment_name_for(ti.dag_id)
        owner = f"Sweep {ti.task_id} of experiment {experiment}, run {ti.run_id}"
        try:
            return experiment, SuggestedTrials.of(self.trials, owner)
        except ValueError as e:
            raise AirflowFailException(str(e)) from e

    def _trial_kwargs(self, suggested: SuggestedTrials) -> dict[str, Any]:
        """The Trial arguments; a run's own settings (``from_params``), which every suggested trial
        carries, replace the DAG file's."""
        first = suggested.settings
        run = {key: first[key] for key in _PER_RUN if key in first}
        return {
            "resources": run.get("resources_per_trial", self.resources_per_trial),
            "stopping_criterion": run.get("stopping_criterion", self.stopping_criterion),
            "checkpoint_freq": self.checkpoint_freq,
            "checkpoint_at_end": self.checkpoint_at_end,
            "keep_checkpoints_num": self.keep_checkpoints_num,
            "checkpoint_score_attr": run.get("checkpoint_score_attr", self.checkpoint_score_attr),
            "max_failures": run.get("max_failures", self.max_failures),
        }

    def execute(self, context: Context) -> Any:
        from airflow_trials.execution.driver.sweep_client import (
            claim_driver,
            start_or_attach_driver,
        )
        from airflow_trials.execution.trainable_api import load_trainable
        from airflow_trials.operators.lineage import openlineage_enabled

        ti = context["ti"]
        experiment, suggested = self._run_ids(context)
        load_trainable(self.trainable)  # an unknown path fails here, before any Ray work
        hook = self._hook()
        spec = self._sweep_spec(hook, ti.run_id, experiment, suggested)
        driver, started = start_or_attach_driver(spec)
        claim_driver(driver, spec, ti.try_number, started)
        self.log.info(
            "%s the sweep driver %s of %d trials on Ray.",
            "Started" if started else "Re-attached to",
            spec.name,
            suggested.count,
        )
        trigger = SweepTrigger(
            experiment,
            ti.run_id,
            suggested.run_pk,
            suggested.count,
            try_number=ti.try_number,
            ray_conn_id=self.ray_conn_id,
            trials_conn_id=self.trials_conn_id,
            poll_interval_seconds=self.poll_interval_seconds,
            progress_interval_seconds=self.progress_interval_seconds,
            warm_started_trials=len(suggested.origins),
            push_return_value=self.do_xcom_push,
            # Airflow's listeners (OpenLineage's) hear of a task's end only in a worker.
            end_in_trigger=not self.outlets and not openlineage_enabled(),
        )
        if self.deferrable:
            self.defer(trigger=trigger, method_name="execute_complete")
        self.log.info("Not deferrable: watching the sweep from the worker.")
        return self.execute_complete(context, asyncio.run(_first_event(trigger)))

    def _sweep_spec(
        self, hook: TrialsHook, run_id: str, experiment: str, suggested: SuggestedTrials
    ) -> Any:
        """What the sweep's driver on Ray runs: the trials (a reference's are read by the driver
        from the trials DB), their goal, settings and searcher, and where they record and store."""
        from airflow_trials.execution.driver.sweep_driver import SweepSpec

        client = hook.get_actor_client()
        settings = hook.ray_hook.settings()
        return SweepSpec(
            experiment_name=experiment,
            run_key=run_id,
            experiment_run_id=suggested.run_pk,
            trainable=self.trainable,
            trials=suggested.listed,
            metric=self.metric,
            mode=self.mode,
            db_url=hook.db_hook.get_url(),
            storage_path=client.storage.storage_path,
            namespace=settings["namespace"],
            trial_kwargs=self._trial_kwargs(suggested),
            scheduler=self._scheduler_for_run(suggested),
            max_concurrent_trials=self.max_concurrent_trials,
            origins=suggested.origins,
            search_alg=self.search_alg,
            warm_points=list(suggested.settings.get("warm_points") or ()),
            stored_run_key=self._stored_run_key(hook, experiment, suggested.run_pk, run_id),
        )

    def _scheduler_for_run(self, suggested: SuggestedTrials) -> Any:
        """The scheduler; an extension that raises the stop (``airflow-trials extend``) gives
        ASHA the raised ``max_t`` in its first trial's entry."""
        from airflow_trials.core.run_extension import SWEEP_MAX_T
        from airflow_trials.schedulers.asha.async_hyperband import with_max_t

        max_t = suggested.settings.get(SWEEP_MAX_T)
        return self.scheduler if max_t is None else with_max_t(self.scheduler, max_t)

    @staticmethod
    def _stored_run_key(hook: TrialsHook, experiment: str, run_pk: int, run_id: str) -> str | None:
        """The key of the run the trials belong to when it is not this DAG run's: an extension
        (``airflow-trials extend``) records into the finished run it extends."""
        store = hook.get_store()
        try:
            key = next(
                r.run_key for r in store.reader.list_experiment_runs(experiment) if r.id == run_pk
            )
        finally:
            store.dispose()
        return None if key == run_id else key

    def execute_complete(self, context: Context, event: dict[str, Any]) -> dict[str, Any]:
        """The run ended: push and return its counts and best trial. A lost or failed driver
        raises, and Airflow's retry resumes the run. (Under a triggerer, a run that finished ends
        the task from there, with the same XComs, and this is not called.)"""
        end = SweepEnd.from_event(event)
        if end.status is SweepStatus.LOST:
            raise SweepLostError(end.error)
        if end.status is SweepStatus.ERROR:
            raise SweepLostError(
                f"The sweep driver of run {end.run_key} failed; the task's next "
                f"try resumes the run's unfinished trials.\n{end.error}"
            )
        summary = sweep_summary(end.run_key, end.progress, warm_started(self.trials))
        self.log.info("%s", end_line(summary))
        context["ti"].xcom_push(key="sweep", value=summary)
        # For get_openlineage_facets_on_complete; read without raising: the run has ended.
        run_pk = sweep_run_pk(self.trials)
        if run_pk is not None:
            from airflow_trials.operators.trial_operator import experiment_name_for

            experiment = self.experiment_name or experiment_name_for(context["ti"].dag_id)
            self._ended_run = (experiment, run_pk)
        return summary

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> OperatorLineage:
        """OpenLineage, for a sweep that ended: the experiment run and trainable (job facets),
        the best finished trial by the first metric (as the progress lines rank them): its best
        checkpoint (the output dataset), config and value (run facet); see
        :mod:`airflow_trials.operators.lineage`."""
        from airflow.providers.openlineage.extractors import OperatorLineage

        from airflow_trials.operators.lineage import operator_lineage, read_run_lineage

        ended = getattr(self, "_ended_run", None)
        if ended is None:  # failed before the run ended (Airflow asks on failure too)
            return OperatorLineage()
        experiment, run_pk = ended
        goal = Goal.of(self.metric, self.mode)
        hook = self._hook()
        store = hook.get_store()
        try:
            # The run's best as select_best names it (store/board.py).
            top = store.reader.board(run_pk, goal).best
        finally:
            store.dispose()
        best: dict[str, Any] = {}
        if top is not None:
            best = {
                "trial_id": top.trial_id,
                "config": top.config,
                "metrics": dict(top.values),
                "modes": {m: str(mode) for m, mode in zip(goal.metrics, goal.modes, strict=True)},
                "checkpoint": top.best_checkpoint,
            }
        return operator_lineage(read_run_lineage(hook, experiment, run_pk, self.trainable, **best))

    def on_kill(self) -> None:
        """Killed while in the worker (not deferred): nothing to stop; the driver runs on, and the
        next try re-attaches to it."""


async def _first_event(trigger: SweepTrigger) -> dict[str, Any]:
    async for event in trigger.run():
        return dict(event.payload)
    raise SweepLostError(f"The sweep trigger of run {trigger.run_key} ended without an event.")


def _checked_goal(owner: str, metric: Any, mode: Any, scheduler: Any) -> tuple[Any, Any]:
    """The metric(s) and mode(s), checked, and that the scheduler can judge them; ValueError
    when not."""
    metric, mode = check_metrics(owner, metric, mode)
    if not isinstance(mode, list) and mode not in ("min", "max"):
        raise ValueError(f"{owner}: mode must be 'min' or 'max', got {mode!r}.")
    if scheduler is not None:
        judged_metric_and_mode(scheduler, metric, mode)
    return metric, mode


def _checked_searcher(owner: str, search_alg: Any, metric: Any, mode: Any) -> Any:
    """``search_alg`` as the sweep's driver asks it; ValueError when, used alone, it needs a
    search space the operator does not have."""
    try:
        return airflow_searcher(search_alg, {}, metric, mode)
    except ValueError as e:
        raise ValueError(
            f"{owner}: {e} Used alone, the operator has no search space to give it: pass the "
            "space to the searcher, OptunaSearch({'lr': loguniform(1e-4, 1e-1)}, ...)."
        ) from e


def _hold_pool_slots(
    owner: str,
    kwargs: dict[str, Any],
    gpu_pool: str,
    gpu: float,
    slots_per_gpu: int,
    max_concurrent_trials: int | None,
) -> None:
    """Set the task's ``pool`` and ``pool_slots`` (unless given): the slots of its most trials at
    once; ValueError without ``max_concurrent_trials``."""
    if max_concurrent_trials is None:
        raise ValueError(
            f"{owner}: gpu_pool {gpu_pool!r} needs max_concurrent_trials, which sets how many "
            "trials' pool slots the sweep task holds; pass max_concurrent_trials=N."
        )
    kwargs["pool"] = gpu_pool
    kwargs.setdefault("pool_slots", gpu_pool_slots(gpu, slots_per_gpu) * max_concurrent_trials)


def _best_first(metric: Any, mode: Any) -> str:
    """The default checkpoint_score_attr: the (first) metric, ``min-`` prefixed when lower is
    better."""
    first, first_mode = (metric[0], mode[0]) if isinstance(metric, list) else (metric, mode)
    return str(first) if first_mode == "max" else f"min-{first}"
