"""The dashboard's chart kit: the one axis and scale system under every chart it draws.

A :class:`~airflow_trials.plugins.datamodels.chart_scale.Scale` (import it from there) maps a
value to a fraction of its axis (linear, log over more than two decades, or categorical) and
gives the axis's ticks; a :class:`Plot` is a chart's plot area over an x and a
y scale: it maps values to pixels and draws the axes, the value grid, the ticks and the axes'
titles the same way on every chart. :func:`svg_open` and :func:`empty_svg` open every chart's
``<svg>``; the colours (the palette, the accent of the best trials, the sequential ramp of a
metric) are shared too.

No JavaScript and no charting library: the pages embed the SVG text, so they render offline and
under a Content-Security-Policy that forbids scripts. Text, axes and grid are drawn in
``currentColor`` (the page's text color), so the charts read in light and dark mode. Every label
is escaped.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from html import escape
from typing import Any

from airflow_trials.plotting import BEST_COLOR, PALETTE
from airflow_trials.plugins.datamodels.chart_scale import (
    LABEL_CHARS,
    LOG_SPAN,
    MAX_CATEGORY_LABELS,
    Scale,
    category,
    is_value,
    nice_ticks,
    number_label,
    short,
)

__all__ = [
    "BEST_COLOR",
    "PALETTE",
    "LABEL_CHARS",
    "LOG_SPAN",
    "MAX_CATEGORY_LABELS",
    "category",
    "is_value",
    "nice_ticks",
    "number_label",
    "short",
]

# Viridis, cut before its lightest yellow (which does not read on a white page): dark = worst.
_RAMP = ("#440154", "#414487", "#2a788e", "#22a884", "#7ad151", "#bddf26")
ACCENT = BEST_COLOR  # the best trials, as on the learning curves
NO_VALUE_COLOR = "#8a96a3"


@dataclass(frozen=True)
class Plot:
    """A chart's plot area over an x and a y scale: values to pixels, and the axes drawn.

    :param left: the plot area's left edge, in pixels.
    :param top: its top edge.
    :param width: its width.
    :param height: its height.
    :param x: the x scale (low end on the left).
    :param y: the y scale (low end at the bottom).
    :param pad: pixels kept free inside the area on every side, so no mark sits on an axis.
    :param whole: whole-pixel coordinates (else one decimal).
    """

    left: float
    top: float
    width: float
    height: float
    x: Scale
    y: Scale
    pad: float = 0.0
    whole: bool = False

    @property
    def bottom(self) -> float:
        return self.top + self.height

    def _pixel(self, value: float) -> float:
        return round(value) if self.whole else round(value, 1)

    def x_fraction(self, fraction: float) -> float:
        """The pixel of a fraction of the x axis (categories half a step in from the edges)."""
        n = len(self.x.categories)
        inset = 0.5 / n if self.x.kind == "categorical" and n else 0.0
        span = self.width - 2 * self.pad
        return self._pixel(self.left + self.pad + (inset + fraction * (1 - 2 * inset)) * span)

    def y_fraction(self, fraction: float) -> float:
        return self._pixel(self.bottom - self.pad - fraction * (self.height - 2 * self.pad))

    def px(self, value: Any) -> float:
        return self.x_fraction(self.x.fraction(value))

    def py(self, value: Any) -> float:
        return self.y_fraction(self.y.fraction(value))

    def path(self, points: Iterable[tuple[Any, Any]]) -> str:
        """``"x,y x,y ..."``: each point's :meth:`px` and :meth:`py`, for a polyline. On two
        linear scales the same arithmetic runs inline (a curve's thousands of points would
        otherwise cost ten calls each)."""
        x, y = self.x, self.y
        if x.kind != "linear" or y.kind != "linear" or x.high == x.low or y.high == y.low:
            return " ".join(f"{self.px(a)},{self.py(b)}" for a, b in points)
        x_low, x_span, x_start = x.low, x.high - x.low, self.left + self.pad
        y_low, y_span, y_start = y.low, y.high - y.low, self.bottom - self.pad
        width, height = self.width - 2 * self.pad, self.height - 2 * self.pad
        digits = None if self.whole else 1
        return " ".join(
            f"{round(x_start + (a - x_low) / x_span * width, digits)},"
            f"{round(y_start - (b - y_low) / y_span * height, digits)}"
            for a, b in points
        )

    def axes(
        self,
        x_title: str,
        y_title: str,
        *,
        x_ticks: Iterable[tuple[float, str]] | None = None,
        tick_class: str | None = None,
        title_y: float | None = None,
    ) -> str:
        """The two axis lines, the y grid with its labels, the x ticks (``x_ticks``: (pixel,
        label) pairs; default the x scale's; a label near the right edge ends at its tick) and
        both axes' titles, escaped. ``tick_class`` is the x labels' class, ``title_y`` where the
        x axis's title sits."""
        left, bottom, right = self.left, self.bottom, self.left + self.width
        parts = [
            '<g class="axes" stroke="currentColor" stroke-opacity="0.55" stroke-width="1">'
            f'<line x1="{left}" y1="{bottom}" x2="{right}" y2="{bottom}"/>'
            f'<line x1="{left}" y1="{self.top}" x2="{left}" y2="{bottom}"/></g>'
            '<g class="ticks" font-size="11" fill-opacity="0.8">'
        ]
        for fraction, label in self.y.ticks():
            y = self.y_fraction(fraction)
            parts.append(
                f'<line x1="{left}" x2="{right}" y1="{y}" y2="{y}" class="grid" '
                'stroke="currentColor" stroke-opacity="0.12"/>'
                f'<text x="{left - 6}" y="{y + 4}" text-anchor="end">{escape(label)}</text>'
            )
        ticks = x_ticks or [(self.x_fraction(f), label) for f, label in self.x.ticks()]
        css = f' class="{tick_class}"' if tick_class else ""
        for x, label in ticks:
            # About 7 px per character at 11 px: a label that would cross the edge ends there.
            anchor = "end" if x + 3.5 * len(label) > right + 10 else "middle"
            parts.append(
                f'<line x1="{x}" x2="{x}" y1="{bottom}" y2="{bottom + 4}" stroke="currentColor"/>'
                f'<text{css} x="{x}" y="{bottom + 17}" text-anchor="{anchor}">'
                f"{escape(label)}</text>"
            )
        mid_x, mid_y = self._pixel(left + self.width / 2), self._pixel(self.top + self.height / 2)
        parts.append(
            f'</g><text class="x-label" x="{mid_x}" y="{title_y or bottom + 38}" '
            f'text-anchor="middle" font-size="12">{escape(x_title)}</text>'
            f'<text class="y-label" x="16" y="{mid_y}" text-anchor="middle" font-size="12" '
            f'transform="rotate(-90 16 {mid_y})">{escape(y_title)}</text>'
        )
        return "".join(parts)


def svg_open(css_class: str, width: float, height: float, title: str) -> str:
    """A chart's ``<svg>`` start tag and its accessible title."""
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" class="{css_class}" role="img" '
        f'width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
        f'fill="currentColor" aria-label="{escape(title)}"><title>{escape(title)}</title>'
    )


def empty_svg(css_class: str, width: float, height: float, title: str, message: str) -> str:
    """A chart with nothing to draw: the ``message`` in its middle, escaped."""
    return (
        f"{svg_open(css_class, width, height, title)}"
        f'<text x="{width / 2}" y="{height / 2}" text-anchor="middle" class="empty">'
        f"{escape(message)}</text></svg>"
    )


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
