"""Asynchronous successive halving (ASHA), deciding as Ray Tune 2.60's AsyncHyperBandScheduler."""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any, Protocol

from airflow_trials.core.result import Result
from airflow_trials.core.scheduler import Decision, MetricScheduler, experiment_metric_and_mode
from airflow_trials.core.trial import Trial
from airflow_trials.schedulers.asha.asha_rungs import AshaRungs, MemoryRungs, RungState
from airflow_trials.schedulers.asha.rung_math import (
    check_asha_settings,
    draw_bracket,
    nan_percentile,
    rung_cutoff,
    rung_milestones,
)

__all__ = [
    "ASHAScheduler",
    "AsyncHyperBandScheduler",
    "RandomSource",
    "nan_percentile",
    "raised_max_t",
    "with_max_t",
]


class RandomSource(Protocol):
    """Anything with ``random() -> float`` in [0, 1): ``random.Random``,
    ``numpy.random.RandomState``."""

    def random(self) -> float: ...


class AsyncHyperBandScheduler(MetricScheduler):
    """Asynchronous successive halving (https://arxiv.org/abs/1810.05934), as Ray Tune 2.60's.

    Each bracket has rungs at ``grace_period * reduction_factor**k`` (bracket ``s`` starts at
    ``k = s``) up to ``max_t``. When a trial's ``time_attr`` first reaches a rung, its metric is
    compared with the rung's cutoff, the ``(1 - 1/reduction_factor)`` percentile of the scores
    trials recorded there before it (NaNs left out): below it, the trial is stopped. A trial that
    skipped rungs is judged at the highest one it reached. With ``stop_last_trials`` a trial is
    stopped once ``time_attr >= max_t``. :meth:`decision_reason` tells why a trial was stopped.

    The rule is :class:`~airflow_trials.schedulers.asha.asha_rungs.AshaRungs`' ``judge``, the one a
    trial's trigger judges with on the Airflow path; this class adds the hooks and the bracket
    draws, and keeps the rungs in ``state`` (in memory by default), as Ray's keeps them in its
    ``_Bracket``.

    Every result must carry ``metric`` and ``time_attr`` (a ValueError names the missing key;
    Ray Tune's controller raises for a missing metric too, its scheduler silently continues).

    Example::

        scheduler = ASHAScheduler(metric="score", mode="max", max_t=81, grace_period=1,
                                  reduction_factor=3)
        runner = TrialRunner("mnist", storage_path="/shared/results", scheduler=scheduler)

    :param time_attr: the result key measuring progress, which must not decrease within a trial;
        default ``"training_iteration"``.
    :param metric: the result key judged; default None (then set_search_properties must set it).
    :param mode: ``"min"`` or ``"max"``; default None (likewise).
    :param max_t: the most ``time_attr`` a trial runs for; default 100.
    :param grace_period: no trial is stopped before this much ``time_attr``; default 1.
    :param reduction_factor: the rungs' spacing and how many continue (the top
        ``1/reduction_factor``); default 4.
    :param brackets: number of brackets; a trial joins bracket ``i`` with probability proportional
        to ``e**len(rungs_i)``, drawn from ``rng`` as ``numpy.random.choice`` draws. Default 1.
    :param stop_last_trials: stop trials at ``max_t``; default True.
    :param rng: the source of the bracket draws (one ``random()`` per added trial, as Ray Tune
        draws one from NumPy's global state): ``numpy.random.RandomState(seed)`` with the seed
        given to ``numpy.random.seed`` puts trials in the brackets Ray Tune would. Default an
        unseeded ``random.Random()``.
    :param state: where the rungs live; default a new
        :class:`~airflow_trials.schedulers.asha.asha_rungs.MemoryRungs`. The trials DB's
        (``store.rungs.StoredRungs``) decides the same.
    """

    def __init__(
        self,
        time_attr: str = "training_iteration",
        metric: str | None = None,
        mode: str | None = None,
        max_t: float = 100,
        grace_period: float = 1,
        reduction_factor: float = 4,
        brackets: int = 1,
        stop_last_trials: bool = True,
        *,
        rng: RandomSource | None = None,
        state: RungState | None = None,
    ) -> None:
        super().__init__(metric, mode)
        check_asha_settings(type(self).__name__, max_t, grace_period, reduction_factor, brackets)
        self.time_attr = time_attr
        self.max_t = max_t
        self.grace_period = grace_period
        self.reduction_factor = reduction_factor
        self.brackets = brackets
        self.stop_last_trials = stop_last_trials
        self.rng: RandomSource = rng if rng is not None else random.Random()
        self.state: RungState = state if state is not None else MemoryRungs()
        self._rung_counts = [
            len(rung_milestones(grace_period, max_t, reduction_factor, s)) for s in range(brackets)
        ]
        self._rule: AshaRungs | None = None  # made once metric and mode are known
        self._trial_bracket: dict[str, int] = {}
        self._results_seen: dict[str, int] = {}  # orders a trial's results for the rule
        self._num_stopped = 0

    def rule(self, metric: str | None = None, mode: str | None = None) -> AshaRungs:
        """The rule this scheduler judges by: its settings, with its metric and mode or, where it
        has none, the experiment's ``metric`` and ``mode`` (ValueError where they disagree)."""
        chosen_metric, chosen_mode = experiment_metric_and_mode(self, metric, mode, "ASHAScheduler")
        return AshaRungs(
            metric=chosen_metric,
            mode=chosen_mode,
            time_attr=self.time_attr,
            max_t=self.max_t,
            grace_period=self.grace_period,
            reduction_factor=self.reduction_factor,
            brackets=self.brackets,
            stop_last_trials=self.stop_last_trials,
        )

    def on_trial_add(self, trial: Trial) -> None:
        self._check_ready(trial)
        if self._rule is None:
            self._rule = self.rule()
        self._trial_bracket[trial.trial_id] = self._draw_bracket()

    def _draw_bracket(self) -> int:
        return draw_bracket(self._rung_counts, self.rng.random())

    def on_trial_result(self, trial: Trial, result: Result) -> Decision:
        index = self._bracket_index(trial)
        time = self._number(trial, result, self.time_attr, "time_attr")
        value = self._number(trial, result, str(self.metric), "metric")
        iteration = self._results_seen.get(trial.trial_id, 0) + 1
        self._results_seen[trial.trial_id] = iteration
        decision, reason = self._judge(trial.trial_id, index, time, value, iteration, at_end=False)
        if decision is Decision.STOP:
            self._num_stopped += 1
            self._reasons[trial.trial_id] = str(reason)
            if self._rule is not None and self._rule.reached_max_t(time):
                self._max_t_stops.add(trial.trial_id)
        return decision

    def _judge(
        self,
        trial_id: str,
        bracket: int,
        time: float,
        value: float,
        iteration: int,
        *,
        at_end: bool,
    ) -> tuple[Decision, str | None]:
        if self._rule is None:  # on_trial_add made it; _bracket_index raised otherwise
            raise RuntimeError(f"{type(self).__name__} judged trial {trial_id} before adding it.")
        return self._rule.judge(
            self.state,
            trial_id,
            bracket,
            time=time,
            value=value,
            iteration=iteration,
            at_end=at_end,
        )

    def _bracket_index(self, trial: Trial) -> int:
        try:
            return self._trial_bracket[trial.trial_id]
        except KeyError as e:
            raise ValueError(
                f"{type(self).__name__} got a result of trial {trial.trial_id}, which it was never "
                f"given or which already ended; call on_trial_add(trial) first "
                f"(TrialRunner.add_trial does)."
            ) from e

    def on_trial_complete(self, trial: Trial, result: Result) -> None:
        # A trial can end before it reported anything: then there is nothing to record (Ray alike).
        time = self._optional_number(result, self.time_attr)
        value = self._optional_number(result, str(self.metric))
        if time is None or value is None or trial.trial_id not in self._trial_bracket:
            return
        bracket = self._trial_bracket.pop(trial.trial_id)
        iteration = self._results_seen.pop(trial.trial_id, 0)
        self._judge(trial.trial_id, bracket, time, value, iteration, at_end=True)

    def on_trial_remove(self, trial: Trial) -> None:
        self._trial_bracket.pop(trial.trial_id, None)
        self._results_seen.pop(trial.trial_id, None)

    def debug_string(self) -> str:
        lines = [f"Using AsyncHyperBand: num_stopped={self._num_stopped}"]
        for bracket in range(self.brackets):
            milestones = rung_milestones(
                self.grace_period, self.max_t, self.reduction_factor, bracket
            )
            cutoffs = [
                f"Iter {milestone:.3f}: {self._cutoff(bracket, milestone)}"
                for milestone in milestones
            ]
            lines.append("Bracket: " + " | ".join(cutoffs))
        return "\n".join(lines)

    def _cutoff(self, bracket: int, milestone: float) -> float | None:
        values = self.state.rung_values(bracket, milestone)
        return rung_cutoff(values, self.reduction_factor, str(self.mode))


def raised_max_t(scheduler: Any, stop: Mapping[str, float] | None) -> float | None:
    """The ``max_t`` an extension gives a sweep's ASHA (``stop``'s value of its ``time_attr``,
    when higher than its ``max_t``); None when it keeps its own."""
    if not isinstance(scheduler, AsyncHyperBandScheduler) or not stop:
        return None
    value = stop.get(scheduler.time_attr)
    return value if value is not None and value > scheduler.max_t else None


def with_max_t(scheduler: AsyncHyperBandScheduler, max_t: float) -> AsyncHyperBandScheduler:
    """A new ASHA like ``scheduler`` but for ``max_t``: the same milestones below its old
    ``max_t``, and the rungs up to the new one."""
    return AsyncHyperBandScheduler(
        time_attr=scheduler.time_attr,
        metric=scheduler.metric,
        mode=scheduler.mode,
        max_t=max_t,
        grace_period=scheduler.grace_period,
        reduction_factor=scheduler.reduction_factor,
        brackets=scheduler.brackets,
        stop_last_trials=scheduler.stop_last_trials,
    )


ASHAScheduler = AsyncHyperBandScheduler
