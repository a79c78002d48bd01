"""Synchronous HyperBand, deciding exactly as Ray Tune 2.60's HyperBandScheduler."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from airflow_trials.core.result import Result
from airflow_trials.core.scheduler import Decision, HasResources, MetricScheduler, format_number
from airflow_trials.core.status import TrialStatus
from airflow_trials.core.trial import Trial

PendingActions = list[tuple[str, Decision]]
"""(trial id, decision) pairs for trials other than the one whose result is being processed."""


@dataclass
class _Entry:
    """What a bracket keeps of one live trial: its latest time and score (``sign * metric``)."""

    trial: Trial
    time: float = 0.0  # Ray counts a trial without a result as at time 0
    score: float = math.nan


class _Bracket:
    """One bracket of successive halving: its live trials, its milestone and its progress.

    :param round_number: the HyperBand round (Ray's band) it belongs to, from 1.
    :param s: its place in the round, from 0; it halves its trials ``s`` times.
    :param max_trials: how many trials it takes (Ray's ``n``); divided by ``reduction_factor``
        at each halving. ``first_milestone`` is Ray's ``r``; the other parameters are the
        scheduler's.
    """

    def __init__(
        self,
        round_number: int,
        s: int,
        max_trials: int,
        first_milestone: int,
        max_t: float,
        reduction_factor: float,
        stop_last_trials: bool,
    ) -> None:
        self.round_number, self.number = round_number, s + 1
        self.max_trials = max_trials
        self.milestone = first_milestone
        self.halvings_left = s
        self.max_t = max_t
        self.reduction_factor = reduction_factor
        self.stop_last_trials = stop_last_trials
        self.live: dict[str, _Entry] = {}  # in the order trials were added, as Ray iterates them
        self.all_trials: list[Trial] = []
        self.to_resume: set[str] = set()  # PAUSED trials the last halving let go on
        # Ray's is_being_processed: set at the first halving and never cleared. From then on,
        # a trial leaving the bracket no longer triggers a halving.
        self.halved = False
        self.progress = 0.0
        self.total_work = self._total_work(max_trials, first_milestone, s)

    def _total_work(self, trials: int, milestone: int, s: int) -> int:
        # Ray caps each later step by max_t minus the *first* milestone; kept as is, since it
        # weighs the brackets that choose_trial_to_run sorts by.
        work, step = 0, milestone
        for _ in range(s + 1):
            work += trials * step
            trials = math.ceil(trials / self.reduction_factor)
            step = int(min(step * self.reduction_factor, self.max_t - milestone))
        return work

    def add(self, trial: Trial) -> None:
        self.live[trial.trial_id] = _Entry(trial)
        self.all_trials.append(trial)

    def filled(self) -> bool:
        return len(self.live) == self.max_trials

    def iteration_done(self) -> bool:
        return all(entry.time >= self.milestone for entry in self.live.values())

    def finished(self) -> bool:
        return self.stop_last_trials and self.halvings_left == 0 and self.iteration_done()

    def continues(self, trial_id: str) -> bool:
        if not self.stop_last_trials and self.halvings_left == 0:
            return True
        return self.live[trial_id].time < self.milestone

    def update(self, trial_id: str, time: float, score: float) -> None:
        entry = self.live[trial_id]
        # A trial restored from an older checkpoint goes back in time: Ray subtracts it too.
        self.progress += time - entry.time
        entry.time, entry.score = time, score
        self.to_resume.discard(trial_id)

    def drop(self, trial_id: str) -> None:
        self.live.pop(trial_id, None)

    def halve(self) -> tuple[list[str], list[str]]:
        """Raise the milestone and shrink ``max_trials``; returns the trials kept and those cut,
        each worst first."""
        if self.halvings_left == 0 and not self.stop_last_trials:
            return list(self.live), []  # the last step without stop_last_trials keeps everyone
        self.halvings_left -= 1
        self.max_trials = math.ceil(self.max_trials / self.reduction_factor)
        self.milestone = int(min(self.milestone * self.reduction_factor, self.max_t))
        # A stable sort of the trials in added order, NaN scores included, as Ray sorts them.
        ranked = sorted(self.live, key=lambda trial_id: self.live[trial_id].score)
        return ranked[-self.max_trials :], ranked[: -self.max_trials]

    def completion(self) -> float:
        if self.finished():
            return 1.0
        return min(self.progress / self.total_work, 1.0)

    def __str__(self) -> str:
        return f"round {self.round_number}, bracket {self.number}"

    def describe(self, status_of: Callable[[Trial], TrialStatus]) -> str:
        """Ray's ``repr`` of a bracket, so both debug strings read alike."""
        counts = Counter(status_of(trial).value for trial in self.all_trials)
        statuses = ", ".join(sorted(f"{status}: {count}" for status, count in counts.items()))
        return (
            f"Bracket(Max Size (n)={self.max_trials}, Milestone (r)={self.milestone}, "
            f"completed={self.completion():.1%}): {{{statuses}}} "
        )


class HyperBandScheduler(MetricScheduler):
    """Synchronous HyperBand (https://arxiv.org/abs/1603.06560), as Ray Tune 2.60's.

    Trials fill brackets in the order they are added. A round (Ray's band) holds up to
    ``round(log(max_t) / log(reduction_factor)) + 1`` brackets; bracket ``s`` of a round takes
    ``ceil(brackets_per_round / (s + 1) * reduction_factor**s)`` trials and first runs them to
    ``int(max_t / reduction_factor**s)`` of ``time_attr``. A trial that reaches its bracket's
    milestone is paused until every live trial of the bracket has; then the bracket halves: the
    best ``1/reduction_factor`` go on to the next milestone (``reduction_factor`` times further,
    at most ``max_t``), the others are stopped. With ``stop_last_trials``, a bracket whose last
    milestone everyone reached is finished and its trials are stopped. :meth:`choose_trial_to_run`
    runs PENDING trials and the PAUSED trials a halving let go on, least complete bracket first.
    :meth:`decision_reason` tells why a trial was paused or stopped.

    A halving also stops trials other than the one that reported (they wait PAUSED). The scheduler
    cannot stop them itself: it forgets them at once, as Ray Tune does, and queues a STOP for each;
    the caller takes them with :meth:`take_pending_actions` after every ``on_trial_*`` call and
    stops those trials (``TrialRunner.stop_trial``). Letting paused trials go on needs nothing
    more: :meth:`choose_trial_to_run` returns them.

    Every result must carry ``metric`` and ``time_attr`` (a ValueError names the missing key), and
    ``time_attr`` must be >= 0 (Ray Tune asserts). Unlike Ray Tune, a trial that is already
    TERMINATED or ERROR when added (a resumed experiment's) is placed in no bracket: in Ray Tune
    it would hold its bracket's halving back for ever.

    Example::

        scheduler = HyperBandScheduler(metric="score", mode="max", max_t=81, reduction_factor=3)
        runner = TrialRunner("mnist", storage_path="/shared/results", scheduler=scheduler)

    :param time_attr: the result key measuring progress; default ``"training_iteration"``.
    :param metric: the result key judged; default None (then set_search_properties must set it).
    :param mode: ``"min"`` or ``"max"``; default None (likewise).
    :param max_t: the most ``time_attr`` a trial runs for; at least 1. Default 81.
    :param reduction_factor: Ray's ``eta``: milestones grow by it and each halving keeps the top
        ``1/reduction_factor``; default 3.
    :param stop_last_trials: stop a bracket's trials once they all reached its last milestone;
        default True.
    """

    def __init__(
        self,
        time_attr: str = "training_iteration",
        metric: str | None = None,
        mode: str | None = None,
        max_t: float = 81,
        reduction_factor: float = 3,
        stop_last_trials: bool = True,
    ) -> None:
        super().__init__(metric, mode)
        _check_settings(type(self).__name__, max_t, reduction_factor)
        self.time_attr = time_attr
        self.max_t = max_t
        self.reduction_factor = reduction_factor
        self.stop_last_trials = stop_last_trials
        # math.log rounds as Ray's np.log here (checked over 161,910 settings).
        self._brackets_per_round = int(round(math.log(max_t) / math.log(reduction_factor))) + 1
        # Rounds of brackets; None where a bracket's first milestone would be 0 (Ray skips it).
        self._rounds: list[list[_Bracket | None]] = [[]]
        self._current: _Bracket | None = None
        self._bracket_of: dict[str, _Bracket] = {}  # never shrinks, as Ray's _trial_info
        self._pending: PendingActions = []
        self._stopping: set[str] = set()  # stopped by a halving; the caller has not yet
        self._num_stopped = 0

    # -- trials coming and going ------------------------------------------------------------------
    def on_trial_add(self, trial: Trial) -> None:
        self._check_ready(trial)
        if trial.status.is_terminal():
            return
        bracket = self._current
        if bracket is None or bracket.filled():
            bracket = self._open_bracket()
        bracket.add(trial)
        self._bracket_of[trial.trial_id] = bracket

    def _open_bracket(self) -> _Bracket:
        while True:
            if len(self._rounds[-1]) == self._brackets_per_round:
                self._rounds.append([])
            band = self._rounds[-1]
            s = len(band)
            first_milestone = int(self.max_t * self.reduction_factor ** (-s))
            max_trials = int(
                math.ceil(self._brackets_per_round / (s + 1) * self.reduction_factor**s)
            )
            bracket = None
            if first_milestone > 0:
                bracket = _Bracket(
                    len(self._rounds),
                    s,
                    max_trials,
                    first_milestone,
                    self.max_t,
                    self.reduction_factor,
                    self.stop_last_trials,
                )
                self._current = bracket
            band.append(bracket)
            if bracket is not None:
                return bracket

    def on_trial_complete(self, trial: Trial, result: Result) -> None:
        self.on_trial_remove(trial)

    def on_trial_error(self, trial: Trial) -> None:
        self.on_trial_remove(trial)

    def on_trial_remove(self, trial: Trial) -> None:
        if trial.trial_id in self._stopping:
            # A halving stopped it and forgot it then; this is the caller carrying the stop out.
            self._stopping.discard(trial.trial_id)
            return
        if trial.trial_id in self._bracket_of:
            self._forget(trial.trial_id)

    def _forget(self, trial_id: str) -> None:
        """Ray's on_trial_remove: a trial leaving a bracket that never halved may let it halve."""
        bracket = self._bracket_of[trial_id]
        bracket.drop(trial_id)
        if not bracket.finished() and not bracket.halved:
            self._process(bracket, None)  # Ray's controller ignores the decision

    def take_pending_actions(self) -> PendingActions:
        """The STOPs of other trials decided since the last call, oldest first; the caller must
        carry each out (``TrialRunner.stop_trial``). The list is emptied."""
        pending, self._pending = self._pending, []
        return pending

    # -- results ----------------------------------------------------------------------------------
    def on_trial_result(self, trial: Trial, result: Result) -> Decision:
        bracket = self._live_bracket(trial)
        time = self._number(trial, result, self.time_attr, "time_attr")
        value = self._number(trial, result, str(self.metric), "metric")
        if time < 0:
            raise ValueError(
                f"Trial {trial.trial_id} reported {self.time_attr}={format_number(time)}: "
                f"{type(self).__name__} needs a time_attr >= 0 that grows with training."
            )
        bracket.update(trial.trial_id, time, self._sign * value)
        if bracket.continues(trial.trial_id):
            return Decision.CONTINUE
        return self._process(bracket, trial.trial_id)

    def _live_bracket(self, trial: Trial) -> _Bracket:
        bracket = self._bracket_of.get(trial.trial_id)
        if bracket is None or trial.trial_id not in bracket.live:
            raise ValueError(
                f"{type(self).__name__} got a result of trial {trial.trial_id}, which it was never "
                f"given or which already left its bracket; call on_trial_add(trial) first "
                f"(TrialRunner.add_trial does), and send no results after a trial is stopped."
            )
        return bracket

    def _process(self, bracket: _Bracket, current: str | None) -> Decision:
        """Ray's _process_bracket: halve the bracket once every live trial reached its milestone.

        ``current`` is the id of the trial whose result is processed (None when a trial left); the
        decision returned is for it.
        """
        if not bracket.iteration_done():
            if current is not None:
                self._say_waiting(bracket, current)
            return Decision.PAUSE
        if bracket.finished():
            for trial_id, entry in list(bracket.live.items()):
                if trial_id != current and entry.trial.status == TrialStatus.PAUSED:
                    self._stop_other(trial_id, self._said_finished(bracket, trial_id))
            if current is not None:
                self._reasons[current] = self._said_finished(bracket, current)
            return Decision.STOP
        bracket.halved = True
        milestone, count = bracket.milestone, len(bracket.live)
        kept, cut = bracket.halve()
        self._num_stopped += len(cut)
        decision = Decision.PAUSE
        for index, trial_id in enumerate(cut):
            reason = self._said_cut(bracket, trial_id, milestone, count - index, count)
            decision = self._stop(bracket, trial_id, current, reason) or decision
        for trial_id in kept:
            entry = bracket.live[trial_id]
            if bracket.continues(trial_id):
                if trial_id == current:
                    decision = Decision.CONTINUE
                elif entry.trial.status == TrialStatus.PAUSED:
                    bracket.to_resume.add(trial_id)
            elif bracket.finished() and bracket.stop_last_trials:
                if trial_id == current or entry.trial.status == TrialStatus.PAUSED:
                    reason = self._said_finished(bracket, trial_id)
                    decision = self._stop(bracket, trial_id, current, reason) or decision
            elif trial_id == current:
                self._say_ahead(bracket, trial_id, milestone)
        return decision

    def _stop(
        self, bracket: _Bracket, trial_id: str, current: str | None, reason: str
    ) -> Decision | None:
        """Stop a trial of a halving: STOP when it is ``current``, else queue its stop (None)."""
        if trial_id == current:
            self._reasons[trial_id] = reason
            bracket.drop(trial_id)
            return Decision.STOP
        self._stop_other(trial_id, reason)
        return None

    def _stop_other(self, trial_id: str, reason: str) -> None:
        self._reasons[trial_id] = reason
        self._pending.append((trial_id, Decision.STOP))
        self._stopping.add(trial_id)
        self._forget(trial_id)  # what Ray's controller does at once: it calls on_trial_remove

    # -- reasons ----------------------------------------------------------------------------------
    def _at(self, bracket: _Bracket, trial_id: str) -> str:
        return f"at {self.time_attr}={format_number(bracket.live[trial_id].time)}"

    def _say_waiting(self, bracket: _Bracket, trial_id: str) -> None:
        behind = sum(1 for entry in bracket.live.values() if entry.time < bracket.milestone)
        self._reasons[trial_id] = (
            f"paused by HyperBand {self._at(bracket, trial_id)}: it reached its bracket's "
            f"milestone {bracket.milestone} ({bracket}) and waits for {behind} other trial(s) to "
            f"reach it"
        )

    def _say_ahead(self, bracket: _Bracket, trial_id: str, milestone: int) -> None:
        self._reasons[trial_id] = (
            f"paused by HyperBand {self._at(bracket, trial_id)}: it passed the halving at "
            f"milestone {milestone} ({bracket}) and is already at the next one, "
            f"{bracket.milestone}; it waits for the bracket's other trials"
        )

    def _said_cut(
        self, bracket: _Bracket, trial_id: str, milestone: int, rank: int, count: int
    ) -> str:
        value = format_number(self._sign * bracket.live[trial_id].score)
        return (
            f"stopped by HyperBand {self._at(bracket, trial_id)} ({bracket}, milestone "
            f"{milestone}): {self.metric} {value} ranked {rank} of {count}, and only the best "
            f"{bracket.max_trials} go on"
        )

    def _said_finished(self, bracket: _Bracket, trial_id: str) -> str:
        return (
            f"stopped by HyperBand {self._at(bracket, trial_id)}: its bracket ({bracket}) reached "
            f"its last milestone, {bracket.milestone}"
        )

    # -- what runs next ---------------------------------------------------------------------------
    def choose_trial_to_run(
        self, trials: Sequence[Trial], has_resources: HasResources
    ) -> Trial | None:
        """Ray's choice: in the oldest round first, the least complete bracket first, the first of
        its live trials that is PENDING or PAUSED and let go on by a halving. ``trials`` is not
        read: the brackets know their trials. The chosen trial is returned only if it fits now;
        otherwise None, and it is chosen again once resources free up (Ray waits for it too)."""
        for band in self._rounds:
            brackets = sorted((b for b in band if b is not None), key=_Bracket.completion)
            for bracket in brackets:
                for trial_id, entry in bracket.live.items():
                    status = entry.trial.status
                    if status == TrialStatus.PENDING or (
                        status == TrialStatus.PAUSED and trial_id in bracket.to_resume
                    ):
                        return entry.trial if has_resources(entry.trial.resources) else None
        return None

    def debug_string(self) -> str:
        def status_of(trial: Trial) -> TrialStatus:
            return TrialStatus.TERMINATED if trial.trial_id in self._stopping else trial.status

        total = sum(len(band) for band in self._rounds)
        lines = [f"Using HyperBand: num_stopped={self._num_stopped} total_brackets={total}"]
        for index, band in enumerate(self._rounds):
            lines.append(f"Round #{index}:")
            lines.extend(f"  {b.describe(status_of)}" for b in band if b is not None)
        return "\n".join(lines)


def _check_settings(name: str, max_t: Any, reduction_factor: Any) -> None:
    if not max_t > 0:
        raise ValueError(
            f"{name} got max_t={max_t}: it must be > 0, the most time_attr a trial runs for."
        )
    if max_t < 1:
        raise ValueError(
            f"{name} got max_t={max_t}: the first bracket runs its trials to int(max_t), which "
            f"would be 0; use max_t >= 1 (in units of time_attr)."
        )
    if not reduction_factor > 1:
        raise ValueError(
            f"{name} got reduction_factor={reduction_factor}: it must be > 1 (each halving keeps "
            f"the top 1/reduction_factor of a bracket's trials); 2 to 4 is usual."
        )
