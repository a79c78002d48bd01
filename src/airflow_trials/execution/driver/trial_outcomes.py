"""TrialOutcomes: what a TrialRunner does with one trial's result or failure."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Literal

from airflow_trials.core.callback import Callback
from airflow_trials.core.checkpoint import CheckpointRecord
from airflow_trials.core.fate import Action, Outcome, ResultDecision, after_failure, after_result
from airflow_trials.core.result import CHECKPOINT, DUPLICATE, TRAINING_ITERATION, Result
from airflow_trials.core.scheduler import TrialScheduler
from airflow_trials.core.status import TrialStatus
from airflow_trials.core.stop_kind import StopKind
from airflow_trials.core.stopping import Stopper
from airflow_trials.core.trial import Trial
from airflow_trials.exceptions import CheckpointError, TrialError
from airflow_trials.execution.driver.executor import RayTrialExecutor
from airflow_trials.execution.driver.exploit import apply_exploit
from airflow_trials.execution.driver.hand_over import HandOvers
from airflow_trials.execution.driver.releaser import CheckpointReleaser
from airflow_trials.execution.driver.runner_views import TrialIdAndResultList
from airflow_trials.schedulers.pbt.pbt_scheduler import Exploit

log = logging.getLogger(__name__)

FAIL_FAST_RAISE = "raise"
"""``fail_fast="raise"``: the first trial ERROR is raised from the runner's ``step()``."""


class TrialOutcomes:
    """Carries out what happens to a trial after its result or its failure, as ``core/fate.py``
    decides it (``after_result``, ``after_failure``): on the executor, to the scheduler and to the
    runner's callbacks. The runner's loop chooses which trial to process; this is how.

    :param executor: the runner's :class:`RayTrialExecutor`.
    :param scheduler: the runner's :class:`TrialScheduler`.
    :param callbacks: the runner's callbacks, told about every event (the runner's own list).
    :param releaser: deletes the checkpoints that the keep policy dropped, once none is named.
    :param run_ahead_below: ``core/fate.py`` ``run_ahead_rule``'s, for the trials that continue.
    :param experiment_stopper: the experiment-wide stopper, whose ``stop_all`` may end the run;
        None when there is none.
    :param end_experiment: ends the whole run early, stopping every unfinished trial.
    :param fail_fast: as the runner's ``fail_fast``: True, False or ``"raise"``.
    :param results: where every fresh result is kept, or None to keep none.
    :param hand_overs: offers each continuing trial the trial that takes over its actor when it
        ends; None offers none.
    """

    def __init__(
        self,
        executor: RayTrialExecutor,
        scheduler: TrialScheduler,
        callbacks: Sequence[Callback],
        releaser: CheckpointReleaser,
        run_ahead_below: Callable[[Trial], int],
        experiment_stopper: Stopper | None,
        end_experiment: Callable[[], None],
        fail_fast: bool | Literal["raise"],
        results: TrialIdAndResultList | None,
        hand_overs: HandOvers | None = None,
    ) -> None:
        self.executor, self.scheduler, self.callbacks = executor, scheduler, callbacks
        self._releaser = releaser
        self._run_ahead_below = run_ahead_below
        self._experiment_stopper = experiment_stopper
        self._end_experiment = end_experiment
        self.fail_fast = fail_fast
        self._results = results
        self._hand_overs = hand_overs

    # -- results -----------------------------------------------------------------------------------
    def process(self, trial: Trial) -> None:
        """Fetch the trial's next result and act on it; a failure, there or in acting on it, goes
        to :meth:`fail`."""
        before = int(trial.last_result.get(TRAINING_ITERATION, 0))
        try:
            result = self.executor.fetch_result(trial)
        except TrialError as e:
            self.fail(trial, e)
            return
        if self._hand_overs is not None:
            self._hand_overs.learn(trial, before, result)
        self.act(trial, result)

    def act(self, trial: Trial, result: Result) -> None:
        """Act on the trial's fetched result; a failure in doing so goes to :meth:`fail`."""
        try:
            self._on_result(trial, result)
        except TrialError as e:
            self.fail(trial, e)
        except (KeyError, ValueError, TypeError, CheckpointError) as e:
            # A stopping criterion naming a missing metric, a bad checkpoint, a scheduler error.
            error = TrialError(
                f"Trial {trial.trial_id}: processing its result failed: {e}",
                trial_id=trial.trial_id,
            )
            self.fail(trial, error)

    def record(
        self,
        trial: Trial,
        result: Result,
        scheduler: TrialScheduler | None = None,
        experiment_done: Callable[[], bool] | None = None,
    ) -> ResultDecision:
        """Register the result's checkpoint, record the result and decide what follows."""
        duplicate = bool(result.pop(DUPLICATE, False))
        checkpoint_path = result.get(CHECKPOINT)
        if checkpoint_path:
            record = CheckpointRecord(checkpoint_path, int(result[TRAINING_ITERATION]), result)
            self.executor.register_checkpoint(trial, record)
            self.notify_newest_checkpoint(trial)
        decision = after_result(
            trial,
            result,
            duplicate=duplicate,
            experiment_done=experiment_done,
            scheduler=scheduler.on_trial_result if scheduler is not None else None,
            scheduler_reason=scheduler.decision_reason if scheduler is not None else None,
            scheduler_kind=scheduler.stop_kind if scheduler is not None else None,
        )
        if decision.fresh:
            if self._results is not None:
                self._results.append((trial.trial_id, result))
            for callback in self.callbacks:
                callback.on_trial_result(trial, result)
        return decision

    def _on_result(self, trial: Trial, result: Result) -> None:
        stopper = self._experiment_stopper
        decision = self.record(
            trial, result, self.scheduler, stopper.stop_all if stopper is not None else None
        )
        if self.executor.handed_over(trial) and decision.action is not Action.STOP:
            # core/fate.py hand_over_from promised a STOP; the actor runs another trial now.
            raise TrialError(
                f"Trial {trial.trial_id}: its actor ended it and took over the next trial, but "
                f"its result was decided {decision.action.value} ({decision.reason}); it cannot "
                "go on there.",
                trial_id=trial.trial_id,
            )
        if decision.save_checkpoint and self.executor.save(trial) is not None:
            self.notify_newest_checkpoint(trial)
        if decision.action is Action.STOP:
            self.stopping(trial, decision.reason, decision.stop_kind)
            self.scheduler.on_trial_complete(trial, result)
            self.executor.stop_trial(trial)
            for callback in self.callbacks:
                callback.on_trial_complete(trial)
        elif decision.action is Action.STOP_EXPERIMENT:
            log.info("Experiment %s: its stopper ended the experiment.", trial.experiment_name)
            self._end_experiment()
        elif decision.action is Action.PAUSE:
            exploit = self.scheduler.take_exploit(trial.trial_id)
            self.executor.pause_trial(trial, save=exploit is None)
            self.paused(trial)
            if exploit is not None:
                self.exploit(trial, exploit)
            self.notify_newest_checkpoint(trial)
        else:
            successor = self._hand_overs.offer(trial) if self._hand_overs is not None else None
            self.executor.continue_training(trial, self._run_ahead_below(trial), successor)

    @staticmethod
    def stopping(trial: Trial, reason: str | None, kind: StopKind | None) -> None:
        """Record why the scheduler or the criterion ends ``trial``, and the kind of that end
        (every path that stops it says so)."""
        trial.stop_reason = reason
        trial.stop_kind = kind
        log.info("Trial %s stops: %s.", trial.trial_id, reason)

    def paused(self, trial: Trial) -> None:
        """Tell the callbacks that ``trial`` is PAUSED now (every path that pauses it does)."""
        for callback in self.callbacks:
            callback.on_trial_pause(trial)

    def exploit(self, trial: Trial, exploit: Exploit) -> bool:
        """The paused trial takes over its donor's checkpoint and a new config; when the donor's
        checkpoint is gone, it keeps its own state (as Ray Tune does when a save fails)."""
        old_config = dict(trial.config)
        try:
            apply_exploit(self.executor, trial, exploit)
        except CheckpointError as e:
            log.warning("Trial %s keeps its own state: %s", trial.trial_id, e)
            return False
        log.info("Trial %s: %s.", trial.trial_id, self.scheduler.decision_reason(trial.trial_id))
        for callback in self.callbacks:
            callback.on_trial_exploit(trial, exploit, old_config)
        return True

    def saved_progress(self, trial: Trial, results: list[Result]) -> None:
        """Hand the callbacks the results a resumed trial's storage held past the runner's saved
        state (``adopt_saved_progress``), once it started again: recorded, not judged (its
        scheduler never saw them; the trial trained past them unwatched)."""
        if not results:
            return
        for result in results:
            if self._results is not None:
                self._results.append((trial.trial_id, result))
            for callback in self.callbacks:
                callback.on_trial_result(trial, result)
        self.notify_newest_checkpoint(trial)

    def notify_newest_checkpoint(self, trial: Trial) -> None:
        """Tell the releaser and the callbacks of the trial's newest checkpoint."""
        self._releaser.note(trial)
        newest = trial.checkpoint
        if newest is not None:
            for callback in self.callbacks:
                callback.on_checkpoint(trial, newest)

    # -- failures ----------------------------------------------------------------------------------
    def fail(self, trial: Trial, error: TrialError) -> None:
        """The one funnel of a trial's failure: recover it from its latest checkpoint, or end it
        in ERROR (and, with ``fail_fast``, the experiment), as ``after_failure`` decides."""
        trial.error_msg = str(error)
        running = trial.status == TrialStatus.RUNNING
        decision = after_failure(
            trial.trial_id,
            trial.num_failures,
            trial.max_failures,
            infrastructure=error.infrastructure and running,
            retries_left=running,
            fail_fast=bool(self.fail_fast),
        )
        trial.num_failures = decision.num_failures
        if decision.outcome is not Outcome.FAIL:
            log.warning(
                "%s Restoring from %s.", decision.reason, trial.restore_source() or "scratch"
            )
            self.executor.requeue_trial(trial)
            for callback in self.callbacks:
                callback.on_trial_recover(trial)
            return
        log.error("%s %s", decision.reason, error)
        self.executor.stop_trial(trial, error=True, error_msg=str(error))
        self.errored(trial)
        if self.fail_fast == FAIL_FAST_RAISE:
            raise error
        if decision.fail_experiment:
            self._end_experiment()

    def errored(self, trial: Trial) -> None:
        """Tell the scheduler and the callbacks that ``trial`` ended in ERROR."""
        self.scheduler.on_trial_error(trial)
        for callback in self.callbacks:
            callback.on_trial_error(trial)
