"""The sweep driver: a detached named Ray actor that runs a whole experiment with the TrialRunner.

One driver per experiment run, found by its Ray name (:func:`driver_name`): whoever asks for it
with :func:`start_or_attach_driver` gets the live one, and Ray creates it only when none lives
(``get_if_exists``), so two tasks or two tries never start two drivers. The driver records every
trial in the trials DB as it goes
(:class:`~airflow_trials.execution.driver.trials_db_callback.TrialsDbCallback`)
and owns its trials' actors: when it dies, they die with it, and the next driver resumes the run
from the trials DB (:func:`resumable_trials`): finished trials are kept, the others continue from
their latest recorded checkpoint.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import threading
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import ray

from airflow_trials.core.goal import Goal
from airflow_trials.core.pareto import MetricSpec, ModeSpec
from airflow_trials.core.scheduler import FIFOScheduler, judged_metric_and_mode
from airflow_trials.core.searcher import ObjectiveValue, ended_trial_values
from airflow_trials.core.sweep_progress import SweepProgress, SweepSnapshot
from airflow_trials.core.trial import Trial
from airflow_trials.execution.driver.suggest import SearchDriver
from airflow_trials.execution.resume import adopt_checkpoints
from airflow_trials.storage.trial_storage import TrialStorage
from airflow_trials.store.engine import safe_url
from airflow_trials.store.records import TrialRecord
from airflow_trials.store.store import TrialStore

log = logging.getLogger(__name__)

#: How often a driver writes its trials' new results and checkpoints, in one transaction. Those
#: not yet written when a driver dies are not lost: its trials die with it and resume from their
#: latest written checkpoint, reporting the later iterations again.
FLUSH_INTERVAL_SECONDS = 0.5


def driver_name(experiment_name: str, run_key: str) -> str:
    """The Ray name of an experiment run's driver; with its namespace, any process finds it."""
    return f"sweep.{experiment_name}.{run_key}"


@dataclasses.dataclass(frozen=True)
class SweepSpec:
    """Everything a driver needs to run (or resume) one experiment run; it travels to Ray pickled.

    :param experiment_name: the experiment. :param run_key: the experiment run's key in the trials
        DB (the Airflow run id). :param experiment_run_id: that run's id in the trials DB.
    :param trainable: import path of the trainable.
    :param trials: ``(trial id, config)`` of every trial of the run, in order; None: the run's
        trials registered in the trials DB (a sweep's ``suggest_configs`` registers them), read
        there by ``experiment_run_id``, so that no list of them travels to Ray.
    :param metric: ranks trials. :param mode: ``"min"`` or ``"max"``. Several metrics as lists:
        the progress and resume's best go by the first.
    :param db_url: the trials DB. :param storage_path: where checkpoints go. :param namespace: Ray
        namespace of the driver and its trials.
    :param trial_kwargs: the other :class:`~airflow_trials.core.trial.Trial` arguments (resources,
        stopping criterion, checkpointing, ``max_failures``).
    :param scheduler: a :class:`~airflow_trials.core.scheduler.TrialScheduler`, or None for FIFO.
    :param max_concurrent_trials: the most trials running at once; None: as many as fit.
    :param origins: per warm-started trial id, ``{"warm_start": {...}, "restore_path": ...}``: where
        it
        came from, and the checkpoint it starts from on its first launch; default none.
    :param search_alg: a :class:`~airflow_trials.core.searcher.Searcher` with the experiment's
        space,
        metric and mode, which suggests the config of each trial given as ``{}``; default None.
    :param warm_points: ``(config, value)`` of a warm start's seeds, which the searcher learns
        first (``(config, value, last result)`` for a searcher with constraints).
    :param stored_run_key: the run's key in the trials DB when it is not ``run_key`` (an
        extension's DAG run records into the run it extends); default None: ``run_key``.
    """

    experiment_name: str
    run_key: str
    experiment_run_id: int
    trainable: str
    trials: Sequence[tuple[str, dict[str, Any]]] | None
    metric: MetricSpec
    mode: ModeSpec
    db_url: str
    storage_path: str | None
    namespace: str
    trial_kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    scheduler: Any = None
    max_concurrent_trials: int | None = None
    origins: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)
    search_alg: Any = None
    warm_points: Sequence[Sequence[Any]] = ()
    #: the experiment run's key in the trials DB when it is not ``run_key``: an extension's DAG
    #: run records into the finished run it extends (``airflow-trials extend``); None: run_key
    stored_run_key: str | None = None

    def first_metric(self) -> tuple[str, str]:
        """The metric and mode, or with several the first of each (progress and best go by it)."""
        if isinstance(self.metric, list) and isinstance(self.mode, list):
            return self.metric[0], self.mode[0]
        return str(self.metric), str(self.mode)

    @property
    def name(self) -> str:
        return driver_name(self.experiment_name, self.run_key)

    def __repr__(self) -> str:
        # The spec travels to Ray pickled, and Ray prints it when it cannot pickle it: no password.
        shown = (
            f"{f.name}={safe_url(self.db_url) if f.name == 'db_url' else getattr(self, f.name)!r}"
            for f in dataclasses.fields(self)
        )
        return f"SweepSpec({', '.join(shown)})"


@dataclasses.dataclass
class Resumable:
    """What a driver runs of its run: :func:`resumable_trials`."""

    #: trials to run, in order, each ``(trial id, config, its record if it had started)``: never
    #: started, or continuing from their latest checkpoint; each made into a Trial only when the
    #: runner takes it (:meth:`new_trials`), so a 100,000-trial sweep holds its running trials,
    #: not all of them
    plans: list[tuple[str, dict[str, Any], TrialRecord | None]]
    #: how many of the run's trials had ended
    done: int
    #: the best of them, (value, trial id), as select_best names it (:func:`_best_before`)
    best: tuple[float, str] | None
    #: ids of the trials the searcher is still to be asked for, in order (with a search_alg)
    to_ask: list[str] = dataclasses.field(default_factory=list)
    #: ``(trial id, config, value, last result)`` of the run's ended trials, for the searcher to
    #: learn (a searcher with constraints computes their values from the last result)
    ended: list[tuple[str, dict[str, Any], ObjectiveValue | None, Any]] = dataclasses.field(
        default_factory=list
    )
    #: how many of the searcher's trials it had been asked for before (their configs are stored)
    asked: int = 0
    #: how many trials the run has in all
    total: int = 0

    #: makes a plan's Trial (:func:`resumable_trials` sets it)
    make: Callable[[tuple[str, dict[str, Any], TrialRecord | None]], Trial] | None = (
        dataclasses.field(default=None, repr=False, compare=False)
    )

    def new_trials(self) -> Iterator[Trial]:
        """Each planned trial, made as it is asked for."""
        if self.make is None:
            raise ValueError(
                "This Resumable has no way to make trials; get it from resumable_trials."
            )
        return map(self.make, self.plans)

    @functools.cached_property
    def trials(self) -> list[Trial]:
        """Every planned trial, made now (a search's sweep adds them all before it asks)."""
        return list(self.new_trials())


def _plan_to_trial(
    spec: SweepSpec,
    store: TrialStore,
    storage: TrialStorage,
    plan: tuple[str, dict[str, Any], TrialRecord | None],
) -> Trial:
    """A planned trial: a resumed one adopts its checkpoints on ``storage`` and restores
    the newest (:func:`~airflow_trials.execution.resume.adopt_checkpoints`), a
    warm-started one is registered in the store with where it came from."""
    trial_id, config, record = plan
    origin = spec.origins.get(trial_id) or {}
    trial = Trial(
        spec.trainable,
        config,
        trial_id=trial_id,
        experiment_name=spec.experiment_name,
        restore_path=origin.get("restore_path"),
        **spec.trial_kwargs,
    )
    if record is not None:  # its recorded checkpoints are its own again
        adopt_checkpoints(trial, store, storage)
    elif origin.get("warm_start"):  # registered now: the store says where it came from
        store.upsert_trial(
            trial_id,
            trainable=spec.trainable,
            config=trial.config,
            resources=trial.resources,
            max_failures=trial.max_failures,
            experiment_run_id=spec.experiment_run_id,
            warm_start=origin["warm_start"],
        )
    trial.num_failures = record.num_failures if record is not None else 0
    return trial


def resumable_trials(spec: SweepSpec, store: TrialStore, storage: TrialStorage) -> Resumable:
    """The run's trials still to run, and what had ended.

    A trial that ended (TERMINATED or ERROR) in the trials DB is not run again. One that started
    and did not end continues from its latest recorded checkpoint that is on ``storage``
    (:func:`_plan_to_trial`; from scratch without one); its results already stored are kept
    (the store takes each iteration once). With a ``search_alg``, a trial given without a config
    is the searcher's to suggest: one whose config is stored continues with it, the others are
    asked for (``to_ask``).
    """
    trials, records = _run_trials(spec, store)
    ended = {trial_id for trial_id, record in records.items() if record.status.is_terminal()}
    ids = {trial_id for trial_id, _ in trials}
    resumable = Resumable([], len(ended & ids), None, total=len(trials))
    resumable.make = functools.partial(_plan_to_trial, spec, store, storage)
    for trial_id, config in trials:
        record = records.get(trial_id)
        searched = spec.search_alg is not None and not config
        if searched and record is not None and record.config:
            config = dict(record.config)  # asked before the resume
            resumable.asked += 1
        if trial_id in ended:
            continue
        if searched and not config:
            resumable.to_ask.append(trial_id)
            continue
        resumable.plans.append((trial_id, config, record))
    if ended:
        resumable.best = _best_before(spec, store)
        if spec.search_alg is not None:
            resumable.ended = [
                (trial_id, config, value, records[trial_id].last_result)
                for trial_id, config, value in ended_trial_values(
                    [records[t] for t, _ in trials if t in ended], spec.metric
                )
            ]
    return resumable


def _run_trials(
    spec: SweepSpec, store: TrialStore
) -> tuple[Sequence[tuple[str, dict[str, Any]]], dict[str, TrialRecord]]:
    """The run's trials, ``(trial id, config)`` in order (the spec's, else those registered in
    the trials DB, a searcher's without a config as suggest_configs gives them), and the records
    of those that started or ended. A trial registered and never started has none: it starts
    fresh, and a fresh run of 100,000 trials reads no full record."""
    states = store.reader.run_trial_states(spec.experiment_run_id)
    trials = spec.trials
    if trials is None:  # as suggest_configs lists them: the searcher's given as {}
        searched = spec.search_alg is not None
        trials = [
            (s.trial_id, {} if searched and s.trial_id not in spec.origins else s.config)
            for s in states
        ]
    fresh = {state.trial_id for state in states if state.never_started}
    if len(fresh) == len(states):
        return trials, {}
    listed = store.reader.list_trials(experiment_run_id=spec.experiment_run_id)
    return trials, {r.trial_id: r for r in listed if r.trial_id not in fresh}


def _best_before(spec: SweepSpec, store: TrialStore) -> tuple[float, str] | None:
    """The best of the run's ended trials by the first metric, as ``select_best`` names it: the
    board's best (a trial that ended TERMINATED, feasible first: docs/store.md "Which trials
    count"), with its best value; None when none counts."""
    board = store.reader.board(spec.experiment_run_id, Goal.of(*spec.first_metric()))
    best = board.best
    if best is None or best.value is None:
        return None
    return best.value, best.trial_id


def sweep_search(spec: SweepSpec, resumable: Resumable) -> SearchDriver | None:
    """The driver's searcher, told what it must know before its first suggestion: the warm
    start's seeds' results, the run's ended trials, and the trials it did not suggest now (the
    seeds, those resumed) to learn when they end. None without a search_alg or nothing to ask."""
    if spec.search_alg is None or not resumable.to_ask:
        return None
    search = SearchDriver(
        spec.search_alg,
        len(resumable.to_ask),
        spec.trainable,
        spec.trial_kwargs,
        spec.experiment_name,
        trial_ids=resumable.to_ask,
    )
    warm = [
        (f"warm start seed {i}", dict(config), value, *rest)
        for i, (config, value, *rest) in enumerate(spec.warm_points)
    ]
    search.resume([*warm, *resumable.ended], resumable.trials, resumable.asked)
    return search


class SweepDriver:
    """Runs :class:`SweepSpec`'s experiment in a thread of its own from the constructor; Ray calls
    :meth:`progress` and :meth:`request_stop` meanwhile (the actor is threaded).

    The driver outlives its run: whoever watches it reads the last :meth:`progress` (``finished``)
    and then kills it.
    """

    def __init__(self, spec: SweepSpec) -> None:
        self.spec = spec
        self._progress: SweepProgress | None = None
        self._stop = threading.Event()
        self._runner: Any = None
        self._failed: str | None = None
        self._done = threading.Event()
        self._owner_try = 0
        self._pending_stop: threading.Timer | None = None
        self._thread = threading.Thread(target=self._run, name=f"sweep {spec.name}", daemon=True)
        self._thread.start()

    def progress(self) -> SweepSnapshot:
        """Counts, best so far and ETA; ``finished`` once the run ended, with ``error`` if it
        failed."""
        progress = self._progress
        pending = self._pending_stop is not None and self._pending_stop.is_alive()
        if progress is None:
            return {
                "starting": True,
                "finished": self._done.is_set(),
                "error": self._failed,
                "stop_pending": pending,
            }
        return {**progress.snapshot(), "stop_pending": pending}

    def claim(self, try_number: int) -> int:
        """A task's try watches this driver from now on (a stop an older try left pending is
        dropped); returns the newest try that claimed it."""
        if try_number > self._owner_try and self._pending_stop is not None:
            self._pending_stop.cancel()
            self._pending_stop = None
        self._owner_try = max(self._owner_try, try_number)
        return self._owner_try

    def request_stop(self, try_number: int, grace_seconds: float = 0.0) -> bool:
        """Stop every unfinished trial (TERMINATED, checkpoints kept) and end the run, unless a try
        newer than ``try_number`` claimed the driver; whether it will stop. With ``grace_seconds``
        the stop waits that long first and is dropped if a newer try claims the driver meanwhile
        (a cleared task's next try re-attaches to the live run)."""
        if try_number < self._owner_try:
            return False
        if grace_seconds > 0:
            timer = threading.Timer(grace_seconds, self._stop_now, args=(try_number,))
            timer.daemon = True
            self._pending_stop = timer
            timer.start()
        else:
            self._stop_now(try_number)
        return True

    def _stop_now(self, try_number: int) -> None:
        if try_number < self._owner_try:
            return
        self._stop.set()
        if self._runner is not None:
            self._runner.request_stop()

    def wait(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for the run to end; whether it did."""
        return self._done.wait(timeout_s)

    def _run(self) -> None:
        try:
            self._drive()
        except BaseException as e:  # noqa: BLE001 - reported to the watcher, never lost in a thread
            self._failed = f"{type(e).__name__}: {e}\n{traceback.format_exc()}"
            log.exception("Sweep %s failed", self.spec.name)
            if self._progress is not None:
                self._progress.error = self._failed
        finally:
            if self._progress is not None:
                self._progress.finished = True
            self._done.set()
        if self._stop.is_set():  # stopped from Airflow: no trigger will read this run's end
            ray.kill(ray.get_runtime_context().current_actor, no_restart=True)

    def _drive(self) -> None:
        from airflow_trials.execution.driver.trials_db_callback import TrialsDbCallback

        spec = self.spec
        store = TrialStore(spec.db_url)
        recorder = None
        try:
            resumable = resumable_trials(spec, store, TrialStorage(spec.storage_path))
            if resumable.done:
                log.info(
                    "Sweep %s resumes: %d of %d trials had ended.",
                    spec.name,
                    resumable.done,
                    resumable.total,
                )
            progress = SweepProgress(
                resumable.total,
                *spec.first_metric(),
                done_before=resumable.done,
                best_before=resumable.best,
            )
            recorder = TrialsDbCallback(
                metric=spec.metric,
                mode=spec.mode,
                run_key=spec.stored_run_key or spec.run_key,
                store=store,
                flush_interval_s=FLUSH_INTERVAL_SECONDS,
                write_behind=True,
            )
            runner = _sweep_runner(spec, resumable, [recorder, progress])
            self._runner, self._progress = runner, progress
            if self._stop.is_set():
                runner.request_stop()
            if resumable.plans or resumable.to_ask:
                runner.run()
        finally:
            if recorder is not None:
                recorder.close()  # what a failed run recorded before it failed is kept
            store.dispose()


def _sweep_runner(spec: SweepSpec, resumable: Resumable, callbacks: list[Any]) -> Any:
    """The sweep's TrialRunner: this driver's own executor, its searcher, scheduler and trials."""
    from airflow_trials.execution.driver.executor import RayTrialExecutor
    from airflow_trials.execution.driver.runner import TrialRunner

    # Not detached: the trials' actors die with this driver, so none outlives it unwatched.
    # Actors are reused from one trial to the next, as Ray Tune's function trainables are.
    executor = RayTrialExecutor(
        spec.storage_path,
        namespace=spec.namespace,
        detached=False,
        reuse_actors=True,
        reuse_placement_groups=True,
    )
    if spec.scheduler is not None:
        # This driver's own copy: it may take the experiment's metric (of several, the
        # one it names, or all of them for a scheduler that takes several).
        spec.scheduler.set_search_properties(
            *judged_metric_and_mode(spec.scheduler, spec.metric, spec.mode)
        )
    search = sweep_search(spec, resumable)
    runner = TrialRunner(
        spec.experiment_name,
        executor=executor,
        scheduler=spec.scheduler,
        callbacks=callbacks,
        max_concurrent_trials=spec.max_concurrent_trials,
        checkpoint_period_s=float("inf"),
        keep_results=False,
        forget_ended=True,
        search_alg=search,
    )
    if search is None and type(runner.scheduler) is FIFOScheduler:
        runner.feed(resumable.new_trials())  # made as they start: flat memory
    else:  # a searcher learns them first; a scheduler of brackets sorts them all
        for trial in resumable.trials:
            runner.add_trial(trial)
    return runner
