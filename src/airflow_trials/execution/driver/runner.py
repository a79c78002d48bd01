"""TrialRunner: the event loop that launches trials, processes their results and recovers
failures."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from airflow_trials.core import fate
from airflow_trials.core.callback import Callback
from airflow_trials.core.parameters import TrainableWithParameters
from airflow_trials.core.scheduler import Decision, FIFOScheduler, TrialScheduler
from airflow_trials.core.searcher import Searcher
from airflow_trials.core.status import TrialStatus
from airflow_trials.core.stop_kind import StopKind
from airflow_trials.core.stopping import StopFn, Stopper, build_stopper
from airflow_trials.core.trial import Trial, validate_name
from airflow_trials.exceptions import RunnerFinishedError, SearcherError, TrialError
from airflow_trials.execution.driver.executor import RayTrialExecutor
from airflow_trials.execution.driver.experiment_state import save_experiment_state, trials_to_resume
from airflow_trials.execution.driver.hand_over import HandOvers
from airflow_trials.execution.driver.releaser import CheckpointReleaser
from airflow_trials.execution.driver.runner_trials import RunnerTrials
from airflow_trials.execution.driver.runner_views import (
    RunnerViews,
    TrialIdAndResultList,
    check_concurrency_cap,
)
from airflow_trials.execution.driver.suggest import SearchDriver, build_search_driver
from airflow_trials.execution.driver.trial_outcomes import FAIL_FAST_RAISE, TrialOutcomes
from airflow_trials.execution.resume import adopt_saved_progress

log = logging.getLogger(__name__)


class TrialRunner(RunnerTrials, RunnerViews):
    """Runs an experiment's trials on Ray, one event per ``step()``.

    Each step either launches one trial that fits the free resources, or processes one result:
    record it, ask the stopping criterion and the scheduler (CONTINUE / PAUSE / STOP), checkpoint
    when due, and recover a failed trial from its latest checkpoint up to ``max_failures`` times::

        runner = TrialRunner(experiment_name="mnist", storage_path="/shared/results")
        for config in configs:
            runner.add_trial(Trial("my_pkg.train:train", config, experiment_name="mnist"))
        runner.run()                       # or: while not runner.is_finished(): runner.step()

    :param experiment_name: names the experiment's directory on storage; default ``"default"``.
    :param executor: the :class:`RayTrialExecutor`; default one on ``storage_path`` with
        placement-group reuse (and actor reuse when ``reuse_actors``).
    :param storage_path: used when no executor is given.
    :param scheduler: a :class:`TrialScheduler`; default :class:`FIFOScheduler`. It judges the
        searcher's metric: one it has none of takes the searcher's, and one that disagrees is
        refused here. Beside a searcher of several metrics (``OptunaSearch(metric=[...],
        mode=[...])``) it judges one of them in the same mode, or none (FIFO): a scheduler without
        a metric is refused, as it cannot take several (``core/searcher.py`` ``agree_on_metric``).
    :param callbacks: :class:`Callback` objects told about every trial event.
    :param stop: experiment-wide stopping criterion applied to trials without their own.
    :param fail_fast: stop all trials (TERMINATED) on the first trial ERROR; ``"raise"`` raises the
        trial's error from ``step()`` instead. Default False.
    :param time_budget_s: wall-clock budget; when spent, unfinished trials become TERMINATED and the
        run ends.
    :param reuse_actors: reuse actors between trials (only with the default executor).
    :param queue_trials: see :class:`RayTrialExecutor` (only with the default executor).
    :param checkpoint_period_s: how often experiment state is saved during ``run()``; a checkpoint
        the keep policy dropped is deleted after the next save (the state saved before may name
        it). Default 10.
    :param resume: load the experiment's saved state and continue it; default False.
    :param run_errored_only: with ``resume``, re-run trials that ended in ERROR (from their latest
        checkpoint); TERMINATED trials are kept as they are. Default False.
    :param wait_timeout_s: longest a step waits for a result; default 1.
    :param search_alg: a :class:`Searcher` (e.g. ``OptunaSearch``) that makes up to ``num_samples``
        trials of ``trainable`` with ``trial_kwargs`` (other Trial arguments); default None. See
        docs/engine.md.
    :param max_concurrent_trials: the most trials running at once (Ray Tune's ``TuneConfig``);
        default None: as many as the cluster's resources fit.
    :param keep_results: keep every result in memory for :meth:`results` and
        :meth:`fetch_status_results`; False when a callback stores them (a 10,000-trial sweep).
        Default True.
    :param forget_ended: drop each ended trial from the runner once every trial before it ended
        too, so that a 100,000-trial sweep holds only its running and waiting trials (a callback
        such as ``TrialsDbCallback`` keeps the ended ones; :meth:`get_trials` then lists only
        those not yet forgotten). Default False.
    """

    RAISE = FAIL_FAST_RAISE

    def __init__(
        self,
        experiment_name: str = "default",
        *,
        executor: RayTrialExecutor | None = None,
        storage_path: str | None = None,
        scheduler: TrialScheduler | None = None,
        callbacks: Sequence[Callback] = (),
        stop: Mapping[str, float] | StopFn | Stopper | None = None,
        fail_fast: bool | Literal["raise"] = False,
        time_budget_s: float | None = None,
        reuse_actors: bool = False,
        queue_trials: bool = False,
        checkpoint_period_s: float = 10.0,
        resume: bool = False,
        run_errored_only: bool = False,
        wait_timeout_s: float = 1.0,
        search_alg: Searcher | SearchDriver | None = None,
        num_samples: int = 1,
        trainable: str | TrainableWithParameters | None = None,
        trial_kwargs: Mapping[str, Any] | None = None,
        max_concurrent_trials: int | None = None,
        keep_results: bool = True,
        forget_ended: bool = False,
    ) -> None:
        check_concurrency_cap(max_concurrent_trials)
        _check_executor_args(fail_fast, executor, storage_path or reuse_actors or queue_trials)
        self.experiment_name = validate_name("Experiment name", experiment_name)
        self.trial_executor = executor or RayTrialExecutor(
            storage_path,
            reuse_actors=reuse_actors,
            reuse_placement_groups=True,
            queue_trials=queue_trials,
        )
        self.scheduler = scheduler or FIFOScheduler()
        self.stop_criterion = stop
        self._experiment_stopper = build_stopper(stop)
        # Which results the actor may train past before the runner records them: core/fate.py.
        self._run_ahead_below = fate.run_ahead_rule(self.scheduler, self._experiment_stopper)
        self.fail_fast = fail_fast
        self.time_budget_s, self.checkpoint_period_s = time_budget_s, checkpoint_period_s
        self.wait_timeout_s = wait_timeout_s
        self.max_concurrent_trials, self.keep_results = max_concurrent_trials, keep_results
        self._search = build_search_driver(
            search_alg,
            num_samples,
            trainable,
            trial_kwargs,
            self.experiment_name,
            resume,
            self.scheduler,
        )
        self.callbacks: list[Callback] = [*callbacks, *([self._search] if self._search else [])]
        _hand_on_constraints(search_alg, callbacks)
        self._init_trials(forget_ended)
        self._init_outcomes(checkpoint_period_s, fail_fast, keep_results)
        # What resumed trials' storage held past the saved state, for the callbacks (_resume).
        self._saved_results: dict[str, list[dict[str, Any]]] = {}
        if resume:
            self._resume(stop, run_errored_only)

    def _resume(
        self, stop: Mapping[str, float] | StopFn | Stopper | None, run_errored_only: bool
    ) -> None:
        """Add the saved trials; each one to run again first takes what its storage holds past
        the saved state (the state is saved every ``checkpoint_period_s``)."""
        storage = self.trial_executor.storage
        for trial in trials_to_resume(storage, self.experiment_name, stop, run_errored_only):
            self.add_trial(trial)
            if trial.status == TrialStatus.PENDING:
                self._saved_results[trial.trial_id] = adopt_saved_progress(trial, storage)

    def _init_outcomes(
        self, checkpoint_period_s: float, fail_fast: bool | Literal["raise"], keep_results: bool
    ) -> None:
        """The loop's state, and the parts a result goes through: the checkpoint releaser, the
        hand-overs and :class:`TrialOutcomes`."""
        self._stop_requested = threading.Event()
        self._results: TrialIdAndResultList = []
        self._results_seen = 0
        self._start_time: float | None = None
        self._budget_spent = False
        self._stop_all = False
        self._last_checkpoint = time.monotonic()
        self._releaser = CheckpointReleaser(
            self.trial_executor.storage, checkpoint_period_s != float("inf")
        )
        # Which waiting trial takes over an ending trial's actor: execution/driver/hand_over.py.
        self._hand_overs = HandOvers(
            self.trial_executor,
            enabled=self.trial_executor.hand_over and self.scheduler.picks_in_order(),
            waiting=self._unfinished,
            has_room=lambda resources: self._has_room(resources, peek=True),
        )
        self._outcomes = TrialOutcomes(
            self.trial_executor,
            self.scheduler,
            self.callbacks,
            self._releaser,
            self._run_ahead_below,
            self._experiment_stopper,
            self._end_early,
            fail_fast,
            self._results if keep_results else None,
            self._hand_overs,
        )

    # -- the loop ----------------------------------------------------------------------------------
    def is_finished(self) -> bool:
        if self._budget_spent or self._stop_all:
            return True
        if self._unfinished() or self._fed_next is not None:
            return False
        if all(t.status.is_terminal() for t in self._trials):
            return self._search is None or self._search.is_finished()
        self._finished_prefix = 0  # a finished trial was restarted from outside: rescan
        return False

    def step(self) -> None:
        """Launch one trial if one fits, else process one result (waiting up to wait_timeout_s)."""
        if self.is_finished():
            raise RunnerFinishedError(
                f"Experiment {self.experiment_name} has finished: every trial is TERMINATED or "
                f"ERROR (or the time budget or fail_fast ended it); step() has nothing to do."
            )
        if self._start_time is None:
            self._start_time = time.monotonic()
        executor = self.trial_executor
        try:
            self._top_up()
            if self._search and (new := self._search.next_trial(self._startable(), self._has_room)):
                self.add_trial(new)
            # No shape fits: no waiting trial can start, so the scheduler is not asked (its scan of
            # thousands of waiting trials would cost each step as much as the sweep is long).
            fits = any(self._has_room(shape, peek=True) for shape in self._shapes)
            trial = (
                self.scheduler.choose_trial_to_run(self._startable(), self._has_room)
                if fits
                else None
            )
            if trial is not None:
                self._launch(trial)
            elif executor.get_running_trials():
                ready = executor.get_next_available_trial(self.wait_timeout_s)
                if ready is not None:
                    self._outcomes.process(ready)
                    self._start_handed_over()
            else:
                self._on_no_available_trials()
        except SearcherError:
            self._end_early()
            raise
        self._apply_scheduler_actions()
        self._check_time_budget()
        if executor.has_cached_slots():  # keep what a waiting trial, or the searcher's next, reuses
            executor.trim_cache(self._wanted_shapes())
        for callback in self.callbacks:
            callback.on_step_end(self._trials)
        self._releaser.release(self.callbacks)

    def _wanted_shapes(self) -> list[Any]:
        """The resources a waiting trial or the searcher's next trial needs, each once; the scan
        ends once every shape is found (not reading the thousands of waiting trials behind)."""
        found = (
            {self._search.resources} if self._search and not self._search.is_finished() else set()
        )
        for trial in self._unfinished():
            if found >= self._shapes:
                break
            if trial.status in (TrialStatus.PENDING, TrialStatus.PAUSED):
                found.add(trial.resources)
        return list(found)

    def _has_room(self, resources: Any, peek: bool = False) -> bool:
        """Can one more trial needing ``resources`` start now (free resources, under
        max_concurrent_trials)? ``peek``: asked without effect on the executor."""
        cap, executor = self.max_concurrent_trials, self.trial_executor
        if cap is not None and len(executor.get_running_trials()) >= cap:
            return False
        return executor.could_start(resources) if peek else executor.has_resources(resources)

    def request_stop(self) -> None:
        """Ask :meth:`run` (from any thread) to stop every unfinished trial and end the
        experiment."""
        self._stop_requested.set()

    def run(self) -> list[Trial]:
        """Step until finished (or :meth:`request_stop`); always saves state and releases every
        actor, even on error or Ctrl-C."""
        try:
            while not self.is_finished():
                if self._stop_requested.is_set():
                    self._end_early()
                    break
                self.step()
                if time.monotonic() - self._last_checkpoint >= self.checkpoint_period_s:
                    self.checkpoint()
        finally:
            self.cleanup()
        for callback in self.callbacks:
            callback.on_experiment_end(self._trials)
        self._releaser.release(self.callbacks, self._trials)  # every record is final now
        return self._trials

    def cleanup(self) -> None:
        """Save the experiment state, then kill every actor this runner's executor holds.

        Trials still RUNNING keep that status in the saved state and resume from their latest
        checkpoint with ``resume=True``.
        """
        try:
            self.checkpoint()
        finally:
            self.trial_executor.cleanup()

    def _launch(self, trial: Trial) -> None:
        exploit = self.scheduler.take_exploit(trial.trial_id)  # decided while it waited (synch PBT)
        if exploit is not None and self._outcomes.exploit(trial, exploit):
            self._outcomes.notify_newest_checkpoint(trial)
        if trial.status == TrialStatus.PAUSED:
            self.trial_executor.unpause_trial(trial)
        executor = self.trial_executor
        if executor.start_trial(trial, train=False):
            # Its resources are committed now, so the offer sees whether a free slot remains.
            successor = self._hand_overs.offer(trial)
            executor.continue_training(trial, self._run_ahead_below(trial), successor)
            for callback in self.callbacks:
                callback.on_trial_start(trial)
            self._outcomes.saved_progress(trial, self._saved_results.pop(trial.trial_id, []))
        else:
            self._outcomes.errored(trial)

    def _start_handed_over(self) -> None:
        """Start each trial whose actor took it over when the trial before it ended; one that no
        longer waits (stopped meanwhile) is not started, and its actor is killed."""
        executor = self.trial_executor
        for trial in executor.take_handed_over():
            if trial.status == TrialStatus.PENDING and trial.trial_id in self._by_id:
                self._launch(trial)
            else:
                executor.drop_handed_over(trial)

    def _on_no_available_trials(self) -> None:
        """Nothing runs and nothing fits: fail fast if a waiting trial can never fit."""
        executor = self.trial_executor
        for trial in self._trials:
            if trial.status in (TrialStatus.PENDING, TrialStatus.PAUSED):
                executor.actors.refresh_cluster_resources(force=True)
                executor.actors.check_fits_cluster(trial)
        # Everything fits the cluster but is held by someone else: wait for it to free up.
        time.sleep(min(self.wait_timeout_s, 0.1))

    def _check_time_budget(self) -> None:
        if self.time_budget_s is None or self._start_time is None or self._budget_spent:
            return
        if time.monotonic() - self._start_time < self.time_budget_s:
            return
        log.warning(
            "Experiment %s spent its time budget of %ss; stopping its running trials.",
            self.experiment_name,
            self.time_budget_s,
        )
        self._budget_spent = True
        self._stop_unfinished()

    def _apply_scheduler_actions(self) -> None:
        """Carry out what the scheduler decided for trials other than the one it was asked about."""
        for trial_id, decision in self.scheduler.take_pending_actions():
            trial = self._by_id.get(trial_id)  # None: ended and forgotten (forget_ended)
            if trial is None:
                continue
            if decision is Decision.STOP and not trial.status.is_terminal():
                self._outcomes.stopping(
                    trial,
                    self.scheduler.decision_reason(trial_id),
                    self.scheduler.stop_kind(trial_id),
                )
                self.stop_trial(trial)

    def _end_early(self) -> None:
        """End the experiment now (stopped, its stopper ended it, or fail_fast): every trial not
        yet finished becomes TERMINATED."""
        self._stop_all = True
        self._stop_unfinished()

    def _stop_unfinished(self) -> None:
        """End the experiment early: every trial not yet finished becomes TERMINATED."""
        for trial in self._trials:
            if not trial.status.is_terminal():
                trial.stop_kind = StopKind.EXPERIMENT
                self.stop_trial(trial)
        while self._fed_next is not None:  # never added yet: they end TERMINATED as added ones do
            trial, self._fed_next = self._fed_next, next(self._feed or iter(()), None)
            self.add_trial(trial)
            trial.stop_kind = StopKind.EXPERIMENT
            self.stop_trial(trial)
            self._unfinished()  # forgotten again at once (forget_ended)

    # -- control from outside ----------------------------------------------------------------------
    def stop_trial(self, trial: Trial) -> None:
        """Stop a trial now, whatever its status: it becomes TERMINATED and its resources are
        freed."""
        if trial.status.is_terminal():
            return
        if trial.status == TrialStatus.RUNNING:
            self.scheduler.on_trial_complete(trial, trial.last_result)
        else:
            self.scheduler.on_trial_remove(trial)
        self.trial_executor.stop_trial(trial)
        for callback in self.callbacks:
            callback.on_trial_complete(trial)
        self._apply_scheduler_actions()  # a removal can end a bracket's round

    def pause_trial(self, trial: Trial) -> None:
        """Pause a RUNNING trial now: its in-flight result is recorded, then it is checkpointed and
        its resources (GPUs included) are released. FIFO resumes it when nothing pending fits."""
        if trial.status != TrialStatus.RUNNING:
            raise ValueError(
                f"Cannot pause trial {trial.trial_id}: it is {trial.status}, not RUNNING."
            )
        executor = self.trial_executor
        if executor.has_result_in_flight(trial):
            try:
                result = executor.fetch_result(trial)
            except TrialError as e:
                self._outcomes.fail(trial, e)
                return
            if executor.handed_over(trial):
                # The result ended it, and its actor took over the next trial: it ends as always.
                self._outcomes.act(trial, result)
                self._start_handed_over()
                return
            self._outcomes.record(trial, result)
        executor.pause_trial(trial)
        self._outcomes.paused(trial)
        self._outcomes.notify_newest_checkpoint(trial)

    # -- experiment state --------------------------------------------------------------------------
    def checkpoint(self) -> str:
        """Save every trial's state to ``<experiment_dir>/experiment_state.json``; returns the
        path."""
        path = save_experiment_state(
            self.trial_executor.storage, self.experiment_name, self._trials
        )
        self._releaser.state_saved(self._trials)
        self._last_checkpoint = time.monotonic()
        return path


def _check_executor_args(
    fail_fast: Any, executor: RayTrialExecutor | None, configures_default: Any
) -> None:
    """ValueError for a ``fail_fast`` that is not True, False or ``"raise"``, or for settings of
    the default executor (``configures_default``) given beside an ``executor``."""
    if fail_fast not in (True, False, FAIL_FAST_RAISE):
        raise ValueError(f"fail_fast must be True, False or 'raise', got {fail_fast!r}.")
    if executor is not None and configures_default:
        raise ValueError(
            "storage_path, reuse_actors and queue_trials configure the default executor; "
            "pass them to RayTrialExecutor(...) instead when you give executor=."
        )


def _hand_on_constraints(search_alg: Any, callbacks: Sequence[Callback]) -> None:
    """Give the search's constraints to each callback that takes them (a TrialsDbCallback
    records them); the searcher may sit inside a ConcurrencyLimiter."""
    searched = getattr(search_alg, "searcher", search_alg)
    constraints = getattr(searched, "constraints", None)
    if not constraints:
        return
    for callback in callbacks:
        take = getattr(callback, "take_constraints", None)
        if take is not None:
            take(constraints)
