"""TuningPlan: what ``tuning_experiment`` declared, and the bodies of its suggest, trial and select
tasks."""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from airflow.sdk import Asset
from airflow.sdk.exceptions import AirflowFailException

from airflow_trials.core.approval_rule import ApprovalPolicy
from airflow_trials.core.constraints import Constraints
from airflow_trials.core.pareto import scheduler_metric_and_mode
from airflow_trials.core.pick import Pick
from airflow_trials.core.regression_tolerance import RegressionTolerance
from airflow_trials.core.scheduler import judged_metric_and_mode
from airflow_trials.core.search import generate_configs
from airflow_trials.core.trial import Trial
from airflow_trials.core.warm_start import WarmStart, WarmStartError
from airflow_trials.experiment.cluster_refusal import check_fits_cluster_or_refuse_params
from airflow_trials.experiment.extension import extension_entries, extension_requested
from airflow_trials.experiment.one_best import select_one_best
from airflow_trials.experiment.pareto_best import select_pareto_best
from airflow_trials.experiment.settings import (
    PARAM_SETTINGS,
    ExperimentSettings,
    check_params,
    run_seed,
    trial_ids,
)
from airflow_trials.experiment.warm_start_source import WarmSeeds, warm_seeds
from airflow_trials.export.mlflow_mapping import MlflowExport
from airflow_trials.hooks.trials import TrialsHook
from airflow_trials.operators.suggested_trials import SuggestedTrials
from airflow_trials.operators.trial_operator import RunTrialOperator, task_retries
from airflow_trials.operators.tuning import airflow_searcher
from airflow_trials.pools import gpu_pool_slots
from airflow_trials.schedulers.registry import judged_scheduler

# Settings every suggested trial carries (not partial arguments): an extension raises them.
_VARYING = ("stopping_criterion", "scheduler")


@dataclasses.dataclass(frozen=True)
class TuningPlan:
    """One experiment as the DAG file declares it (see
    :func:`~airflow_trials.experiment.tuning_experiment`
    for each field), and what its tasks do with it at run time.

    **Settings from the DAG run's params.** ``from_params(params)`` returns, for each run, values
    that replace any of :data:`~airflow_trials.experiment.settings.PARAM_SETTINGS`. The trainable
    is never among them: params choose values, not code. :meth:`settings_for_run` validates them
    before anything starts or is written, and fails the run, naming the setting, if one is out of
    range. Airflow fixes ``retries`` and pool slots when it creates a task instance, so the DAG
    file's ``max_failures`` is the most a run may ask for (the operator stops retrying at the
    run's own value), and a run's GPUs per trial must be one of the GPU classes.
    """

    experiment_name: str
    trainable: str
    settings: ExperimentSettings
    gpu_classes: list[float]
    asset: Asset
    seed: int | None
    retry_delay: dt.timedelta | None
    checkpoint_freq: int
    checkpoint_at_end: bool
    keep_checkpoints_num: int | None
    checkpoint_score_attr: str | None
    gpu_pool: str | None
    slots_per_gpu: int
    from_params: Callable[[Mapping[str, Any]], Mapping[str, Any]] | None
    ray_conn_id: str
    trials_conn_id: str
    poll_interval_seconds: float | None  # None: [airflow_trials] poll_interval_seconds
    deferrable: bool
    scheduler: Any = None
    search_alg: Any = None
    max_concurrent_trials: int | None = None
    sweep: bool = False
    warm_start: WarmStart | None = None
    gpu_queue: str | None = None
    pick: Mapping[str, Any] | None = None
    regression_tolerance: RegressionTolerance | None = None
    mlflow_export: MlflowExport | None = None
    approval: ApprovalPolicy | None = None  # approval=True: who may approve
    data_version: Asset | str | None = None  # experiment/data_version.py
    searcher: Any = dataclasses.field(
        default=None, init=False
    )  # search_alg, set up for the trial tasks

    def __post_init__(self) -> None:
        # A scheduler or searcher the Airflow path cannot run fails when the DAG file is parsed.
        try:
            if self.sweep:
                self._check_sweep()
            self.pick_for(self.settings)
            self.scheduler_settings(self.settings)
            object.__setattr__(self, "searcher", self._searcher())  # frozen: set once, here
            if self.max_concurrent_trials is not None and not self.max_concurrent_trials >= 1:
                raise ValueError(
                    f"max_concurrent_trials must be 1 or more, got {self.max_concurrent_trials}"
                )
        except ValueError as e:
            raise ValueError(f"Experiment {self.experiment_name}: {e}") from e

    def _check_sweep(self) -> None:
        if self.gpu_pool and self.settings.resources.gpu > 0 and self.max_concurrent_trials is None:
            raise ValueError(
                f"sweep=True with gpu_pool {self.gpu_pool!r} needs max_concurrent_trials: the "
                "sweep task holds "
                "that many trials' pool slots; pass max_concurrent_trials=N."
            )
        if len(self.gpu_classes) > 1:
            raise ValueError(
                "sweep=True runs one GPU class: drop gpus_per_trial_choices, or leave out "
                "sweep=True."
            )
        if self.scheduler is not None:
            judged_metric_and_mode(self.scheduler, self.settings.metric, self.settings.mode)

    @property
    def constraints(self) -> Constraints:
        """The searcher's constraints (``OptunaSearch(constraints=...)``); empty without."""
        return getattr(self.searcher, "constraints", None) or Constraints()

    def pick_for(self, settings: ExperimentSettings) -> Pick | None:
        """How ``select_best`` chooses among several metrics (:class:`~airflow_trials.core.pick
        .Pick`), checked against ``settings``' metrics; None with one metric. ValueError for a
        pick that names no metric of the experiment, or a pick with one metric."""
        if not isinstance(settings.metric, list) or not isinstance(settings.mode, list):
            if self.pick is not None:
                raise ValueError(
                    f"pick={dict(self.pick)!r} chooses among several metrics, but the experiment "
                    f"has one, {settings.metric!r}, whose best trial select_best returns; leave "
                    "out pick, or give metric and mode as lists."
                )
            return None
        return Pick.of("select_best", self.pick, settings.metric, settings.mode)

    def _searcher(self) -> Any:
        """``search_alg`` set up for the trial tasks, which ask it (``operators/tuning.py``)."""
        if self.search_alg is None:
            return None
        s = self.settings
        return airflow_searcher(self.search_alg, s.search_space, s.metric, s.mode)

    # -- settings ----------------------------------------------------------------------------

    def settings_for_run(self, context: Mapping[str, Any]) -> ExperimentSettings:
        """The DAG file's settings with this run's ``from_params`` applied and checked."""
        if self.from_params is None:
            return self.settings
        try:
            params = dict(context["params"])
            check_params(params, context)
            overrides = self.from_params(params)
            if not isinstance(overrides, Mapping):
                raise ValueError(
                    f"from_params must return a dict of settings, got {type(overrides).__name__}"
                )
            unknown = sorted(set(overrides) - set(PARAM_SETTINGS))
            if unknown:
                raise ValueError(
                    f"from_params returned {unknown}; it may set only {list(PARAM_SETTINGS)}"
                )
            run = ExperimentSettings.validated(
                **{**self.settings.as_kwargs(), **overrides}, sweep=self.sweep
            )
            self._check_fixed_at_parse_time(run)
        except (ValueError, TypeError, KeyError) as e:
            raise AirflowFailException(
                f"Experiment {self.experiment_name}, DAG run {context['ti'].run_id}: the run's "
                "params are "
                f"refused: {str(e).rstrip('.')}. No trial was started and nothing was written; "
                "trigger the "
                "DAG again with corrected params."
            ) from e
        return run

    def scheduler_settings(self, settings: ExperimentSettings) -> dict[str, Any] | None:
        """The trial tasks' ``scheduler``: ASHA's rungs or the median rule, with the run's metric
        and mode where the scheduler has none; ValueError for a scheduler the Airflow path cannot
        run.
        None for a sweep, whose driver runs the scheduler itself."""
        if self.scheduler is None or self.sweep:
            return None
        # Several metrics: a scheduler judges one of them, unless its class sets
        # takes_several_metrics (MOASHA), which is handed the lists.
        judged_by: tuple[Any, Any] = scheduler_metric_and_mode(
            self.scheduler, settings.metric, settings.mode
        )
        return judged_scheduler(self.scheduler, *judged_by).to_dict()

    def _check_fixed_at_parse_time(self, run: ExperimentSettings) -> None:
        self.scheduler_settings(run)
        self.pick_for(run)
        if self.regression_tolerance is not None:
            self.regression_tolerance.check_metrics(run.several_metrics)
        fixed = (self.settings.search_space, self.settings.metric, self.settings.mode)
        if self.search_alg is not None and (run.search_space, run.metric, run.mode) != fixed:
            raise ValueError(
                "with a search_alg, the search space, metric and mode are the DAG file's (the "
                "trial tasks ask "
                "the searcher the DAG file set up); leave them out of from_params"
            )
        if (
            self.settings.max_failures >= 0
            and not 0 <= run.max_failures <= self.settings.max_failures
        ):
            raise ValueError(
                f"max_failures {run.max_failures} is above {self.settings.max_failures}, the DAG "
                "file's "
                "max_failures, which sets the trial tasks' retries; ask for at most that"
            )
        if self.gpu_pool and run.resources.gpu not in self.gpu_classes:
            raise ValueError(
                f"{run.resources.gpu:g} GPUs per trial is not one of "
                f"{[f'{g:g}' for g in self.gpu_classes]}, "
                "the GPU pool's trial classes (gpus_per_trial_choices); pick one of those"
            )

    # -- suggest_configs -----------------------------------------------------------------------

    def suggest(
        self, context: Mapping[str, Any], data_version: str | None = None
    ) -> list[dict[str, Any]]:
        """Generate the run's configs (its warm start's first), check them and the cluster, register
        the experiment run with ``data_version``; one mapped-argument dict per trial."""
        from airflow_trials.execution.trainable_api import load_trainable

        ti = context["ti"]
        run = self.settings_for_run(context)
        load_trainable(self.trainable)  # unknown path: fail before any Ray or DB work
        if extension_requested(context):
            return extension_entries(self, context, run)
        seed = (
            self.seed
            if self.seed is not None
            else run_seed(self.experiment_name, ti.dag_id, ti.run_id)
        )
        hook = TrialsHook(self.ray_conn_id, self.trials_conn_id)
        store = hook.get_store()
        try:
            warm = self._warm_seeds(store, run, context)
            configs = self._configs(run, seed, warm)
            ids = trial_ids(self.experiment_name, ti.dag_id, ti.run_id, len(configs))
            # Validate every trial (ids, JSON configs) and the cluster's capacity before writing;
            # each Trial is dropped once made: 100,000 of them would hold 160 MB, their configs few.
            made = (self._trial(i, c, run) for i, c in zip(ids, configs, strict=True))
            trials = [(t.trial_id, t.config) for t in made]
            check_fits_cluster_or_refuse_params(
                hook.get_actor_client(),
                self._trial(*trials[0], run),
                self.experiment_name,
                self.from_params,
                self.settings.resources,
                context,
            )
            run_pk = self._register_run(store, run, ti, seed, data_version)
        finally:
            store.dispose()
        # Settings that vary by run travel with each trial (they are mapped arguments).
        per_run = (
            self._per_trial_settings(run) if self.from_params is not None else self.varying(run)
        )
        entries = [
            {"trial_id": trial_id, "config": config, "experiment_run_id": run_pk, **per_run}
            for trial_id, config in trials
        ]
        if warm is not None:
            self._add_warm_start(entries, warm)
        return entries

    def _trial(self, trial_id: str, config: dict[str, Any], run: ExperimentSettings) -> Trial:
        """The run's trial ``trial_id``, checked (its id, a config JSON can hold)."""
        return Trial(
            self.trainable,
            config,
            trial_id=trial_id,
            experiment_name=self.experiment_name,
            resources=run.resources,
            stopping_criterion=run.stop,
        )

    def _register_run(
        self, store: Any, run: ExperimentSettings, ti: Any, seed: int, data_version: str | None
    ) -> int:
        """Record the experiment (its goal and constraints) and this DAG run's experiment run,
        with the version of the data it tunes on; its id."""
        store.ensure_experiment(
            self.experiment_name,
            metric=run.metric,
            mode=run.mode,
            constraints=self.constraints,  # the DAG file's: none clears earlier ones
        )
        return store.create_experiment_run(
            self.experiment_name,
            ti.run_id,
            dag_id=ti.dag_id,
            run_id=ti.run_id,
            search_space=run.search_space,
            seed=seed,
            num_samples=run.num_samples,
            data_version=data_version,
        )

    def _add_warm_start(self, entries: list[dict[str, Any]], warm: WarmSeeds) -> None:
        """Each entry's warm start (the seeds' first), and the seeds' results for the searcher."""
        for i, entry in enumerate(entries):
            entry.update(warm.entry(i) if i < len(warm.seeds) else {"warm_start": None})
            # The searcher learns the seeds' results before its first ask: each trial task asks
            # for itself; a sweep's driver reads them from the first entry only.
            if self.search_alg is not None and (i == 0 or not self.sweep):
                entry["warm_points"] = warm.points()

    def _warm_seeds(
        self, store: Any, run: ExperimentSettings, context: Mapping[str, Any]
    ) -> WarmSeeds | None:
        """This run's warm start (None: cold); a source that cannot be used fails the run, naming
        why."""
        if self.warm_start is None:
            return None
        run_id = context["ti"].run_id
        try:
            return warm_seeds(
                self.warm_start,
                store,
                self.experiment_name,
                run_id,
                run.search_space,
                run.metric,
                run.mode,
                context,
                self.asset,
                # Seeds told by value alone would count as feasible: a constrained searcher gets
                # their last results too.
                with_results=bool(self.constraints) and self.search_alg is not None,
            )
        except WarmStartError as e:
            raise AirflowFailException(
                f"Experiment {self.experiment_name}, DAG run {run_id}: the warm start is refused: "
                f"{e}. No trial was "
                "started and nothing was written."
            ) from e

    def _configs(
        self, run: ExperimentSettings, seed: int, warm: WarmSeeds | None
    ) -> list[dict[str, Any]]:
        """The run's configs: the warm start's seeds first, then generated ones (with a searcher,
        {}:
        each trial task asks for its config when it starts), ``num_samples`` x grid in all."""
        if self.search_alg:
            configs: list[dict[str, Any]] = [{}] * run.num_samples
        else:
            configs = generate_configs(run.search_space, run.num_samples, seed)
        if warm is None:
            return configs
        seeded = [dict(config) for config, _ in warm.seeds][: len(configs)]
        return seeded + configs[: len(configs) - len(seeded)]

    def _per_trial_settings(self, settings: ExperimentSettings) -> dict[str, Any]:
        return {
            "resources_per_trial": settings.resources.to_dict(),
            "stopping_criterion": settings.stop,
            "max_failures": settings.max_failures,
            "checkpoint_score_attr": self.checkpoint_score_attr or settings.checkpoint_score_attr,
            "scheduler": self.scheduler_settings(settings),
        }

    def varying(self, settings: ExperimentSettings) -> dict[str, Any]:
        """The trial settings every suggested trial carries even without ``from_params``: an
        extension of a finished run raises the stop, and ASHA's ``max_t`` with it."""
        return {key: self._per_trial_settings(settings)[key] for key in _VARYING}

    # -- trial tasks ---------------------------------------------------------------------------

    def trial_task(self, task_id: str, gpu: float, suggested: Any) -> Any:
        """The mapped RunTrialOperator of one GPU class, one task instance per suggested trial."""
        common: dict[str, Any] = {
            "trainable": self.trainable,
            "experiment_name": self.experiment_name,
            "checkpoint_freq": self.checkpoint_freq,
            "checkpoint_at_end": self.checkpoint_at_end,
            "keep_checkpoints_num": self.keep_checkpoints_num,
            "retries": task_retries(self.settings.max_failures),
            "ray_conn_id": self.ray_conn_id,
            "trials_conn_id": self.trials_conn_id,
            "poll_interval_seconds": self.poll_interval_seconds,
            "deferrable": self.deferrable,
            "map_index_template": "{{ task.trial_id }}",
            "search_alg": self.searcher,
        }
        if self.max_concurrent_trials is not None:
            common["max_active_tis_per_dagrun"] = self.max_concurrent_trials
        if self.from_params is None:
            fixed = self._per_trial_settings(self.settings)
            common.update({key: value for key, value in fixed.items() if key not in _VARYING})
        if self.retry_delay is not None:
            common["retry_delay"] = self.retry_delay
        if self.gpu_pool and gpu > 0:
            # Mapped tasks take pool and slots from these partial arguments, fixed per task.
            common.update(pool=self.gpu_pool, pool_slots=gpu_pool_slots(gpu, self.slots_per_gpu))
        if self.gpu_queue and gpu > 0:
            common["queue"] = self.gpu_queue
        return RunTrialOperator.partial(task_id=task_id, **common).expand_kwargs(suggested)

    def sweep_task(self, suggested: Any) -> Any:
        """The one RunSweepOperator that runs all the suggested trials (``sweep=True``)."""
        from airflow_trials.operators.sweep_operator import RunSweepOperator

        s = self.settings
        kwargs: dict[str, Any] = {}
        if self.retry_delay is not None:
            kwargs["retry_delay"] = self.retry_delay
        if self.gpu_queue and s.resources.gpu > 0:
            kwargs["queue"] = self.gpu_queue
        return RunSweepOperator(
            task_id="sweep",
            trainable=self.trainable,
            trials=suggested,
            metric=s.metric,
            mode=s.mode,
            experiment_name=self.experiment_name,
            resources_per_trial=s.resources.to_dict(),
            stopping_criterion=s.stop,
            checkpoint_freq=self.checkpoint_freq,
            checkpoint_at_end=self.checkpoint_at_end,
            keep_checkpoints_num=self.keep_checkpoints_num,
            checkpoint_score_attr=self.checkpoint_score_attr or s.checkpoint_score_attr,
            max_failures=s.max_failures,
            scheduler=self.scheduler,
            search_alg=self.searcher,
            max_concurrent_trials=self.max_concurrent_trials,
            gpu_pool=self.gpu_pool,
            slots_per_gpu=self.slots_per_gpu,
            ray_conn_id=self.ray_conn_id,
            trials_conn_id=self.trials_conn_id,
            poll_interval_seconds=self.poll_interval_seconds,
            deferrable=self.deferrable,
            **kwargs,
        )

    # -- select_best ---------------------------------------------------------------------------

    def select_best(
        self, suggested: Sequence[Mapping[str, Any]] | Mapping[str, Any] | None, context: Any
    ) -> dict[str, Any]:
        """Record the run's trial ends, finish the experiment run, and return its best trial.

        With several metrics, the run's Pareto front and the trial the experiment's ``pick``
        chooses from it (:func:`~airflow_trials.experiment.pareto_best.select_pareto_best`)."""
        run_id = context["ti"].run_id
        if not suggested:
            raise AirflowFailException(
                f"Experiment {self.experiment_name}: suggest_configs produced no trials in run "
                f"{run_id}; see its log for the reason."
            )
        try:  # the mapped path's list, or a sweep's reference to its registered trials
            trials = SuggestedTrials.of(suggested, f"Experiment {self.experiment_name}")
        except ValueError as e:
            raise AirflowFailException(str(e)) from e
        run = self.settings_for_run(context)
        pick = self.pick_for(run)
        if pick is not None:
            hook = TrialsHook(self.ray_conn_id, self.trials_conn_id)
            return select_pareto_best(
                self.experiment_name, hook, trials, context, pick, self.constraints
            )
        metric, mode = run.one_metric("select_best without a pick")
        hook = TrialsHook(self.ray_conn_id, self.trials_conn_id)
        return select_one_best(
            self.experiment_name, hook, trials, run_id, (metric, mode), self.constraints
        )
