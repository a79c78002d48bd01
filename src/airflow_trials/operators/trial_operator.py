"""RunTrialOperator: runs one trial on Ray as a deferrable Airflow task."""

from __future__ import annotations

import asyncio
import hashlib
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator, Context, conf
from airflow.sdk.exceptions import AirflowFailException

from airflow_trials.core.airflow_tries import first_try_after_a_clear, retries_left
from airflow_trials.core.end import TrialEnd
from airflow_trials.core.fate import Start, Transition, after_failure, on_start
from airflow_trials.core.parameters import refuse_in_airflow
from airflow_trials.core.resources import Resources
from airflow_trials.core.trial import Trial, check_max_failures, validate_name
from airflow_trials.exceptions import StoreError, TrialError
from airflow_trials.hooks.trials import DEFAULT_RAY_CONN_ID, DEFAULT_TRIALS_CONN_ID, TrialsHook
from airflow_trials.operators.links import TrialDashboardLink
from airflow_trials.operators.task_handle import handle_kept, write_handle
from airflow_trials.operators.trial_end import end_state, raise_failure, record_end
from airflow_trials.operators.trial_start import check_capacity, launch, ran_before, record_start
from airflow_trials.operators.tuning import (
    judged_rule,
    needs_run,
    scheduler_settings,
    suggested_config,
)
from airflow_trials.pools import DEFAULT_SLOTS_PER_GPU, gpu_pool_slots
from airflow_trials.provider_config import setting_float
from airflow_trials.schedulers.registry import JudgedScheduler
from airflow_trials.triggers.trial_trigger import TrialTrigger, stored_end_event

if TYPE_CHECKING:
    from airflow.providers.openlineage.extractors import OperatorLineage

    from airflow_trials.store.records import TrialRecord

# Airflow has no unlimited retries; max_failures=-1 maps to this many.
UNLIMITED_RETRIES = 10_000
# Airflow retries a trial task gets beyond its max_failures, for trials lost to infrastructure
# (their node, or a Ray head restart): such a loss fails the try, and the retry resumes the trial
# without counting a failure of the trial.
MAX_INFRASTRUCTURE_RESTARTS = 3


def task_retries(max_failures: int) -> int:
    """A trial task's Airflow ``retries``: its ``max_failures`` (-1: unlimited) plus
    MAX_INFRASTRUCTURE_RESTARTS for losses that are not the trial's failures."""
    return UNLIMITED_RETRIES if max_failures < 0 else max_failures + MAX_INFRASTRUCTURE_RESTARTS


def default_trial_id(dag_id: str, run_id: str, task_id: str, map_index: int) -> str:
    """A trial id that is the same on every try of one task instance, so a retry finds its trial."""
    digest = hashlib.sha1(f"{dag_id}\0{run_id}\0{task_id}\0{map_index}".encode()).hexdigest()[:16]
    return f"t{digest}"


def experiment_name_for(dag_id: str) -> str:
    """A valid experiment name from a DAG id (dots and other characters become '-')."""
    name = re.sub(r"[^A-Za-z0-9._-]", "-", dag_id).strip(".-_") or "experiment"
    return validate_name("Experiment name", name[:128].replace("..", "-"))


class RunTrialOperator(BaseOperator):
    """Runs one trial of a trainable on Ray, deferring while it trains so no worker slot is held.

    ``execute`` registers the trial in the trials store, then either re-attaches to the trial's
    live actor (a previous try's worker died), or starts it, restoring the latest checkpoint in
    the store when this is a retry. It then defers to :class:`TrialTrigger`, which records results
    as they come. ``execute_complete`` pushes the trial's state to XCom and returns it when the
    trial TERMINATED; it raises :class:`TrialError` when it failed, and Airflow retries it while
    ``max_failures`` allows (the task's ``retries`` are ``max_failures`` + 3: a trial lost to
    infrastructure is retried without spending one of its ``max_failures``).

    :param trainable: import path of the trainable, ``"package.module:name"``. Templated.
    :param config: the trial's hyperparameters (JSON). Templated.
    :param experiment_name: default: the DAG id. Templated.
    :param trial_id: default: a stable id derived from the task instance. Templated.
    :param experiment_run_id: store id of the experiment run the trial belongs to; default none.
    :param resources_per_trial: e.g. ``{"cpu": 1, "gpu": 0.5}``, or several bundles as a
        :class:`~airflow_trials.PlacementGroupFactory`; default 1 CPU. (Named so because
        ``resources`` is BaseOperator's own argument.)
    :param stopping_criterion: thresholds such as ``{"training_iteration": 10}``; default none.
    :param checkpoint_freq: checkpoint every N iterations (class trainables); default 0.
    :param checkpoint_at_end: checkpoint when the trial ends; default True.
    :param keep_checkpoints_num: keep that many checkpoints; default all.
    :param checkpoint_score_attr: metric ranking checkpoints (``min-`` prefix: lower is better).
    :param max_failures: retries of the trial from its latest checkpoint; sets ``retries`` unless
        given; -1 means (practically) unlimited. Default: ``retries`` when given, else 0. Below
        ``retries`` (a run's params chose it), the task stops retrying at ``max_failures``.
    :param restore_path: checkpoint to warm-start from on the first try; default none.
    :param gpu_pool: Airflow pool enforcing GPU limits; when set (and ``pool`` is not),
        the task takes ``ceil(gpu * slots_per_gpu)`` slots of it, ``gpu`` the sum over a
        PlacementGroupFactory's bundles. Default none.
    :param slots_per_gpu: pool slots per GPU; default 4.
    :param ray_conn_id: default ``ray_default``. :param trials_conn_id: default ``trials_default``.
    :param poll_interval_seconds: how often the trigger polls the trial; default
        ``[airflow_trials] poll_interval_seconds`` (2).
    :param deferrable: defer while the trial trains, watched by the triggerer, holding no worker
        slot; default ``[operators] default_deferrable``, as Airflow's providers do. That is False
        in stock Airflow: the task then watches its trial from the worker, holding a worker slot
        for the whole run, and the triggerer's guarantees of ``docs/reliability.md`` do not apply.
        ``tuning_experiment`` passes True.
        When False, the task polls in the worker (holding its slot).
    :param scheduler: an ``ASHAScheduler``, a ``MOASHA`` or a ``MedianStoppingRule`` (or their
        rules' ``to_dict()``): the trial waits at each of its rungs (ASHA, MOASHA) or at each
        result from ``grace_period`` (the median rule) while its trigger judges it against the
        experiment run's other trials in the trials DB, and stops there when the rule says so
        (docs/airflow.md, "Early stopping").
        Needs ``experiment_run_id``. Default None: it runs to its stopping criterion.
    :param search_alg: an ``OptunaSearch`` (space, metric and mode set): the trial's first try asks
        it for the config, after the run's ended trials (``operators/search.py``), and ``config``
        is ignored. Needs ``experiment_run_id``. Default None: ``config`` is the config.
    :param warm_start: where this warm-started trial came from (``run_key``, ``trial_id``, ...;
        set by ``tuning_experiment(warm_start=...)``): ``config`` is that trial's, never asked of
        ``search_alg``, and the store and XCom say so. Default None.
    :param warm_points: ``[config, value]`` of a warm start's seeds (``[config, value, last
        result]`` for a searcher with constraints), learnt by ``search_alg`` before the run's own
        ended trials; default none.
    """

    template_fields: Sequence[str] = ("trainable", "config", "experiment_name", "trial_id")
    template_fields_renderers = {"config": "json"}
    ui_color = "#c6e4ff"
    operator_extra_links = (TrialDashboardLink(),)

    def __init__(
        self,
        *,
        trainable: str,
        config: Mapping[str, Any] | None = None,
        experiment_name: str | None = None,
        trial_id: str | None = None,
        experiment_run_id: int | None = None,
        resources_per_trial: Mapping[str, Any] | Resources | None = None,
        stopping_criterion: Mapping[str, float] | None = None,
        checkpoint_freq: int = 0,
        checkpoint_at_end: bool = True,
        keep_checkpoints_num: int | None = None,
        checkpoint_score_attr: str | None = None,
        max_failures: int | None = None,
        restore_path: str | None = None,
        gpu_pool: str | None = None,
        slots_per_gpu: int = DEFAULT_SLOTS_PER_GPU,
        ray_conn_id: str = DEFAULT_RAY_CONN_ID,
        trials_conn_id: str = DEFAULT_TRIALS_CONN_ID,
        poll_interval_seconds: float | None = None,
        deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
        scheduler: Any = None,
        search_alg: Any = None,
        warm_start: Mapping[str, Any] | None = None,
        warm_points: Sequence[Sequence[Any]] | None = None,
        **kwargs: Any,
    ) -> None:
        refuse_in_airflow(trainable, f"RunTrialOperator {kwargs.get('task_id')!r}")
        max_failures = _task_kwargs(
            kwargs, max_failures, resources_per_trial, gpu_pool, slots_per_gpu
        )
        super().__init__(**kwargs)
        self.trainable = trainable
        self.config = dict(config or {})
        self.experiment_name = experiment_name
        self.trial_id = trial_id
        self.experiment_run_id = experiment_run_id
        self.resources_per_trial = Resources.spec_of(resources_per_trial)
        self.stopping_criterion = dict(stopping_criterion) if stopping_criterion else None
        self.checkpoint_freq = checkpoint_freq
        self.checkpoint_at_end = checkpoint_at_end
        self.keep_checkpoints_num = keep_checkpoints_num
        self.checkpoint_score_attr = checkpoint_score_attr
        self.max_failures = max_failures
        self.restore_path = restore_path
        self.gpu_pool, self.slots_per_gpu = gpu_pool, slots_per_gpu
        self.ray_conn_id, self.trials_conn_id = ray_conn_id, trials_conn_id
        self.poll_interval_seconds = (
            setting_float("poll_interval_seconds")
            if poll_interval_seconds is None
            else poll_interval_seconds
        )
        self.deferrable = deferrable
        self.scheduler = scheduler_settings(scheduler)
        self.search_alg = search_alg
        self.warm_start = dict(warm_start) if warm_start else None
        self.warm_points = [list(p) for p in warm_points or ()]

    # -- helpers --------------------------------------------------------------------------------
    def _ids(self, context: Context) -> tuple[str, str]:
        ti = context["ti"]
        experiment = self.experiment_name or experiment_name_for(ti.dag_id)
        return experiment, self.trial_id_for(ti)

    def trial_id_for(self, ti: Any) -> str:
        """The trial that task instance ``ti`` (or its key) runs: ``trial_id``, else an id derived
        from the task instance, the same on every try."""
        map_index = -1 if ti.map_index is None else ti.map_index
        return self.trial_id or default_trial_id(ti.dag_id, ti.run_id, ti.task_id, map_index)

    def _trial(self, experiment: str, trial_id: str, restore_path: str | None) -> Trial:
        # Building the Trial validates ids (no path traversal), the config (JSON) and resources.
        return Trial(
            self.trainable,
            self.config,
            trial_id=trial_id,
            experiment_name=experiment,
            resources=self.resources_per_trial,
            stopping_criterion=self.stopping_criterion,
            checkpoint_freq=self.checkpoint_freq,
            checkpoint_at_end=self.checkpoint_at_end,
            keep_checkpoints_num=self.keep_checkpoints_num,
            checkpoint_score_attr=self.checkpoint_score_attr,
            max_failures=self.max_failures,
            restore_path=restore_path,
        )

    def _hook(self) -> TrialsHook:
        return TrialsHook(self.ray_conn_id, self.trials_conn_id)

    def _ask(self, context: Context, trial_id: str) -> dict[str, Any]:
        """The trial's config from ``search_alg`` (asked once, on its first try)."""
        run_id = needs_run(
            self.experiment_run_id, "search_alg= learns from", self.task_id, trial_id
        )
        map_index = context["ti"].map_index
        store = self._hook().get_store()
        try:
            return suggested_config(
                store,
                self.search_alg,
                run_id,
                trial_id,
                max(map_index or 0, 0),
                self.log,
                warm_points=self.warm_points,
            )
        except StoreError:
            raise  # the trials DB: Airflow retries the task
        except Exception as e:  # the searcher's own error: asking again would raise it again
            raise AirflowFailException(
                f"Trial {trial_id}: {type(self.search_alg).__name__} raised {type(e).__name__} "
                f"when asked for its config: {e}. The trial did not start and nothing was written "
                "for it; the run's other trials and their results are kept. Fix the searcher or "
                "its search space, then clear this task."
            ) from e
        finally:
            store.dispose()

    def _rungs(self, trial_id: str) -> tuple[JudgedScheduler | None, int]:
        """The scheduler's settings and the trial's ASHA bracket (the same on every try)."""
        return judged_rule(self.scheduler, self.task_id, self.experiment_run_id, trial_id)

    # -- execution ------------------------------------------------------------------------------
    def execute(self, context: Context) -> Any:
        from airflow_trials.execution.trainable_api import load_trainable

        experiment, trial_id = self._ids(context)
        self._started = (experiment, trial_id, context["ti"].try_number)  # for on_kill
        self._rungs(trial_id)  # a scheduler without a run fails here
        if self.search_alg is not None and self.warm_start is None:
            self.config = self._ask(context, trial_id)
        self._trial(experiment, trial_id, self.restore_path)  # validates ids, config and resources
        load_trainable(self.trainable)  # an unknown path fails here, before any Ray or DB work
        return self._start_or_attach(context)

    def _start_or_attach(self, context: Context) -> Any:
        """Re-attach to the trial's live actor, or start it (from its latest checkpoint), then
        defer."""
        experiment, trial_id = self._ids(context)
        hook = self._hook()
        store = hook.get_store()
        try:
            finished_event = self._launch_unless_running(context, hook, store, experiment, trial_id)
        finally:
            store.dispose()
        if finished_event is not None:
            return self.execute_complete(context, finished_event)
        from airflow_trials.execution.ray_state import current_cluster_id

        _, bracket = self._rungs(trial_id)
        trigger = TrialTrigger(
            experiment,
            trial_id,
            self.ray_conn_id,
            self.trials_conn_id,
            self.poll_interval_seconds,
            ray_cluster_id=current_cluster_id(),
            scheduler=self.scheduler,
            bracket=bracket,
            experiment_run_id=self.experiment_run_id if self.scheduler is not None else None,
        )
        if self.deferrable:
            self.defer(trigger=trigger, method_name="execute_complete")
        # Blocking fallback: the same polling, in this worker.
        self.log.info("Not deferrable: polling trial %s from the worker.", trial_id)
        return self.execute_complete(context, asyncio.run(_first_event(trigger)))

    def _launch_unless_running(
        self, context: Context, hook: TrialsHook, store: Any, experiment: str, trial_id: str
    ) -> dict[str, Any] | None:
        """Register the trial and make sure it runs on Ray, as
        :func:`~airflow_trials.core.fate.on_start` decides; its stored end when it already
        finished."""
        from airflow_trials.execution.ray_state import trial_actor_state

        ti = context["ti"]
        kept = handle_kept(context, store, experiment, trial_id)  # read before this try registers
        write_handle(context, experiment, trial_id)
        trial = self._trial(experiment, trial_id, self.restore_path)
        client = hook.get_actor_client()
        started_before = ran_before(store, trial_id)
        check_capacity(client, trial, started_before, self.log)
        store.upsert_trial(
            trial_id,
            trainable=self.trainable,
            config=trial.config,
            resources=trial.resources.to_dict(),
            max_failures=self.max_failures,
            experiment_run_id=self.experiment_run_id,
            dag_id=ti.dag_id,
            run_id=ti.run_id,
            task_id=ti.task_id,
            map_index=ti.map_index if ti.map_index is not None else -1,
            try_number=ti.try_number,
            warm_start=self.warm_start,
        )
        actor = trial_actor_state(client.attach(experiment, trial_id))
        record: TrialRecord = store.reader.get_trial(trial_id)
        # A first try is never after a clear (max_tries is read only for a later one).
        cleared = ti.try_number > 1 and first_try_after_a_clear(
            ti.try_number, ti.max_tries, self.retries or 0
        )
        action = on_start(
            record, actor, trial=trial, try_number=ti.try_number, cleared=cleared, handle_kept=kept
        )
        self.log.info("%s", action.reason)
        if action.start is Start.REPORT_END:
            return stored_end_event(store, experiment, record)
        placed = action.placed
        if action.launches:
            if action.stop_actor:
                client.terminate(experiment, trial_id)
            record_start(store, client, action, trial_id, ti.try_number, self.log)
            rungs, bracket = self._rungs(trial_id)
            holds = rungs.hold_spec(bracket) if rungs else None
            placed = launch(store, client, trial, holds, started_before, self.log)
        if not placed:
            self.log.info("Trial %s waits for Ray resources (%s).", trial_id, trial.resources)
        transition = Transition.PLACED if placed else Transition.QUEUED
        store.record_transition(trial_id, transition, try_number=ti.try_number)
        return None

    def execute_complete(
        self, context: Context, event: dict[str, Any], infrastructure_restarts: int = 0
    ) -> dict[str, Any]:
        """Record the trial's end and push its state to XCom; raise so that Airflow retries it, or
        fails it, as :func:`~airflow_trials.core.fate.after_failure` decides
        (:mod:`~airflow_trials.operators.trial_end`).

        ``infrastructure_restarts`` is accepted and ignored: tasks deferred before an upgrade
        pass it.
        """
        ti = context["ti"]
        end = TrialEnd.from_event(event)
        hook = self._hook()
        store = hook.get_store()
        try:
            if not end.released:
                # The trigger frees what it watched; otherwise (lost actor, blocking fallback
                # from an older trigger) remove what may be left. Skipping it spares this worker
                # a Ray connection.
                hook.get_actor_client().terminate(end.experiment_name, end.trial_id)
            record = store.reader.get_trial(end.trial_id)
            decision = None
            can_retry = retries_left(ti.try_number, self.retries or 0)
            if not end.finished:
                # The trial's own max_failures can be below the task's retries (a run's params
                # chose it; retries are fixed when the task instance is created): it stops first.
                decision = after_failure(
                    end.trial_id,
                    record.num_failures,
                    self.max_failures,
                    infrastructure=end.infrastructure,
                    retries_left=can_retry,
                )
            status = record_end(store, end, decision, ti.try_number, self.log)
            latest = store.reader.latest_checkpoint(end.trial_id)
        finally:
            store.dispose()
        state = end_state(end, record, status, decision, latest.path if latest else None)
        ti.xcom_push(key="trial", value=state)
        self._end_state = state  # for get_openlineage_facets_on_complete
        if decision is not None:
            raise_failure(
                end,
                decision,
                can_retry=can_retry,
                max_failures=self.max_failures,
                retries=self.retries,
                log=self.log,
            )
        self.log.info(
            "Trial %s finished%s: %s",
            end.trial_id,
            f" ({end.stop_reason})" if end.stop_reason else "",
            state["last_result"],
        )
        return state

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> OperatorLineage:
        """OpenLineage, for a trial that TERMINATED: its experiment run and trainable (job
        facets), its best checkpoint (the output dataset), its config and last reported metrics
        (run facet); see :mod:`airflow_trials.operators.lineage`."""
        from airflow.providers.openlineage.extractors import OperatorLineage

        from airflow_trials.operators.lineage import numbers_of, operator_lineage, read_run_lineage

        state: dict[str, Any] | None = getattr(self, "_end_state", None)
        if state is None:  # failed before its trial ended (Airflow asks on failure too)
            return OperatorLineage()
        return operator_lineage(
            read_run_lineage(
                self._hook(),
                state["experiment_name"],
                self.experiment_run_id,
                self.trainable,
                trial_id=state["trial_id"],
                config=state["config"],
                metrics=numbers_of(state["last_result"]),
                checkpoint=state["best_checkpoint"],
            )
        )

    def on_kill(self) -> None:
        """The task was killed while it ran in the worker: stop the trial on Ray too.

        (A deferred task is not in a worker; its trigger stops the trial when cancelled.)
        """
        started = getattr(self, "_started", None)
        if started is None:
            return
        experiment, trial_id, try_number = started
        self._hook().stop_from_airflow(experiment, trial_id, try_number)


def _task_kwargs(
    kwargs: dict[str, Any],
    max_failures: int | None,
    resources_per_trial: Mapping[str, Any] | Resources | None,
    gpu_pool: str | None,
    slots_per_gpu: int,
) -> int:
    """Set the task's ``retries`` (and its ``pool`` from ``gpu_pool``) in ``kwargs``, unless
    given; the trial's ``max_failures`` (default: ``retries``, else 0)."""
    if max_failures is None:
        retries = kwargs.get("retries")
        max_failures = (
            0 if retries is None else -1 if retries >= UNLIMITED_RETRIES else int(retries)
        )
    max_failures = check_max_failures(max_failures)
    kwargs.setdefault("retries", task_retries(max_failures))
    gpu = Resources.from_dict(resources_per_trial).gpu
    if gpu_pool and gpu > 0 and "pool" not in kwargs:
        kwargs["pool"] = gpu_pool
        kwargs.setdefault("pool_slots", gpu_pool_slots(gpu, slots_per_gpu))
    return max_failures


async def _first_event(trigger: TrialTrigger) -> dict[str, Any]:
    async for event in trigger.run():
        return dict(event.payload)
    raise TrialError(
        f"Trigger for trial {trigger.trial_id} ended without an event.", trigger.trial_id
    )
