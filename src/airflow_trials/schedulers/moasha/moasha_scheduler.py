"""MOASHA: asynchronous successive halving over several metrics, deciding as Syne Tune 0.16's."""

# The rule (MOASHARungs) is written once and reads and writes its rungs only through
# VectorRungState, as ASHA's AshaRungs goes through RungState: MemoryVectorRungs holds them for
# the runner's MOASHA, the trials store holds them for the Airflow path (store/rungs.py
# StoredVectorRungs, one row per trial and rung, the metric values as JSON), where each trial's
# trigger judges its own results (moasha/moasha_judging.py). Values are kept in
# the metrics' own units; each mode turns them into costs (lower is better) only to rank, which is
# exact (a negation), so both states rank the very same numbers. The ranking itself (Syne Tune's
# non-dominated order and the verdict it gives) is in schedulers/moasha/moasha_rank.py.

from __future__ import annotations

import functools
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Protocol

from airflow_trials.core.pareto import check_several
from airflow_trials.core.result import Result
from airflow_trials.core.scheduler import (
    RULE_KEY,
    Decision,
    FIFOScheduler,
    RecordedVerdict,
    format_number,
)
from airflow_trials.core.stop_kind import StopKind
from airflow_trials.core.trial import Trial
from airflow_trials.schedulers.asha.asha_rungs import (
    MemoryRung,
    MemoryRungsOf,
    RecordedRung,
    judged_milestones,
)
from airflow_trials.schedulers.asha.async_hyperband import RandomSource
from airflow_trials.schedulers.asha.rung_math import (
    AT_END_REASON,
    REACHED_MAX_T,
    RungVerdict,
    check_asha_settings,
    draw_bracket,
    rung_milestones,
    rung_to_judge,
)
from airflow_trials.schedulers.moasha.moasha_rank import moasha_rung_decision, syne_tune_order

__all__ = [
    "MOASHA",
    "MOASHA_RULE",
    "MOASHARungs",
    "MemoryVectorRungs",
    "MetricVector",
    "VectorRungState",
    "moasha_rung_decision",
    "syne_tune_order",
]

#: The ``RULE_KEY`` value a serialized :class:`MOASHARungs` carries (the registry reads it).
MOASHA_RULE = "moasha"
#: One trial's values of the metrics, in the order of the scheduler's ``metric`` list.
MetricVector = tuple[float, ...]
#: Judges one vector from the vectors recorded at its rung before it, in the order recorded.
VectorDecide = Callable[[Sequence[MetricVector]], RungVerdict]


class VectorRungState(Protocol):
    """Where MOASHA's rungs live: the metric values every trial recorded at each rung, in the order
    recorded (the ranking depends on it), one verdict per trial and rung.

    :class:`MOASHARungs` reads and writes them through these methods only, so the rule is the same
    in memory (:class:`MemoryVectorRungs`) and in the trials DB (``store/rungs.py``
    ``StoredVectorRungs``).
    """

    def trial_rungs(self, trial_id: str) -> Iterable[RecordedRung]:
        """The rungs ``trial_id`` recorded values at, in any order."""

    def record(
        self,
        trial_id: str,
        *,
        bracket: int,
        milestone: float,
        values: MetricVector,
        iteration: int,
        at_end: bool,
        decide: VectorDecide,
    ) -> RecordedVerdict:
        """Record ``values`` at the rung and return ``decide``'s verdict on them, judged once:
        when the trial has values at ``milestone`` already, its stored verdict. ``decide`` gets
        the vectors recorded at (``bracket``, ``milestone``) before, in the order recorded."""

    def rung_vectors(self, bracket: int, milestone: float) -> list[MetricVector]:
        """The vectors recorded at a rung, in the order recorded."""


class MemoryVectorRungs(MemoryRungsOf[MetricVector]):
    """:class:`VectorRungState` in memory: the rungs of the runner's MOASHA, each trial's vector
    in the order recorded, as Syne Tune's rungs keep them."""

    def record(
        self,
        trial_id: str,
        *,
        bracket: int,
        milestone: float,
        values: MetricVector,
        iteration: int,
        at_end: bool,
        decide: VectorDecide,
    ) -> MemoryRung:
        return self._record(trial_id, bracket, milestone, tuple(values), iteration, at_end, decide)

    def rung_vectors(self, bracket: int, milestone: float) -> list[MetricVector]:
        return self._recorded(bracket, milestone)


@dataclass(frozen=True)
class MOASHARungs:
    """MOASHA's rule (Syne Tune 0.16's ``MOASHA`` with its default ``NonDominatedPriority``), over
    rungs in a :class:`VectorRungState`.

    :meth:`judge` is the whole rule for one result of a trial at ``time`` (its ``time_attr``) with
    ``values`` (its metrics, in the order of ``metric``):

    1. ``time >= max_t``: the trial stops (nothing is recorded).
    2. Otherwise the rung judged is the highest one ``time`` reached at which the trial has no
       values yet (a trial that skipped rungs fills a lower one on a later result); none: it
       continues.
    3. Otherwise the values are recorded there, judged once by :func:`moasha_rung_decision`
       against the vectors recorded there before.

    When the trial ends (any way, after its last result), steps 2 and 3 run once more with that
    result and ``at_end=True`` (Syne Tune's ``on_trial_complete``); that verdict is not acted on.

    :param metric: the result keys, two or more.
    :param mode: ``"min"`` or ``"max"``, one per metric.
    :param time_attr: the result key measuring progress; default ``"training_iteration"``.
    :param max_t: default 100; ``grace_period`` default 1; ``reduction_factor`` default 3;
        ``brackets`` default 1: as in :class:`MOASHA`.
    """

    metric: list[str]
    mode: list[str]
    time_attr: str = "training_iteration"
    max_t: float = 100
    grace_period: float = 1
    reduction_factor: float = 3
    brackets: int = 1
    _milestones: tuple[tuple[float, ...], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_moasha_metrics(self.metric, self.mode)
        check_asha_settings(
            "MOASHA", self.max_t, self.grace_period, self.reduction_factor, self.brackets
        )
        object.__setattr__(
            self,
            "_milestones",
            tuple(
                rung_milestones(self.grace_period, self.max_t, self.reduction_factor, bracket)
                for bracket in range(self.brackets)
            ),
        )

    def to_dict(self) -> dict[str, Any]:
        """Plain values (an operator's argument, a trigger's serialized field), marked as
        MOASHA's; ``core.judged.judged_from_dict`` reads them."""
        settings = asdict(self)
        settings.pop("_milestones")
        return {RULE_KEY: MOASHA_RULE, **settings}

    def milestones(self, bracket: int) -> tuple[float, ...]:
        """Bracket ``bracket``'s milestones, highest first."""
        if not 0 <= bracket < self.brackets:
            raise ValueError(
                f"Bracket {bracket} is not one of MOASHA's {self.brackets} "
                f"(0 to {self.brackets - 1})."
            )
        return self._milestones[bracket]

    def hold_spec(self, bracket: int) -> dict[str, Any]:
        """Where a trial of ``bracket`` waits for its verdict, as the actor takes it (see
        :mod:`airflow_trials.execution.worker.holds`): its milestones and ``max_t``."""
        points = sorted({float(p) for p in self.milestones(bracket)} | {float(self.max_t)})
        return {"time_attr": self.time_attr, "points": points}

    def draw_bracket(self, uniform: float) -> int:
        """The bracket of a new trial for one uniform draw in [0, 1), as ``numpy.random.choice``
        picks it in Syne Tune's ``on_trial_add``."""
        return draw_bracket([len(m) for m in self._milestones], uniform)

    def values_of(self, trial_id: str, result: Mapping[str, Any]) -> MetricVector:
        """The result's metrics as floats, in the order of ``metric``; ValueError naming the
        missing or non-numeric key."""
        values = []
        for key in (self.time_attr, *self.metric):
            if key not in result:
                reported = ", ".join(sorted(str(k) for k in result)) or "nothing"
                raise ValueError(
                    f"Trial {trial_id} reported a result without {key!r}, which MOASHA decides by "
                    f"(the result has: {reported}); report {key!r} in every result, or create "
                    f"MOASHA with metrics and a time_attr the trainable reports."
                )
            try:
                values.append(float(result[key]))
            except (TypeError, ValueError) as e:
                raise ValueError(
                    f"Trial {trial_id} reported {key}={result[key]!r}, but MOASHA needs a number "
                    f"there; report {key} as an int or a float."
                ) from e
        return tuple(values[1:])

    def decide(
        self, bracket: int, time: float, milestone: float, values: MetricVector, *, at_end: bool
    ) -> VectorDecide:
        """The ``decide`` of ``VectorRungState.record`` for ``values`` reaching ``milestone``."""
        milestones = self.milestones(bracket)
        rung_number = len(milestones) - milestones.index(milestone)

        def judge(values_before: Sequence[MetricVector]) -> RungVerdict:
            verdict = moasha_rung_decision(values_before, values, self.reduction_factor, self.mode)
            if at_end:
                return replace(verdict, reason=AT_END_REASON)
            if verdict.decision is not Decision.STOP or verdict.cutoff is None:
                return verdict
            where = f"rung {rung_number} of {len(milestones)}"
            if milestone != time:
                where += f", milestone {format_number(milestone)}"
            if self.brackets > 1:
                where = f"bracket {bracket + 1} of {self.brackets}, {where}"
            shown = ", ".join(
                f"{name} {format_number(value)}"
                for name, value in zip(self.metric, values, strict=True)
            )
            reason = (
                f"stopped by MOASHA at {self.time_attr}={format_number(time)} ({where}): "
                f"{shown}; its rank score among the rung's {len(values_before) + 1} trials "
                f"(Syne Tune 0.16's non-dominated sort) is {format_number(verdict.cutoff)}, above "
                f"1/{format_number(self.reduction_factor)}"
            )
            return replace(verdict, reason=reason)

        return judge

    def reached_max_t(self, time: float) -> bool:
        """Does a result at ``time`` stop its trial at ``max_t`` (stop kind MAX_T)?"""
        return time >= self.max_t

    def judge(
        self,
        state: VectorRungState,
        trial_id: str,
        bracket: int,
        *,
        time: float,
        values: MetricVector,
        iteration: int,
        at_end: bool = False,
    ) -> tuple[Decision, str | None]:
        """The rule on one result of ``trial_id`` (of ``bracket``): CONTINUE or STOP, and why it
        stops. ``iteration`` orders a trial's results; with ``at_end`` the trial ended and this is
        its last result, recorded and not acted on (CONTINUE)."""
        if not at_end and self.reached_max_t(time):
            return Decision.STOP, (
                f"stopped by MOASHA at {self.time_attr}={format_number(time)}{REACHED_MAX_T}"
                f"{format_number(self.max_t)}"
            )
        judged = judged_milestones(state.trial_rungs(trial_id), iteration, at_end)
        milestone = rung_to_judge(self.milestones(bracket), time, judged, True)
        if milestone is None:
            return Decision.CONTINUE, None
        verdict = state.record(
            trial_id,
            bracket=bracket,
            milestone=milestone,
            values=values,
            iteration=iteration,
            at_end=at_end,
            decide=self.decide(bracket, time, milestone, values, at_end=at_end),
        )
        if at_end or verdict.decision is not Decision.STOP:
            return Decision.CONTINUE, None
        return Decision.STOP, verdict.reason


def check_moasha_metrics(metric: Any, mode: Any) -> tuple[list[str], list[str]]:
    """``metric`` and ``mode`` as two lists of two or more; ValueError naming the fix."""
    if not isinstance(metric, list | tuple):
        raise ValueError(
            f"MOASHA judges trials by several metrics, got metric={metric!r}; pass a list of two "
            "or more with one mode each, e.g. MOASHA(metric=['val_acc', 'latency'], "
            "mode=['max', 'min']), or use ASHAScheduler(metric=..., mode=...) for one metric."
        )
    names, modes = check_several("MOASHA", metric, mode)
    if len(names) < 2:
        raise ValueError(
            f"MOASHA got metric={names!r}, one metric; use ASHAScheduler(metric={names[0]!r}, "
            f"mode={modes[0]!r}) for one, or give MOASHA two or more."
        )
    return names, modes


class MOASHA(FIFOScheduler):
    """Multi-objective asynchronous successive halving (Schmucker et al. 2021), deciding as Syne
    Tune 0.16's ``MOASHA`` with its default ``NonDominatedPriority``, hook for hook.

    Rungs sit at ``grace_period * reduction_factor**k`` up to ``max_t``, as in ASHA. When a trial
    first reaches a rung, its metric values are ranked with those recorded there before by
    non-dominated sorting with an epsilon-net inside each front (:func:`moasha_rung_decision`),
    and it continues only when the rank score Syne Tune 0.16 computes is within the top
    ``1/reduction_factor``. A trial stops once ``time_attr >= max_t``. Trials run in FIFO order.

    The rank score is Syne Tune 0.16's, kept for decisions that match it: it is the index of the
    row its sort lists last, over the rung's count, not the new trial's own place, so with three
    or more trials at a rung a trial that dominates them all can be stopped (docs/engine.md).

    The rule is :class:`MOASHARungs`' ``judge``; this class adds the hooks and the bracket draws,
    and keeps the rungs in ``state`` (in memory by default).

    Example::

        scheduler = MOASHA(metric=["val_acc", "latency_ms"], mode=["max", "min"], max_t=27,
                           grace_period=1, reduction_factor=3)
        runner = TrialRunner("nas", storage_path="/shared/results", scheduler=scheduler)

    :param metric: the result keys judged, two or more; default None (then
        set_search_properties must set them).
    :param mode: ``"min"`` or ``"max"``, one per metric; default None (likewise).
    :param time_attr: the result key measuring progress, which must not decrease within a trial;
        default ``"training_iteration"``.
    :param max_t: the most ``time_attr`` a trial runs for; default 100.
    :param grace_period: no trial is stopped before this much ``time_attr``; default 1.
    :param reduction_factor: the rungs' spacing and the share that continues; default 3.
    :param brackets: number of brackets, drawn as ASHA draws them; default 1.
    :param rng: the source of the bracket draws (one ``random()`` per added trial);
        ``numpy.random.RandomState(seed)`` places trials as Syne Tune does after
        ``numpy.random.seed(seed)``. Default an unseeded ``random.Random()``.
    :param state: where the rungs live; default a new :class:`MemoryVectorRungs`.
    """

    takes_several_metrics = True

    def __init__(
        self,
        metric: list[str] | None = None,
        mode: list[str] | None = None,
        time_attr: str = "training_iteration",
        max_t: float = 100,
        grace_period: float = 1,
        reduction_factor: float = 3,
        brackets: int = 1,
        *,
        rng: RandomSource | None = None,
        state: VectorRungState | None = None,
    ) -> None:
        if metric is not None or mode is not None:
            metric, mode = check_moasha_metrics(metric, mode)
        check_asha_settings("MOASHA", max_t, grace_period, reduction_factor, brackets)
        self.metric = metric
        self.mode = mode
        self.time_attr = time_attr
        self.max_t = max_t
        self.grace_period = grace_period
        self.reduction_factor = reduction_factor
        self.brackets = brackets
        self.rng: RandomSource = rng if rng is not None else random.Random()
        self.state: VectorRungState = state if state is not None else MemoryVectorRungs()
        self._trial_bracket: dict[str, int] = {}
        self._results_seen: dict[str, int] = {}
        self._reasons: dict[str, str] = {}
        self._max_t_stops: set[str] = set()
        self._num_stopped = 0

    def set_search_properties(self, metric: Any, mode: Any, **spec: Any) -> bool:
        """Take the experiment's metrics and modes unless already set (False then)."""
        if (self.metric and metric) or (self.mode and mode):
            return False
        chosen_metric, chosen_mode = metric or self.metric, mode or self.mode
        if chosen_metric is not None or chosen_mode is not None:
            chosen_metric, chosen_mode = check_moasha_metrics(chosen_metric, chosen_mode)
        self.metric, self.mode = chosen_metric, chosen_mode
        return True

    def rule(self, metric: Any = None, mode: Any = None) -> MOASHARungs:
        """The rule this scheduler judges by: its metrics and modes or, where it has none, the
        experiment's ``metric`` and ``mode`` (lists, as ``tuning_experiment`` takes several).
        ValueError, naming the fix, when it has no metrics, when the experiment has one metric,
        or when the two disagree (the same metrics in the same order with the same modes, as
        beside a searcher of several)."""
        if metric is None and mode is None:
            return self._rule
        if not isinstance(metric, list | tuple) or not isinstance(mode, list | tuple):
            raise ValueError(
                f"MOASHA judges trials by several metrics, but the experiment has "
                f"metric={metric!r}, mode={mode!r}; give the experiment lists, one mode per "
                "metric, e.g. metric=['val_acc', 'latency'], mode=['max', 'min'], or use "
                "ASHAScheduler(...) to stop trials by one metric."
            )
        names, modes = check_moasha_metrics(list(metric), list(mode))
        if self.metric is None and self.mode is None:
            return self._make_rule(names, modes)
        if list(self.metric or []) != names or list(self.mode or []) != modes:
            raise ValueError(
                f"The scheduler MOASHA judges trials by {self.metric!r} (modes {self.mode!r}) "
                f"but the experiment has {names!r} (modes {modes!r}); give MOASHA the "
                "experiment's metrics, in the same order with the same modes, or none (it then "
                "takes the experiment's)."
            )
        return self._rule

    @functools.cached_property
    def _rule(self) -> MOASHARungs:
        if not self.metric or not self.mode:
            raise ValueError(
                "MOASHA has no metrics to judge trials by; create it with them, e.g. "
                "MOASHA(metric=['val_acc', 'latency'], mode=['max', 'min']), or call "
                "set_search_properties(metric, mode) before adding trials."
            )
        return self._make_rule(list(self.metric), list(self.mode))

    def _make_rule(self, metric: list[str], mode: list[str]) -> MOASHARungs:
        return MOASHARungs(
            metric=metric,
            mode=mode,
            time_attr=self.time_attr,
            max_t=self.max_t,
            grace_period=self.grace_period,
            reduction_factor=self.reduction_factor,
            brackets=self.brackets,
        )

    def on_trial_add(self, trial: Trial) -> None:
        self._trial_bracket[trial.trial_id] = self._rule.draw_bracket(self.rng.random())

    def on_trial_result(self, trial: Trial, result: Result) -> Decision:
        try:
            bracket = self._trial_bracket[trial.trial_id]
        except KeyError as e:
            raise ValueError(
                f"MOASHA got a result of trial {trial.trial_id}, which it was never given or "
                "which already ended; call on_trial_add(trial) first (TrialRunner.add_trial does)."
            ) from e
        iteration = self._results_seen.get(trial.trial_id, 0) + 1
        self._results_seen[trial.trial_id] = iteration
        decision, reason = self._judge(trial.trial_id, bracket, result, iteration, at_end=False)
        if decision is Decision.STOP:
            self._num_stopped += 1
            self._reasons[trial.trial_id] = str(reason)
            if self._rule.reached_max_t(float(result[self.time_attr])):
                self._max_t_stops.add(trial.trial_id)
        return decision

    def _judge(
        self, trial_id: str, bracket: int, result: Result, iteration: int, *, at_end: bool
    ) -> tuple[Decision, str | None]:
        rule = self._rule
        values = rule.values_of(trial_id, result)
        return rule.judge(
            self.state,
            trial_id,
            bracket,
            time=float(result[self.time_attr]),
            values=values,
            iteration=iteration,
            at_end=at_end,
        )

    def on_trial_complete(self, trial: Trial, result: Result) -> None:
        # A trial can end before it reported anything: then there is nothing to record.
        if trial.trial_id not in self._trial_bracket or not result:
            return
        bracket = self._trial_bracket.pop(trial.trial_id)
        iteration = self._results_seen.pop(trial.trial_id, 0)
        self._judge(trial.trial_id, bracket, result, iteration, at_end=True)

    def on_trial_remove(self, trial: Trial) -> None:
        self._trial_bracket.pop(trial.trial_id, None)
        self._results_seen.pop(trial.trial_id, None)

    def decision_reason(self, trial_id: str) -> str | None:
        return self._reasons.get(trial_id)

    def stop_kind(self, trial_id: str) -> StopKind:
        return StopKind.MAX_T if trial_id in self._max_t_stops else StopKind.SCHEDULER

    def debug_string(self) -> str:
        return f"Using MOASHA: num_stopped={self._num_stopped}"
