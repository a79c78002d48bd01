"""Asynchronous successive halving (ASHA), deciding exactly as Ray Tune 2.60's AsyncHyperBandScheduler."""

from __future__ import annotations

import bisect
import math
import random
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from airflow_trials.core.result import Result
from airflow_trials.core.scheduler import Decision, MetricScheduler, format_number
from airflow_trials.core.trial import Trial


class RandomSource(Protocol):
    """Anything with ``random() -> float`` in [0, 1): ``random.Random``, ``numpy.random.RandomState``."""

    def random(self) -> float: ...


def nan_percentile(values: Iterable[float], percent: float) -> float:
    """``numpy.nanpercentile(values, percent)`` (its default linear method), to the last bit.

    NaNs are left out; NaN when nothing is left. ASHA compares scores against this cutoff with
    ``<``, so a cutoff off by one unit in the last place would change decisions on ties.
    """
    data = sorted(v for v in values if not math.isnan(v))
    if not data:
        return math.nan
    last = len(data) - 1
    index = last * (percent / 100)
    if index >= last:
        # numpy takes the last value from both sides, with the weight counted from index -1.
        below = above = last
        weight = index + 1
    else:
        below = math.floor(index)
        above = below + 1
        weight = index - below
    low, high = data[below], data[above]
    diff = high - low
    if weight >= 0.5:
        return high - diff * (1 - weight)
    return low + diff * weight


@dataclass
class _Rung:
    milestone: float
    recorded: dict[str, float] = field(default_factory=dict)  # trial id -> its score here


@dataclass(frozen=True)
class _Cut:
    """A trial's score fell below a rung's cutoff."""

    rung_number: int  # 1 for the lowest rung
    rung_count: int
    milestone: float
    cutoff: float


class _Bracket:
    """One bracket: its rungs, highest milestone first (as Ray keeps them), and the scores recorded.

    :param grace_period: the lowest milestone of bracket 0.
    :param max_t: the highest time any rung may have.
    :param reduction_factor: milestones grow by this factor; a rung keeps its top ``1/reduction_factor``.
    :param s: the bracket's index; bracket ``s`` starts at ``grace_period * reduction_factor**s``.
    :param stop_last_trials: as in :class:`AsyncHyperBandScheduler`.
    """

    def __init__(
        self, grace_period: float, max_t: float, reduction_factor: float, s: int, stop_last_trials: bool
    ) -> None:
        # math.log gives the same rung count as Ray's np.log (checked over 176,924 settings).
        count = int(math.log(max_t / grace_period) / math.log(reduction_factor) - s + 1)
        self.rungs = [_Rung(grace_period * reduction_factor ** (k + s)) for k in reversed(range(count))]
        self.percent = (1 - 1 / reduction_factor) * 100
        self.stop_last_trials = stop_last_trials

    def cutoff(self, rung: _Rung) -> float | None:
        return nan_percentile(rung.recorded.values(), self.percent) if rung.recorded else None

    def on_result(self, trial_id: str, time: float, score: float) -> _Cut | None:
        """Judge ``score`` at the highest rung ``time`` reached that has no score of the trial yet,
        and record it there; returns the cut when the score fell below that rung's cutoff."""
        for index, rung in enumerate(self.rungs):
            reached = time >= rung.milestone
            if reached and trial_id in rung.recorded and not self.stop_last_trials:
                break  # it passed this rung already and higher rungs are out of reach
            if not reached or trial_id in rung.recorded:
                continue
            cutoff = self.cutoff(rung)
            rung.recorded[trial_id] = score
            if cutoff is not None and score < cutoff:
                count = len(self.rungs)
                return _Cut(count - index, count, rung.milestone, cutoff)
            break
        return None

    def debug_str(self) -> str:
        return "Bracket: " + " | ".join(
            f"Iter {rung.milestone:.3f}: {self.cutoff(rung)}" for rung in self.rungs
        )


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
        _check_settings(type(self).__name__, max_t, grace_period, reduction_factor, brackets)
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
        # numpy.random.choice(n, p=softmax(sizes)): normalise, cumulate, normalise by the last
        # sum, then the first bucket above one uniform draw.
        sizes = [len(bracket.rungs) for bracket in self._brackets]
        weights = [math.e ** (size - max(sizes)) for size in sizes]
        total = 0.0
        for weight in weights:
            total += weight
        cdf, running = [], 0.0
        for weight in weights:
            running += weight / total
            cdf.append(running)
        cdf = [value / cdf[-1] for value in cdf]
        return min(bisect.bisect_right(cdf, self.rng.random()), len(cdf) - 1)

    def on_trial_result(self, trial: Trial, result: Result) -> Decision:
        index = self._bracket_index(trial)
        time = self._number(trial, result, self.time_attr, "time_attr")
        value = self._number(trial, result, str(self.metric), "metric")
        at = f"at {self.time_attr}={format_number(time)}"
        if time >= self.max_t and self.stop_last_trials:
            self._stop(trial, f"stopped by ASHA {at}: it reached max_t={format_number(self.max_t)}")
            return Decision.STOP
        cut = self._brackets[index].on_result(trial.trial_id, time, self._sign * value)
        if cut is None:
            return Decision.CONTINUE
        where = f"rung {cut.rung_number} of {cut.rung_count}"
        if cut.milestone != time:
            where += f", milestone {format_number(cut.milestone)}"
        if self.brackets > 1:
            where = f"bracket {index + 1} of {self.brackets}, {where}"
        side = "below" if self.mode == "max" else "above"
        self._stop(
            trial,
            f"stopped by ASHA {at} ({where}): {self.metric} {format_number(value)} {side} the rung's "
            f"cutoff {format_number(self._sign * cut.cutoff)}",
        )
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
        bracket.on_result(trial.trial_id, time, self._sign * value)

    def on_trial_remove(self, trial: Trial) -> None:
        self._trial_bracket.pop(trial.trial_id, None)

    def debug_string(self) -> str:
        lines = [f"Using AsyncHyperBand: num_stopped={self._num_stopped}"]
        return "\n".join(lines + [bracket.debug_str() for bracket in self._brackets])


ASHAScheduler = AsyncHyperBandScheduler


def _check_settings(name: str, max_t: Any, grace_period: Any, reduction_factor: Any, brackets: Any) -> None:
    if not max_t > 0:
        raise ValueError(f"{name} got max_t={max_t}: it must be > 0, the most time_attr a trial runs for.")
    if not grace_period > 0:
        raise ValueError(
            f"{name} got grace_period={grace_period}: it must be > 0 (the first rung is at grace_period)."
        )
    if grace_period > max_t:
        raise ValueError(
            f"{name} got grace_period={grace_period} > max_t={max_t}: no rung fits below max_t; "
            f"lower grace_period or raise max_t."
        )
    if not reduction_factor > 1:
        raise ValueError(
            f"{name} got reduction_factor={reduction_factor}: it must be > 1 (each rung keeps the top "
            f"1/reduction_factor of its trials); 2 to 4 is usual."
        )
    if not brackets > 0:
        raise ValueError(f"{name} got brackets={brackets}: use 1 or more.")
