"""Who decides a trial's fate: how a try starts, what happens after each result and a failure.

Every path that drives a trial calls these functions and acts on what they return; none keeps
its own copy of the rules:

- the TrialRunner, after each result it fetches and each failure
  (``execution/driver/trial_outcomes.py``);
- the self-driving trial actor, after each result it trains (``execution/worker/self_driving.py``);
- the Airflow operator (``operators/trial_operator.py``), when a try starts and when the trigger
  reports the trial's end.

``after_result`` covers the stopping criterion (and the experiment's time budget, a stopper the
runner gives every trial), the experiment stopper, checkpoint-due, duplicate results and the
scheduler's CONTINUE/PAUSE/STOP. ``after_failure`` covers infrastructure losses (not counted),
retry-or-fail against ``max_failures``, a caller's retry budget (Airflow's ``retries``) and
``fail_fast``. ``on_start`` covers how a try of a trial's Airflow task starts: re-attach to the
live actor, report the stored end, restart from scratch, reset or resume (the operator gathers its
inputs: the stored trial, the actor's :class:`ActorState`, the try and whether it was cleared).
All are pure: they read the trial and return a decision, and the caller does it.

On the Airflow path the trials store records the outcome: ``TrialStore.record_end`` writes a
:class:`~airflow_trials.core.end.TrialEnd` with the status :func:`status_after_end` gives, and
``TrialStore.record_transition`` writes every other change as a :class:`Transition`. Operators
and triggers name no status.

Example::

    decision = after_result(trial, result)
    if decision.fresh:
        store.record_progress([TrialUpdate(trial.trial_id, results=[result])])
    if decision.save_checkpoint:
        save(trial)
    if decision.action is Action.STOP:
        stop(trial)
"""

from __future__ import annotations

import functools
import math
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Protocol

from airflow_trials.core.end import TrialEnd
from airflow_trials.core.result import CHECKPOINT, DONE, TRAINING_ITERATION, Result
from airflow_trials.core.status import TrialStatus
from airflow_trials.core.stop_kind import StopKind
from airflow_trials.core.stopping import Stopper, ThresholdStopper
from airflow_trials.core.trial import Trial

if TYPE_CHECKING:
    from airflow_trials.core.scheduler import TrialScheduler


class Action(StrEnum):
    """What to do with a trial after one of its results."""

    CONTINUE = "CONTINUE"  # train its next iteration
    PAUSE = "PAUSE"  # checkpoint it and free its resources; the scheduler resumes it later
    STOP = "STOP"  # it is done: end it TERMINATED
    STOP_EXPERIMENT = "STOP_EXPERIMENT"  # the experiment is done: end every unfinished trial


@dataclass(frozen=True)
class ResultDecision:
    """:param fresh: the result is new (record it); False for a replay after a restore or the
        repeated last result of a function that returned.
    :param action: what to do next.
    :param save_checkpoint: save a checkpoint before doing it (one is due, or the trial ends
        with ``checkpoint_at_end`` and the result carries none).
    :param reason: why, for logs and the trial's stop reason.
    :param stop_kind: with STOP and STOP_EXPERIMENT, the kind of the trial's end; default None.
    """

    fresh: bool
    action: Action
    save_checkpoint: bool
    reason: str
    stop_kind: StopKind | None = None


SchedulerDecision = Callable[[Trial, Result], str]

# The stop reasons of a trial that ends on its own (stop kinds FINISHED and CRITERION).
TRAINABLE_FINISHED = "its trainable finished"
CRITERION_MET = "it met its stopping criterion"
EXPERIMENT_STOPPED = "the experiment's stopper ended it"


def after_result(
    trial: Trial,
    result: Result,
    *,
    duplicate: bool = False,
    scheduler: SchedulerDecision | None = None,
    experiment_done: Callable[[], bool] | None = None,
    scheduler_reason: Callable[[str], str | None] | None = None,
    scheduler_kind: Callable[[str], StopKind] | None = None,
) -> ResultDecision:
    """Record ``result`` on ``trial`` and decide what happens next.

    :param trial: the trial (its latest result and metric analysis are updated here).
    :param result: the result, with its ``training_iteration``.
    :param duplicate: the trainable repeated its last result (it returned); not recorded.
    :param scheduler: ``(trial, result) -> "CONTINUE" | "PAUSE" | "STOP"``, asked for fresh results
        of trials the stopping criterion does not end; default: always continue.
    :param experiment_done: asked after each result the trial's own criterion does not end;
        True ends the experiment (the runner's experiment-wide stopper). Default: never.
    :param scheduler_reason: ``trial_id -> sentence``, asked when the scheduler pauses or stops the
        trial (``TrialScheduler.decision_reason``); it becomes the decision's ``reason``.
    :param scheduler_kind: ``trial_id -> StopKind``, asked when the scheduler stops the trial
        (``TrialScheduler.stop_kind``: MAX_T at ``max_t``); default SCHEDULER.
    """
    fresh = False if duplicate else trial.record_result(result)
    has_checkpoint = bool(result.get(CHECKPOINT))
    if trial.should_stop(result):
        done = bool(result.get(DONE))
        why, kind = (
            (TRAINABLE_FINISHED, StopKind.FINISHED) if done else (CRITERION_MET, StopKind.CRITERION)
        )
        at_end = trial.checkpoint_at_end and not has_checkpoint
        return ResultDecision(fresh, Action.STOP, at_end, why, kind)
    if experiment_done is not None and experiment_done():
        return ResultDecision(
            fresh, Action.STOP_EXPERIMENT, False, EXPERIMENT_STOPPED, StopKind.EXPERIMENT
        )
    decision = scheduler(trial, result) if scheduler is not None and fresh else Action.CONTINUE
    if decision in (Action.STOP, Action.PAUSE):
        said = scheduler_reason(trial.trial_id) if scheduler_reason is not None else None
        if decision == Action.STOP:
            at_end = trial.checkpoint_at_end and not has_checkpoint
            kind = (
                scheduler_kind(trial.trial_id) if scheduler_kind is not None else StopKind.SCHEDULER
            )
            why = said or "the scheduler stopped it"
            return ResultDecision(fresh, Action.STOP, at_end, why, kind)
        return ResultDecision(fresh, Action.PAUSE, False, said or "the scheduler paused it")
    return ResultDecision(
        fresh, Action.CONTINUE, trial.should_checkpoint() and not has_checkpoint, "it continues"
    )


NO_RUN_AHEAD = 0


def run_ahead_below(trial: Trial, *, results_judged: bool) -> int:
    """The ``training_iteration`` below which :func:`after_result` is sure to say CONTINUE without
    a checkpoint, whatever the result's metrics: after such a result the trial may train its next
    iteration before its caller has seen the result (the runner's actor does, to hide the round
    trip to the runner). The runner still calls :func:`after_result` on every result; this only
    says where the answer is known in advance. 0 (:data:`NO_RUN_AHEAD`): nowhere.

    :param trial: the trial, whose stopping criterion and ``checkpoint_freq`` bound it.
    :param results_judged: a scheduler or an experiment-wide stopper judges each result, so no
        answer is known in advance.
    """
    if results_judged:
        return NO_RUN_AHEAD
    bound = sys.maxsize
    stopper = trial.stopper
    if stopper is not None:
        if not isinstance(stopper, ThresholdStopper) or set(stopper.thresholds) != {
            TRAINING_ITERATION
        }:
            return NO_RUN_AHEAD  # it reads metrics, or is code: known only once the result is seen
        bound = math.ceil(stopper.thresholds[TRAINING_ITERATION])
    if trial.checkpoint_freq > 0:
        last = int(trial.last_result.get(TRAINING_ITERATION, 0))
        bound = min(bound, (last // trial.checkpoint_freq + 1) * trial.checkpoint_freq)
    return bound


def run_ahead_rule(
    scheduler: TrialScheduler, experiment_stopper: Stopper | None
) -> Callable[[Trial], int]:
    """:func:`run_ahead_below` for a runner's trials: nowhere when its scheduler
    (``judges_results()``) or its experiment-wide stopper (``judges_experiment()``) judges
    results."""
    judged = scheduler.judges_results() or (
        experiment_stopper is not None and experiment_stopper.judges_experiment()
    )
    return functools.partial(run_ahead_below, results_judged=judged)


def hand_over_from(trial: Trial) -> int | None:
    """The ``training_iteration`` from which :func:`after_result` is sure to say STOP, with no
    checkpoint to save, whatever the result's metrics and whatever a scheduler would say; a result
    with ``done`` (its trainable returned, or reported ``done=True``) always ends the trial so.
    After such a result the trial's actor needs nothing more of it, so it may hand itself over to
    the next trial at once (:func:`ends_for_sure`; docs/engine.md, "Hand-over"). The runner still
    calls :func:`after_result` on that result; this only says where its answer is known in
    advance.

    :param trial: the trial, whose stopping criterion and ``checkpoint_at_end`` bound it.
    :return: that iteration; ``sys.maxsize`` when only a ``done`` result is sure to end it (no
        criterion, or one on metrics); None when no result is (``checkpoint_at_end``: its end may
        save a checkpoint from the actor).
    """
    if trial.checkpoint_at_end:
        return None
    stopper = trial.stopper
    if isinstance(stopper, ThresholdStopper) and set(stopper.thresholds) == {TRAINING_ITERATION}:
        return math.ceil(stopper.thresholds[TRAINING_ITERATION])
    return sys.maxsize


def ends_for_sure(result: Result, from_iteration: int) -> bool:
    """Does ``result`` end its trial whatever else happens, given :func:`hand_over_from`'s
    ``from_iteration``? The trial actor asks this after each result it was offered a successor
    with."""
    return bool(result.get(DONE)) or int(result.get(TRAINING_ITERATION, 0)) >= from_iteration


class Outcome(StrEnum):
    """What happens to a trial after a failure."""

    RESUME = "RESUME"  # lost to infrastructure: resume it from its latest checkpoint, not counted
    RETRY = "RETRY"  # a failure within its budget: retry it from its latest checkpoint
    FAIL = "FAIL"  # failed for good: it ends in ERROR


@dataclass(frozen=True)
class FailureDecision:
    """:param outcome: what happens next.
    :param num_failures: the trial's failures counting this one (unchanged on RESUME).
    :param fail_experiment: with FAIL and ``fail_fast``: end the experiment's other trials too.
    :param reason: why, for logs and the task log.
    """

    outcome: Outcome
    num_failures: int
    fail_experiment: bool
    reason: str


def after_failure(
    trial_id: str,
    num_failures: int,
    max_failures: int,
    *,
    infrastructure: bool = False,
    infrastructure_restarts: int = 0,
    max_infrastructure_restarts: int | None = None,
    retries_left: bool = True,
    fail_fast: bool = False,
) -> FailureDecision:
    """Decide a failed trial's fate.

    :param trial_id: the trial, named in the reason.
    :param num_failures: its failures before this one.
    :param max_failures: failures it may retry after; -1 unlimited.
    :param infrastructure: lost with its node or its Ray cluster, not through its own code: it is
        resumed without counting a failure (ray-project/ray#41285), while
        ``infrastructure_restarts < max_infrastructure_restarts`` and the caller can run it again.
    :param infrastructure_restarts: such resumes so far (the operator counts them per try).
    :param max_infrastructure_restarts: the most of them; default unlimited.
    :param retries_left: the caller can run it again (Airflow: the task has a retry left).
    :param fail_fast: a trial failing for good ends the experiment.
    """
    can_restart = (
        max_infrastructure_restarts is None or infrastructure_restarts < max_infrastructure_restarts
    )
    if infrastructure and can_restart and retries_left:
        limit = "" if max_infrastructure_restarts is None else f" of {max_infrastructure_restarts}"
        return FailureDecision(
            Outcome.RESUME,
            num_failures,
            False,
            f"This is not a failure of trial {trial_id}: resuming it from its latest checkpoint "
            "without counting it against max_failures (infrastructure restart "
            f"{infrastructure_restarts + 1}{limit}).",
        )
    failures = num_failures + 1
    budget = "unlimited" if max_failures < 0 else str(max_failures)
    within = max_failures < 0 or failures <= max_failures
    if within and retries_left:
        return FailureDecision(
            Outcome.RETRY,
            failures,
            False,
            f"Trial {trial_id} failed (failure {failures} of at most {budget}); retrying from its "
            "latest checkpoint.",
        )
    why = (
        f"it reached its max_failures ({budget})" if not within else "its task has no retries left"
    )
    return FailureDecision(
        Outcome.FAIL,
        failures,
        fail_fast,
        f"Trial {trial_id} failed for good (failure {failures}): {why}.",
    )


class Transition(StrEnum):
    """A change of a trial's stored status other than its end (see :func:`status_after_end`)."""

    QUEUED = "QUEUED"  # registered, or waiting for Ray to place it: PENDING
    PLACED = "PLACED"  # Ray placed its actor, which trains: RUNNING
    RESET = "RESET"  # its task was cleared: PENDING, with a fresh budget of failures
    STOPPED = "STOPPED"  # stopped from Airflow (a killed or cleared task): TERMINATED, with why
    ABANDONED = "ABANDONED"  # its task ended for good without recording its end: ERROR, with why


TRANSITION_STATUS: dict[Transition, TrialStatus] = {
    Transition.QUEUED: TrialStatus.PENDING,
    Transition.PLACED: TrialStatus.RUNNING,
    Transition.RESET: TrialStatus.PENDING,
    Transition.STOPPED: TrialStatus.TERMINATED,
    Transition.ABANDONED: TrialStatus.ERROR,
}


def status_after_end(end: TrialEnd, decision: FailureDecision | None) -> TrialStatus:
    """The status a trial is recorded with once its watch ended: TERMINATED when it finished,
    else as ``decision`` (from :func:`after_failure`) says: ERROR when it failed for good, PENDING
    when its task's next try resumes or retries it."""
    if end.finished:
        return TrialStatus.TERMINATED
    if decision is None:
        raise ValueError(
            f"Trial {end.trial_id} ended {end.status.value}: decide its fate with after_failure() "
            "before recording its end."
        )
    return TrialStatus.ERROR if decision.outcome is Outcome.FAIL else TrialStatus.PENDING


# -- the start of a try ---------------------------------------------------------------------------


class ActorState(StrEnum):
    """A trial's Ray actor, as the task starting a try finds it; the one reader of Ray that gives
    it is :func:`~airflow_trials.execution.ray_state.trial_actor_state`."""

    GONE = "GONE"  # no actor, or it died as the task looked
    QUEUED = "QUEUED"  # Ray has not placed it: it waits for resources, and starts its trial then
    RUNNING = "RUNNING"  # placed, training its trial
    TERMINATED = "TERMINATED"  # its trial finished there; the actor waits to be released
    STALE = "STALE"  # alive, but its trial failed or never started: left by a try that died


class StoredTrial(Protocol):
    """What :func:`on_start` reads of a trial's record in the trials DB (a ``TrialRecord``)."""

    @property
    def trial_id(self) -> str: ...
    @property
    def status(self) -> TrialStatus: ...
    @property
    def last_result(self) -> Mapping[str, Any] | None: ...
    @property
    def stop_reason(self) -> str | None: ...
    @property
    def stop_kind(self) -> StopKind | None: ...
    @property
    def stopped_from_airflow(self) -> bool: ...


class Start(StrEnum):
    """How a try of a trial's task starts."""

    REATTACH = "REATTACH"  # its actor lives: watch it again
    REPORT_END = "REPORT_END"  # it ended for good and the task was not cleared: report that end
    RESTART = "RESTART"  # it ended for good and the task was cleared: run it again from scratch
    RESET = "RESET"  # the task was cleared: from its latest checkpoint, fresh failure budget
    RESUME = "RESUME"  # a retry: from its latest checkpoint


@dataclass(frozen=True)
class StartAction:
    """What :func:`on_start` decided; the operator does it.

    :param start: how the try starts.
    :param stop_actor: kill the actor found first (stale, or being stopped by an earlier try);
        only when the trial is launched.
    :param placed: REATTACH: Ray placed the actor already (else it is queued for resources).
    :param transition: recorded before the launch: RESET (fresh budget) or QUEUED (from an end);
        None records nothing then.
    :param reason: why, for the task's log.
    """

    start: Start
    stop_actor: bool
    placed: bool
    transition: Transition | None
    reason: str

    @property
    def launches(self) -> bool:
        """Does the try start the trial on Ray (RESTART, RESET or RESUME)?"""
        return self.start in (Start.RESTART, Start.RESET, Start.RESUME)


def ended_for_good(trial: Trial, stored: StoredTrial) -> bool:
    """Did the stored trial end TERMINATED having met ``trial``'s stopping criterion, or stopped
    by its scheduler (its stop kind says so)? Such a trial has nothing left to run."""
    if stored.status is not TrialStatus.TERMINATED or not stored.last_result:
        return False
    if stored.stop_kind is not None and stored.stop_kind.by_scheduler:
        return True
    try:
        return trial.should_stop(dict(stored.last_result))
    except KeyError:  # the criterion names a metric the stored result lacks
        return False


def on_start(
    stored: StoredTrial,
    actor: ActorState,
    *,
    trial: Trial,
    try_number: int,
    cleared: bool,
    handle_kept: bool = True,
) -> StartAction:
    """Decide how a try of a trial's task starts, from what it finds.

    :param stored: the trial's record, as this try registered it.
    :param actor: its Ray actor's state.
    :param trial: the trial as this try defines it (its stopping criterion says whether the stored
        end is final: a cleared task may have raised it).
    :param try_number: this try's number, for the reason.
    :param cleared: the first try after the task was cleared (Airflow re-runs it with fresh
        retries: :func:`~airflow_trials.core.airflow_tries.first_try_after_a_clear`).
    :param handle_kept: False when a user cleared the task's handle in Airflow's task state store
        (``operators/task_handle.py``): the try starts as a cleared one and never re-attaches.
    """
    trial_id = stored.trial_id
    cleared = cleared or not handle_kept
    being_stopped = actor is not ActorState.GONE and stored.stopped_from_airflow
    if actor is ActorState.GONE and ended_for_good(trial, stored):
        return _start_after_its_end(stored, try_number, cleared)
    live = actor in (ActorState.QUEUED, ActorState.RUNNING, ActorState.TERMINATED)
    if live and not being_stopped and handle_kept:
        return StartAction(
            Start.REATTACH,
            False,
            actor is not ActorState.QUEUED,
            None,
            f"Trial {trial_id} is {actor.value} on Ray already; re-attaching to it.",
        )
    stop_actor = actor is not ActorState.GONE
    why = _why_start_again(trial_id, being_stopped, stop_actor)
    if cleared:
        what = "task" if handle_kept else "handle in the task state store"
        return StartAction(
            Start.RESET,
            stop_actor,
            False,
            Transition.RESET,
            f"{why} with a fresh budget of failures (its {what} was cleared).",
        )
    return StartAction(
        Start.RESUME,
        stop_actor,
        False,
        Transition.QUEUED if stored.status.is_terminal() else None,
        f"{why} from its latest checkpoint (try {try_number}).",
    )


def _start_after_its_end(stored: StoredTrial, try_number: int, cleared: bool) -> StartAction:
    """:func:`on_start` for a trial that ended for good and has no actor: report its end, or,
    when its task was cleared, run it again from scratch."""
    trial_id = stored.trial_id
    if not cleared:
        # A retry after the trial ended (Airflow lost the try that finished it), or a reused
        # trial id: nothing to run.
        return StartAction(
            Start.REPORT_END,
            False,
            False,
            None,
            f"Trial {trial_id} already finished; reporting its stored state.",
        )
    return StartAction(
        Start.RESTART,
        False,
        False,
        Transition.RESET,
        f"Trial {trial_id} had finished (last result {stored.last_result}) and its task was "
        f"cleared: try {try_number} runs it again from scratch.",
    )


def _why_start_again(trial_id: str, being_stopped: bool, stop_actor: bool) -> str:
    """Why :func:`on_start` starts the trial (again) rather than re-attach to its actor."""
    if being_stopped:
        # The previous try recorded that it stops this actor (its task was cleared) before this
        # try registered: never re-attach to an actor being killed.
        return f"Trial {trial_id} is being stopped by its cleared previous try; starting it again"
    if stop_actor:
        return (
            f"Trial {trial_id}'s actor lives but is not re-attached to (its trial is not running, "
            "or its task's handle was cleared): stopping it and starting the trial again"
        )
    return f"Trial {trial_id} has no actor on Ray; starting it"
