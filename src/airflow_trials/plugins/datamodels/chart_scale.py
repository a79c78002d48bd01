"""A chart's scale: maps a value to a fraction of its axis (linear, log over more than two
decades, or categorical) and gives the axis's ticks. The charts draw over it (``charts/kit.py``'s
``Plot``), the services lay out their axes on it, and the JSON models report its kind and range.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

ScaleKind = Literal["linear", "log", "categorical"]

# Values spanning more than this ratio (two decades), all positive, get a log scale.
LOG_SPAN = 100.0
# A categorical axis labels at most this many of its categories (every k-th beyond).
MAX_CATEGORY_LABELS = 16
LABEL_CHARS = 14


def nice_ticks(low: float, high: float, count: int = 5) -> list[float]:
    """About ``count`` round tick values covering [low, high] (1, 2, 5 times a power of ten)."""
    if not (math.isfinite(low) and math.isfinite(high)):
        raise ValueError(f"Cannot place ticks on a non-finite range [{low}, {high}].")
    if high < low:
        low, high = high, low
    if high == low:
        return [low]
    raw_step = (high - low) / max(count, 1)
    magnitude = 10 ** math.floor(math.log10(raw_step))
    step = next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw_step)
    first = math.ceil(low / step - 1e-9) * step
    ticks = []
    value = first
    while value <= high + step * 1e-9:
        ticks.append(round(value, 12))
        value += step
    return ticks


def is_value(value: Any) -> bool:
    """A finite number (True and False are not numbers)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def category(value: Any) -> str:
    """A config value as a category's label: strings as they are, anything else as JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, default=str)


def short(text: str, chars: int = LABEL_CHARS) -> str:
    """``text`` cut to ``chars`` characters, an ellipsis marking the cut."""
    return text if len(text) <= chars else text[: chars - 1] + "…"


def number_label(value: float) -> str:
    return f"{value:.4g}"


@dataclass(frozen=True)
class Scale:
    """Maps a value to a fraction of its axis, 0 at the low end and 1 at the high end.

    :param kind: ``linear``, ``log`` or ``categorical``.
    :param low: the smallest value (numeric scales; 0 for categorical).
    :param high: the largest value (numeric scales; 0 for categorical).
    :param categories: a categorical scale's labels, in axis order (low end first).
    :param tick_count: about how many ticks a linear scale gets.
    """

    kind: ScaleKind
    low: float = 0.0
    high: float = 0.0
    categories: tuple[str, ...] = ()
    tick_count: int = 6

    @classmethod
    def linear(cls, low: float, high: float, tick_count: int = 6) -> Scale:
        """A linear scale from ``low`` to ``high``, whatever their span."""
        return cls("linear", float(low), float(high), tick_count=tick_count)

    @classmethod
    def numeric(cls, values: Iterable[float]) -> Scale:
        """The scale over ``values`` (finite, at least one): log when they are all positive and
        span more than two decades, else linear."""
        found = list(values)
        if not found:
            raise ValueError("A numeric scale needs at least one finite value; got none.")
        low, high = min(found), max(found)
        kind: ScaleKind = "log" if low > 0 and high / low > LOG_SPAN else "linear"
        return cls(kind, float(low), float(high))

    @classmethod
    def of(cls, values: Sequence[Any]) -> Scale:
        """Numeric when every value is a finite number, else categorical over their labels."""
        if values and all(is_value(v) for v in values):
            return cls.numeric(values)
        # Numbers first, in their order, then the other values by their labels.
        order = {
            category(v): (0, float(v), "") if is_value(v) else (1, 0.0, category(v)) for v in values
        }
        return cls("categorical", categories=tuple(sorted(order, key=order.__getitem__)))

    def fraction(self, value: Any) -> float:
        """Where ``value`` lies on the axis, 0 to 1 (0.5 for a single value)."""
        if self.kind == "categorical":
            n = len(self.categories)
            return 0.5 if n < 2 else self.categories.index(category(value)) / (n - 1)
        if self.high == self.low:
            return 0.5
        if self.kind == "log":
            return math.log(value / self.low) / math.log(self.high / self.low)
        return (value - self.low) / (self.high - self.low)

    def ticks(self) -> list[tuple[float, str]]:
        """(fraction, label) of the axis's ticks."""
        if self.kind == "categorical":
            step = max(1, math.ceil(len(self.categories) / MAX_CATEGORY_LABELS))
            return [
                (self.fraction(c), short(c))
                for i, c in enumerate(self.categories)
                if i % step == 0 or i == len(self.categories) - 1
            ]
        if self.high == self.low:
            return [(0.5, number_label(self.low))]
        if self.kind == "log":
            first, last = math.ceil(math.log10(self.low)), math.floor(math.log10(self.high))
            step = max(1, math.ceil((last - first + 1) / 8))
            powers = [10.0**e for e in range(first, last + 1, step)]
            ends = [v for v in (self.low, self.high) if v not in powers]
            values = sorted(powers + ends) if len(powers) < 2 else powers
            return [(self.fraction(v), number_label(v)) for v in values]
        ticks = nice_ticks(self.low, self.high, self.tick_count)
        return [(self.fraction(v), number_label(v)) for v in ticks]

    def describe(self) -> str:
        return {"linear": "", "log": " (log)", "categorical": ""}[self.kind]
