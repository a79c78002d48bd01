"""The verdicts schedulers store with each value they judge, and what their stored state answers.

The rules (``schedulers/``) and their trials-DB storage (``store/rungs.py``, ``store/median.py``)
both use these, so the storage never imports a scheduler: ASHA's and MOASHA's rung verdict
(:class:`RungVerdict`, :data:`RungDecide`), the values recorded at a rung (:class:`RungValues`,
:class:`ValueList`), and the median rule's running means (:class:`MeanSample`, :class:`MeanList`,
:data:`MedianDecide`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from airflow_trials.core.scheduler import Decision


@runtime_checkable
class RungValues(Protocol):
    """The values recorded at a rung before a new one, as much as a cutoff needs of them.

    :class:`ValueList` holds them all (in memory); the trials store answers from SQL, reading two
    values however many there are.
    """

    @property
    def total(self) -> int:
        """How many values, NaNs included."""

    @property
    def numeric(self) -> int:
        """How many values are not NaN."""

    def ranked(self, first: int, last: int, descending: bool) -> Sequence[float]:
        """The non-NaN values of ranks ``first`` to ``last`` (0-based, both included) in
        ascending order, or in descending order with ``descending``, listed in that order."""


class ValueList:
    """:class:`RungValues` over values held in memory (NaN for NaN)."""

    def __init__(self, values: Iterable[float]) -> None:
        values = list(values)
        self.total = len(values)
        self._sorted = sorted(v for v in values if not math.isnan(v))
        self.numeric = len(self._sorted)

    def ranked(self, first: int, last: int, descending: bool) -> Sequence[float]:
        ordered = self._sorted[::-1] if descending else self._sorted
        return ordered[first : last + 1]


@dataclass(frozen=True)
class RungVerdict:
    """ASHA's verdict on a value that first reached a rung.

    :param decision: STOP when the value fell below the rung's cutoff, else CONTINUE.
    :param cutoff: the cutoff, in the metric's units; None when the rung had no value before (NaN
        when it had only NaNs, which stops nothing).
    :param reason: why it was stopped, as the scheduler says it; default None (no context given).
    """

    decision: Decision
    cutoff: float | None
    reason: str | None = None


RungDecide = Callable[[RungValues], RungVerdict]
"""Judges one value from the values recorded at its rung before it."""


def median_of(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[middle]
    return (ordered[middle - 1] + ordered[middle]) / 2


@runtime_checkable
class MeanSample(Protocol):
    """The other trials' finite running means at a time, as much as the rule reads of them.

    :class:`MeanList` holds them all (in memory); the trials store answers from SQL, counting them
    and reading only the one or two in the middle.
    """

    @property
    def count(self) -> int:
        """How many finite means."""

    def median(self) -> float:
        """Their median (the mean of the two middle ones for an even count); count >= 1."""


class MeanList:
    """:class:`MeanSample` over means held in memory; NaNs and infinities are left out, as Ray
    leaves them."""

    def __init__(self, means: Iterable[float]) -> None:
        self._sorted = sorted(m for m in means if math.isfinite(m))
        self.count = len(self._sorted)

    def median(self) -> float:
        return median_of(self._sorted)


#: The reason stored with a trial's last result, added again when it ends (not a verdict).
MEDIAN_AT_END_REASON = (
    "recorded when the trial ended, as the median stopping rule keeps a trial's last result"
)

MedianDecide = Callable[[MeanSample], tuple[Decision, str | None]]
"""Judges a result from the other trials' running means at its time (``MedianRule.verdict``)."""
