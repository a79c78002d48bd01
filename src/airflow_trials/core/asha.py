"""Asynchronous successive halving (ASHA), deciding exactly as Ray Tune 2.60's AsyncHyperBandScheduler."""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace
from typing import Protocol

from airflow_trials.core.result import Result
from airflow_trials.core.rungs import (
    RungStop,
    ValueList,
    asha_rung_decision,
    check_asha_settings,
    draw_bracket,
    max_t_stop_reason,
    nan_percentile,
    rung_cutoff,
    rung_milestones,
    rung_stop_reason,
    rung_to_judge,
)
from airflow_trials.core.scheduler import Decision, MetricScheduler
from airflow_trials.core.trial import Trial

__all__ = ["ASHAScheduler", "AsyncHyperBandScheduler", "RandomSource", "nan_percentile"]


class RandomSource(Protocol):
    """Anything with ``random() -> float`` in [0, 1): ``random.Random``, ``numpy.random.RandomState``."""

    def random(self) -> float: ...


@dataclass
class _Rung:
    milestone: float
    recorded: dict[str, float] = field(default_factory=dict)  # trial id -> its value here


class _Bracket:
    """One bracket: its rungs, highest milestone first (as Ray keeps them), and the values recorded.

    Which rung a result reaches and what it decides there are :mod:`~airflow_trials.core.rungs`'
    pure functions, the same the Airflow path judges with from the trials store.

    :param grace_period: the lowest milestone of bracket 0.
    :param max_t: the highest time any rung may have.
    :param reduction_factor: milestones grow by this factor; a rung keeps its top ``1/reduction_factor``.
    :param s: the bracket's index; bracket ``s`` starts at ``grace_period * reduction_factor**s``.
    :param stop_last_trials: as in :class:`AsyncHyperBandScheduler`.
    """

    def __init__(
        self, grace_period: float, max_t: float, reduction_factor: float, s: int, stop_last_trials: bool
    ) -> None:
        self.rungs = [_Rung(m) for m in rung_milestones(grace_period, max_t, reduction_factor, s)]
        self.reduction_factor = reduction_factor
        self.stop_last_trials = stop_last_trials

    def on_result(self, trial_id: str, time: float, value: float, mode: str) -> RungStop | None:
        """Judge ``value`` at the highest rung ``time`` reached that has no value of the trial yet,
        and record it there; returns where it fell below that rung's cutoff."""
        judged = {rung.milestone for rung in self.rungs if trial_id in rung.recorded}
        milestone = rung_to_judge([rung.milestone for rung in self.rungs], time, judged, self.stop_last_trials)
        if milestone is None:
            return None
        index = next(i for i, rung in enumerate(self.rungs) if rung.milestone == milestone)
        rung = self.rungs[index]
        verdict = asha_rung_decision(rung.recorded.values(), value, self.reduction_factor, mode)
        rung.recorded[trial_id] = value
        if verdict.decision is not Decision.STOP or verdict.cutoff is None:
            return None
        return RungStop(len(self.rungs) - index, len(self.rungs), milestone, verdict.cutoff)

    def debug_str(self, mode: str) -> str:
        def cutoff(rung: _Rung) -> float | None:
            return rung_cutoff(ValueList(rung.recorded.values()), self.reduction_factor, mode)

        return "Bracket: " + " | ".join(f"Iter {rung.milestone:.3f}: {cutoff(rung)}" for rung in self.rungs)


class AsyncHyperBandScheduler(MetricScheduler):
    """Asynchronous successive halving (https://arxiv.org/abs/1810.05934), as Ray Tune 2.60's.

    Each bracket has rungs at ``grace_period * reduction_factor**k`` (bracket ``s`` starts at
    ``k = s``) up to ``max_t``. When a trial's ``time_attr`` first reaches a rung, its metric is
    compared with the rung's cutoff, the ``(1 - 1/reduction_factor)`` percentile of the scores
    trials recorded there before it (NaNs left out): below it, the trial is stopped. A trial that
    skipped rungs is judged at the highest one it reached. With ``stop_last_trials`` a trial is
    stopped once ``time_attr >= max_t``. :meth:`decision_reason` tells why a trial was stopped.

    Every result must carry ``metric`` and ``time_attr`` (a ValueError names the missing key;
    Ray Tune's controller raises for a missing metric too, its scheduler silently continues).

    Example::

        scheduler = ASHAScheduler(metric="score", mode="max", max_t=81, grace_period=1, reduction_factor=3)
        runner = TrialRunner("mnist", storage_path="/shared/results", scheduler=scheduler)

    :param time_attr: the result key measuring progress, which must not decrease within a trial;
        default ``"training_iteration"``.
    :param metric: the result key judged; default None (then set_search_properties must set it).
    :param mode: ``"min"`` or ``"max"``; default None (likewise).
    :param max_t: the most ``time_attr`` a trial runs for; default 100.
    :param grace_period: no trial is stopped before this much ``time_attr``; default 1.
    :param reduction_factor: the rungs' spacing and how many continue (the top ``1/reduction_factor``);
        default 4.
    :param brackets: number of brackets; a trial joins bracket ``i`` with probability proportional
        to ``e**len(rungs_i)``, drawn from ``rng`` as ``numpy.random.choice`` draws. Default 1.
    :param stop_last_trials: stop trials at ``max_t``; default True.
    :param rng: the source of the bracket draws (one ``random()`` per added trial, as Ray Tune
        draws one from NumPy's global state): ``numpy.random.RandomState(seed)`` with the seed
        given to ``numpy.random.seed`` puts trials in the brackets Ray Tune would. Default an
        unseeded ``random.Random()``.
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
        self._brackets = [
            _Bracket(grace_period, max_t, reduction_factor, s, stop_last_trials) for s in range(brackets)
        ]
        self._trial_bracket: dict[str, int] = {}
        self._num_stopped = 0

    def on_trial_add(self, trial: Trial) -> None:
        self._check_ready(trial)
        self._trial_bracket[trial.trial_id] = self._draw_bracket()

    def _draw_bracket(self) -> int:
        return draw_bracket([len(bracket.rungs) for bracket in self._brackets], self.rng.random())

    def on_trial_result(self, trial: Trial, result: Result) -> Decision:
        index = self._bracket_index(trial)
        time = self._number(trial, result, self.time_attr, "time_attr")
        value = self._number(trial, result, str(self.metric), "metric")
        if time >= self.max_t and self.stop_last_trials:
            self._stop(trial, max_t_stop_reason(self.time_attr, time, self.max_t))
            return Decision.STOP
        stop = self._brackets[index].on_result(trial.trial_id, time, value, str(self.mode))
        if stop is None:
            return Decision.CONTINUE
        stop = replace(stop, bracket=index, brackets=self.brackets)
        reason = rung_stop_reason(
            stop, time_attr=self.time_attr, time=time, metric=str(self.metric), mode=str(self.mode), value=value
        )
        self._stop(trial, reason)
        return Decision.STOP

    def _stop(self, trial: Trial, reason: str) -> None:
        self._num_stopped += 1
        self._reasons[trial.trial_id] = reason

    def _bracket_index(self, trial: Trial) -> int:
        try:
            return self._trial_bracket[trial.trial_id]
        except KeyError as e:
            raise ValueError(
                f"{type(self).__name__} got a result of trial {trial.trial_id}, which it was never given or "
                f"which already ended; call on_trial_add(trial) first (TrialRunner.add_trial does)."
            ) from e

    def on_trial_complete(self, trial: Trial, result: Result) -> None:
        # A trial can end before it reported anything: then there is nothing to record (Ray alike).
        time = self._optional_number(result, self.time_attr)
        value = self._optional_number(result, str(self.metric))
        if time is None or value is None or trial.trial_id not in self._trial_bracket:
            return
        bracket = self._brackets[self._trial_bracket.pop(trial.trial_id)]
        bracket.on_result(trial.trial_id, time, value, str(self.mode))

    def on_trial_remove(self, trial: Trial) -> None:
        self._trial_bracket.pop(trial.trial_id, None)

    def debug_string(self) -> str:
        lines = [f"Using AsyncHyperBand: num_stopped={self._num_stopped}"]
        return "\n".join(lines + [bracket.debug_str(str(self.mode)) for bracket in self._brackets])


ASHAScheduler = AsyncHyperBandScheduler
