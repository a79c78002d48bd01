"""Holds: where a self-driving trial actor waits for its scheduler's verdict (the Airflow path).

On the runner path the scheduler is asked after each result, in the runner's loop. On the Airflow
path the trial drives itself on Ray and its scheduler (ASHA's rungs, in the trials store) is asked
by the trial's trigger, which sees results only when it polls. So that a trial stopped at a rung
trains at most the result that reached it, the actor *holds* after a result that reaches one of
its hold points (ASHA: its bracket's milestones, and ``max_t``; the median rule: every result
from ``grace_period``, its ``every_from``) until the trigger gives its verdict on that result:
``CONTINUE`` (it trains on) or ``STOP`` (with the reason and the stop kind: SCHEDULER, or MAX_T
at ``max_t``). A verdict the trigger gives for a
result the actor did not hold at (a stored STOP met again) applies at the trial's next result. The
actor's loop turns verdicts into what happens next through
:func:`airflow_trials.core.fate.after_result`, as every path does.

A trigger that stops (the triggerer restarts) leaves the actor holding; the next trigger polls
it, judges the held result again (the store returns the verdict it recorded) and releases it.

Example::

    holds = Holds.from_spec({"time_attr": "training_iteration", "points": [1, 4, 16]})
    holds.holds_at({"training_iteration": 4})   # True: wait for the verdict
    holds.give(4, "STOP", "stopped by ASHA at training_iteration=4 (rung 2 of 3): ...")
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

from airflow_trials.core.scheduler import Decision
from airflow_trials.core.stop_kind import StopKind
from airflow_trials.execution.actor_spec import HoldSpec

#: A verdict as the actor keeps it: the decision, why, and with STOP the kind of the trial's end.
HeldVerdict = tuple[Decision, str | None, StopKind]
_CONTINUE: HeldVerdict = (Decision.CONTINUE, None, StopKind.SCHEDULER)


class Holds:
    """One trial's hold points and the verdicts its trigger gave; thread-safe.

    :param time_attr: the result key the points are in (ASHA's ``time_attr``).
    :param points: the values of ``time_attr`` at which the trial waits for a verdict.
    :param every_from: the trial also waits at every result whose ``time_attr`` is at least
        this; default None (only at ``points``).
    """

    def __init__(
        self, time_attr: str, points: list[float], every_from: float | None = None
    ) -> None:
        self.time_attr = time_attr
        self.points = sorted(float(p) for p in points)
        self.every_from = None if every_from is None else float(every_from)
        self._passed: set[float] = set()
        self._verdicts: dict[int, HeldVerdict] = {}
        self._changed = threading.Condition()
        self.held_at: int | None = None

    @classmethod
    def from_spec(cls, spec: HoldSpec | None) -> Holds | None:
        if not spec:
            return None
        return cls(str(spec["time_attr"]), list(spec["points"]), spec.get("every_from"))

    def holds_at(self, result: Mapping[str, Any]) -> bool:
        """Does ``result`` reach a hold point the trial has not been released from yet?"""
        time = result.get(self.time_attr)
        if not isinstance(time, (int, float)):
            return False
        if self.every_from is not None and time >= self.every_from:
            return True
        with self._changed:
            return any(p <= time and p not in self._passed for p in self.points)

    def hold(self, iteration: int, time: float, stopping: Callable[[], bool]) -> HeldVerdict:
        """Wait for the verdict on result ``iteration`` (at ``time``); CONTINUE when ``stopping()``
        becomes true first (the trial is being stopped from outside)."""
        with self._changed:
            self.held_at = iteration
            self._changed.notify_all()
            while iteration not in self._verdicts and not stopping():
                self._changed.wait(0.5)
            self.held_at = None
            self._passed.update(p for p in self.points if p <= time)
            return self._verdicts.get(iteration, _CONTINUE)

    def told(self, iteration: int) -> HeldVerdict:
        """The verdict for a result not held at: a STOP given for it or an earlier one, else
        CONTINUE."""
        with self._changed:
            stops = [
                (i, v)
                for i, v in self._verdicts.items()
                if i <= iteration and v[0] is Decision.STOP
            ]
            return min(stops)[1] if stops else _CONTINUE

    def give(
        self,
        iteration: int,
        decision: str,
        reason: str | None,
        stop_kind: str = StopKind.SCHEDULER.value,
    ) -> None:
        """The trigger's verdict on result ``iteration``; the first verdict for a result stands.
        ``stop_kind`` is the kind of the trial's end with STOP (default SCHEDULER)."""
        with self._changed:
            verdict = (Decision(decision), reason, StopKind(stop_kind))
            self._verdicts.setdefault(iteration, verdict)
            self._changed.notify_all()

    def wake(self) -> None:
        """Let a hold see that the trial is being stopped."""
        with self._changed:
            self._changed.notify_all()
