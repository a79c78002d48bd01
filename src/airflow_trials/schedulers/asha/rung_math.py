"""ASHA's pure functions: NumPy's percentile, rung cutoffs and milestones, verdicts and reasons."""

# Both of ASHA's states judge with these (schedulers/asha/asha_rungs.py AshaRungs, over MemoryRungs
# in memory or schedulers/asha/stored_rungs.py StoredRungs in the trials DB), so both compare the
# very same numbers.

from __future__ import annotations

import bisect
import math
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, cast

from airflow_trials.core.scheduler import Decision, format_number
from airflow_trials.core.verdicts import RungValues, RungVerdict, ValueList


def nan_percentile(values: Iterable[float], percent: float) -> float:
    """``numpy.nanpercentile(values, percent)`` (its default linear method), to the last bit.

    NaNs are left out; NaN when nothing is left. ASHA compares scores against this cutoff with
    ``<``, so a cutoff off by one unit in the last place would change decisions on ties.
    """
    data = sorted(v for v in values if not math.isnan(v))
    if not data:
        return math.nan
    below, above, weight = percentile_ranks(len(data), percent)
    return interpolate(data[below], data[above], weight)


def percentile_ranks(count: int, percent: float) -> tuple[int, int, float]:
    """The ranks (0-based, ascending) of the two of ``count`` sorted values that NumPy's linear
    percentile interpolates between, and the weight of the higher one; ``count`` >= 1."""
    last = count - 1
    index = last * (percent / 100)
    if index >= last:
        # numpy takes the last value from both sides, with the weight counted from index -1.
        return last, last, index + 1
    below = math.floor(index)
    return below, below + 1, index - below


def interpolate(low: float, high: float, weight: float) -> float:
    """NumPy's linear interpolation between two sorted values, rounding as NumPy rounds."""
    diff = high - low
    if weight >= 0.5:
        return high - diff * (1 - weight)
    return low + diff * weight


def rung_cutoff(values: RungValues, reduction_factor: float, mode: str) -> float | None:
    """A rung's cutoff score (``sign * value``, higher is better): the ``(1 - 1/reduction_factor)``
    percentile of the scores before, as :func:`nan_percentile` gives it; None when there were
    none."""
    if values.total == 0:
        return None
    if values.numeric == 0:
        return math.nan
    sign = mode_sign(mode)
    below, above, weight = percentile_ranks(values.numeric, rung_percent(reduction_factor))
    # Scores ascending are values ascending for "max" and values descending for "min".
    picked = values.ranked(below, above, descending=sign < 0)
    return interpolate(sign * picked[0], sign * picked[-1], weight)


def rung_milestones(
    grace_period: float, max_t: float, reduction_factor: float, bracket: int = 0
) -> tuple[float, ...]:
    """The milestones of bracket ``bracket``'s rungs, highest first (as Ray Tune keeps them):
    ``grace_period * reduction_factor**k`` for ``k`` from ``bracket`` up to the last below
    ``max_t``."""
    # math.log gives the same rung count as Ray's np.log (checked over 176,924 settings).
    count = int(math.log(max_t / grace_period) / math.log(reduction_factor) - bracket + 1)
    return tuple(grace_period * reduction_factor ** (k + bracket) for k in reversed(range(count)))


def rung_to_judge(
    milestones: Sequence[float], time: float, judged: Collection[float], stop_last_trials: bool
) -> float | None:
    """The milestone at which a result at ``time`` is judged, or None when none is due.

    That is the highest milestone ``time`` reached at which the trial has no value yet
    (``judged``: the milestones where it has one). Without ``stop_last_trials`` a trial that has a
    value at a reached rung is never judged again; with it (Ray Tune's quirk, kept) it is judged at
    a lower rung it skipped, on its next result.
    """
    for milestone in milestones:
        reached = time >= milestone
        if reached and milestone in judged and not stop_last_trials:
            return None
        if not reached or milestone in judged:
            continue
        return milestone
    return None


def rung_percent(reduction_factor: float) -> float:
    """The percentile of the scores recorded at a rung that a new score must reach to go on."""
    return (1 - 1 / reduction_factor) * 100


def mode_sign(mode: str) -> float:
    """Turns a value of the metric into a score where higher is better."""
    if mode not in ("min", "max"):
        raise ValueError(f"ASHA's mode must be 'min' or 'max', got {mode!r}.")
    return 1.0 if mode == "max" else -1.0


def asha_rung_decision(
    values_before: RungValues | Iterable[float], value: float, reduction_factor: float, mode: str
) -> RungVerdict:
    """ASHA's verdict on ``value`` at a rung where ``values_before`` were recorded before it.

    The cutoff is the ``(1 - 1/reduction_factor)`` percentile of the scores before (NumPy's
    ``nanpercentile``: NaNs are left out); a score strictly below it stops the trial. A tie goes on.
    """
    sign = mode_sign(mode)
    # Asked at every rung a result reaches: an attribute test, not a runtime Protocol check.
    values = (
        cast(RungValues, values_before)
        if hasattr(values_before, "ranked")
        else ValueList(cast(Iterable[float], values_before))
    )
    cutoff = rung_cutoff(values, reduction_factor, mode)
    if cutoff is None:
        return RungVerdict(Decision.CONTINUE, None)
    decision = Decision.STOP if sign * value < cutoff else Decision.CONTINUE
    return RungVerdict(decision, sign * cutoff)


def draw_bracket(rung_counts: Sequence[int], uniform: float) -> int:
    """The bracket ``numpy.random.choice(len(rung_counts), p=softmax(rung_counts))`` picks for
    the uniform draw ``uniform`` in [0, 1), as Ray Tune's ASHA places a new trial."""
    # Normalise, cumulate, normalise by the last sum, then the first bucket above the draw.
    weights = [math.e ** (size - max(rung_counts)) for size in rung_counts]
    total = 0.0
    for weight in weights:
        total += weight
    cdf, running = [], 0.0
    for weight in weights:
        running += weight / total
        cdf.append(running)
    cdf = [value / cdf[-1] for value in cdf]
    return min(bisect.bisect_right(cdf, uniform), len(cdf) - 1)


@dataclass(frozen=True)
class RungStop:
    """Where a trial fell below a rung's cutoff, for :func:`rung_stop_reason`."""

    rung_number: int  # 1 for the lowest rung of its bracket
    rung_count: int
    milestone: float
    cutoff: float
    bracket: int = 0
    brackets: int = 1


def rung_stop_reason(
    stop: RungStop, *, time_attr: str, time: float, metric: str, mode: str, value: float
) -> str:
    """``stopped by ASHA at training_iteration=3 (rung 1 of 4): score 0.41 below the rung's
    cutoff 0.55``."""
    where = f"rung {stop.rung_number} of {stop.rung_count}"
    if stop.milestone != time:
        where += f", milestone {format_number(stop.milestone)}"
    if stop.brackets > 1:
        where = f"bracket {stop.bracket + 1} of {stop.brackets}, {where}"
    side = "below" if mode == "max" else "above"
    return (
        f"stopped by ASHA at {time_attr}={format_number(time)} ({where}): {metric} "
        f"{format_number(value)} {side} the rung's cutoff {format_number(stop.cutoff)}"
    )


#: The reason stored with a trial's last value, recorded when it ended (not a verdict).
AT_END_REASON = "recorded when the trial ended, as ASHA records a trial's last value"

#: What ASHA's reason for stopping a trial at ``max_t`` says: it ran its whole budget, not
#: stopped early.
REACHED_MAX_T = ": it reached max_t="


def max_t_stop_reason(time_attr: str, time: float, max_t: float) -> str:
    return (
        f"stopped by ASHA at {time_attr}={format_number(time)}{REACHED_MAX_T}{format_number(max_t)}"
    )


def check_asha_settings(
    name: str, max_t: Any, grace_period: Any, reduction_factor: Any, brackets: Any
) -> None:
    """ValueErrors, naming ``name`` and the fix, for settings ASHA cannot work with."""
    if not max_t > 0:
        raise ValueError(
            f"{name} got max_t={max_t}: it must be > 0, the most time_attr a trial runs for."
        )
    if not grace_period > 0:
        raise ValueError(
            f"{name} got grace_period={grace_period}: it must be > 0 (the first rung is at "
            f"grace_period)."
        )
    if grace_period > max_t:
        raise ValueError(
            f"{name} got grace_period={grace_period} > max_t={max_t}: no rung fits below max_t; "
            f"lower grace_period or raise max_t."
        )
    if not reduction_factor > 1:
        raise ValueError(
            f"{name} got reduction_factor={reduction_factor}: it must be > 1 (each rung keeps the "
            f"top 1/reduction_factor of its trials); 2 to 4 is usual."
        )
    if not brackets > 0:
        raise ValueError(f"{name} got brackets={brackets}: use 1 or more.")
