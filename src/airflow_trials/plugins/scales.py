"""Axes for the server-drawn charts of trials: numeric (linear, or log over more than two decades)
and categorical scales, their ticks, and the sequential colour ramp of a metric."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from airflow_trials.plugins.svg import nice_ticks

ScaleKind = Literal["linear", "log", "categorical"]

# Values spanning more than this ratio (two decades), all positive, get a log scale.
LOG_SPAN = 100.0
# A categorical axis labels at most this many of its categories (every k-th beyond).
MAX_CATEGORY_LABELS = 16
LABEL_CHARS = 14
# Viridis, cut before its lightest yellow (which does not read on a white page): dark = worst.
_RAMP = ("#440154", "#414487", "#2a788e", "#22a884", "#7ad151", "#bddf26")
ACCENT = "#e15759"  # svg.BEST_COLOR: the best trials, as on the learning curves
NO_VALUE_COLOR = "#8a96a3"


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
    """

    kind: ScaleKind
    low: float = 0.0
    high: float = 0.0
    categories: tuple[str, ...] = ()

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
        return [(self.fraction(v), number_label(v)) for v in nice_ticks(self.low, self.high, 6)]

    def describe(self) -> str:
        return {"linear": "", "log": " (log)", "categorical": ""}[self.kind]


def ramp(goodness: float) -> str:
    """The sequential colour of a value ``goodness`` of the way from the worst (0) to the best
    (1), in :data:`RAMP_STEPS` steps (1,000 lines need no more, and look one colour up)."""
    return _RAMP_TABLE[round(min(1.0, max(0.0, goodness)) * (RAMP_STEPS - 1))]


def _mix(goodness: float) -> str:
    t = goodness * (len(_RAMP) - 1)
    i = min(int(t), len(_RAMP) - 2)
    start, end = _rgb(_RAMP[i]), _rgb(_RAMP[i + 1])
    mixed = (round(a + (b - a) * (t - i)) for a, b in zip(start, end, strict=True))
    return "#" + "".join(f"{c:02x}" for c in mixed)


def ramp_stops() -> list[tuple[float, str]]:
    """The ramp's stops for an SVG gradient: (offset 0 to 1, colour), worst first."""
    return [(i / (len(_RAMP) - 1), color) for i, color in enumerate(_RAMP)]


def _rgb(color: str) -> tuple[int, int, int]:
    return int(color[1:3], 16), int(color[3:5], 16), int(color[5:7], 16)


RAMP_STEPS = 101
_RAMP_TABLE = [_mix(i / (RAMP_STEPS - 1)) for i in range(RAMP_STEPS)]
