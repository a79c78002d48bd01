"""HandOvers: which waiting trial takes over a running trial's actor the moment that trial ends,
and with which of its calls the runner offers it.

With actor reuse, an ended trial's actor serves the next trial of the same resources. Without a
hand-over that costs round trips to the runner after the trial's end: fetching the end, the
actor's stop, its reset to the next trial and the next trial's first ``train``. With a hand-over
the runner names the next trial (the *successor*) in a ``train`` call that may bring the end; a
result that is sure to end the trial (``core/fate.py`` ``ends_for_sure``) is followed on the actor
at once by the stop and the successor's start, and the runner, having recorded the end as always,
starts the successor on that actor without a reset (docs/engine.md, "Hand-over")::

    hand_overs = HandOvers(executor, enabled=True, waiting=runner_trials, has_room=has_room)
    executor.continue_training(trial, run_ahead_below, hand_overs.offer(trial))
    ...
    hand_overs.learn(trial, iteration_before, result)     # after each fetched result

A successor is offered only where the scheduler starts trials in order
(``TrialScheduler.picks_in_order``): it is the first waiting trial, the one that would start
next, and it is held back for no other slot (the runner skips it while the offer stands) only
while no other slot could take it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from airflow_trials.core.fate import hand_over_from
from airflow_trials.core.resources import Resources
from airflow_trials.core.result import DONE, TRAINING_ITERATION, Result
from airflow_trials.core.status import TrialStatus
from airflow_trials.core.trial import Trial

# How many distinct iterations after which trials of one trainable ended on their own are kept.
_ENDS_KEPT = 4


class OffersSuccessors(Protocol):
    """What :class:`HandOvers` asks of the runner's executor (``RayTrialExecutor``)."""

    def reserved_trial_ids(self) -> set[str]: ...

    def can_take_over(self, trial: Trial) -> bool: ...


@dataclass(frozen=True)
class Successor:
    """The trial offered to take over a running trial's actor when that trial ends.

    :param trial: the waiting trial.
    :param hand_over_from: ``core/fate.py`` ``hand_over_from`` of the running trial: from which
        ``training_iteration`` its end is sure (a ``done`` result always is).
    """

    trial: Trial
    hand_over_from: int


class HandOvers:
    """Offers each running trial its successor with the calls that may bring its end.

    A trial's end is known in advance when its stopping criterion is on ``training_iteration``
    only: the call for that iteration brings it. A function that ends by returning (or by
    reporting ``done=True``) says so only in the result; the call that brings that end is guessed
    from the trials of the same trainable that ended on their own before (after which iteration
    their end came), so that a waiting trial is held for a trial's last call, not for its whole
    run. A wrong guess costs only that the trial ends without a hand-over (as before), or that its
    successor is held back for one call.

    :param executor: the runner's executor, which holds the offers and the handed-over actors.
    :param enabled: hand over at all: actor reuse is on and the scheduler picks in order.
    :param waiting: the runner's trials from the first unfinished one on, in order.
    :param has_room: whether a trial of these resources could start now on a free slot (asked
        without effect).
    """

    def __init__(
        self,
        executor: OffersSuccessors,
        *,
        enabled: bool,
        waiting: Callable[[], Iterable[Trial]],
        has_room: Callable[[Resources], bool],
    ) -> None:
        self.executor = executor
        self.enabled = enabled
        self._waiting = waiting
        self._has_room = has_room
        self._ended_after: dict[str, list[int]] = {}

    def offer(self, trial: Trial) -> Successor | None:
        """The successor to name in ``trial``'s next ``train`` call, or None."""
        if not self.enabled:
            return None
        bound = hand_over_from(trial)
        if bound is None:
            return None
        last = int(trial.last_result.get(TRAINING_ITERATION, 0))
        if last + 1 < bound and last not in self._ended_after.get(trial.trainable, ()):
            return None
        successor = self._first_waiting()
        if (
            successor is None
            or successor.resources != trial.resources
            or successor.restore_source() is not None
            or self._has_room(successor.resources)  # a free slot takes it now: do not hold it
            or not self.executor.can_take_over(successor)
        ):
            return None
        return Successor(successor, bound)

    def _first_waiting(self) -> Trial | None:
        """The trial the scheduler starts next: the first PENDING one no offer holds."""
        reserved = self.executor.reserved_trial_ids()
        for trial in self._waiting():
            if trial.status == TrialStatus.PENDING and trial.trial_id not in reserved:
                return trial
        return None

    def learn(self, trial: Trial, iteration_before: int, result: Result) -> None:
        """Note after which iteration ``trial``'s own end came, when ``result`` is that end
        (``done``: its function returned or reported ``done=True``)."""
        if not self.enabled or not result.get(DONE):
            return
        seen = self._ended_after.setdefault(trial.trainable, [])
        if iteration_before in seen:
            return
        seen.append(iteration_before)
        del seen[:-_ENDS_KEPT]
