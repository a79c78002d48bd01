"""Learning curves as an SVG drawn on the server: every trial's metric per iteration, the best
highlighted.

No JavaScript and no charting library: the page embeds the SVG text, so it renders offline and
under a Content-Security-Policy that forbids scripts. Text, axes and grid are drawn in
``currentColor`` (the page's text color), so the chart reads in light and dark mode. Every label
is escaped.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from html import escape

Curve = Sequence[tuple[int, float]]

WIDTH = 860
HEIGHT = 360
_MARGIN_LEFT, _MARGIN_RIGHT, _MARGIN_TOP, _MARGIN_BOTTOM = 70, 20, 30, 45
_PALETTE = ("#4e79a7", "#59a14f", "#9c755f", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7", "#bab0ac")
BEST_COLOR = "#e15759"


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


def _label(value: float) -> str:
    return f"{value:.4g}"


def learning_curves_svg(
    curves: Mapping[str, Curve],
    *,
    metric: str,
    best_trial_id: str | None = None,
    title: str | None = None,
) -> str:
    """An ``<svg>`` element with one polyline per trial; the best trial is drawn last, thick and
    red.

    :param curves: trial id -> [(iteration, value)], values finite; empty curves are skipped.
    :param metric: the metric's name, the y-axis label.
    :param best_trial_id: the trial to highlight; default none.
    :param title: the chart's accessible title; default "Learning curves: <metric>".
    """
    title = title or f"Learning curves: {metric}"
    points = [(x, y) for curve in curves.values() for x, y in curve if math.isfinite(y)]
    head = (
        f'<svg xmlns="http://www.w3.org/2000/svg" class="curves" role="img" width="{WIDTH}" '
        f'height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" fill="currentColor" '
        f'aria-label="{escape(title)}">'
        f"<title>{escape(title)}</title>"
    )
    if not points:
        return (
            f'{head}<text x="{WIDTH / 2}" y="{HEIGHT / 2}" text-anchor="middle" class="empty">'
            f"No results with metric {escape(metric)} yet.</text></svg>"
        )
    frame = _Frame.around(points)
    parts = [head, *frame.axes(metric)]
    best_shown = best_trial_id if best_trial_id is not None and best_trial_id in curves else None
    ordered = sorted(trial_id for trial_id in curves if trial_id != best_shown)
    if best_shown is not None:
        ordered.append(best_shown)  # drawn last: on top
    for index, trial_id in enumerate(ordered):
        curve = [(x, y) for x, y in curves[trial_id] if math.isfinite(y)]
        if curve:
            color = BEST_COLOR if trial_id == best_trial_id else _PALETTE[index % len(_PALETTE)]
            parts.extend(frame.curve(trial_id, curve, color, best=trial_id == best_trial_id))
    if best_shown is not None:
        parts.append(
            f'<g class="legend" font-size="12"><line x1="{WIDTH - 230}" x2="{WIDTH - 205}" y1="16" '
            'y2="16" '
            f'stroke="{BEST_COLOR}" stroke-width="3"/><text x="{WIDTH - 200}" y="20">best: '
            f"{escape(best_shown)}</text></g>"
        )
    parts.append("</svg>")
    return "".join(parts)


@dataclass(frozen=True)
class _Frame:
    """The plot area and the data ranges it shows: maps (iteration, value) to SVG coordinates."""

    x_low: float
    x_high: float
    y_low: float
    y_high: float
    plot_w: float = WIDTH - _MARGIN_LEFT - _MARGIN_RIGHT
    plot_h: float = HEIGHT - _MARGIN_TOP - _MARGIN_BOTTOM

    @classmethod
    def around(cls, points: Sequence[tuple[float, float]]) -> _Frame:
        """The frame that shows every point; a single iteration or value still gets a range."""
        x_low, x_high = min(x for x, _ in points), max(x for x, _ in points)
        y_low, y_high = min(y for _, y in points), max(y for _, y in points)
        if x_high == x_low:
            x_high = x_low + 1
        if y_high == y_low:
            y_low, y_high = y_low - 0.5, y_high + 0.5
        return cls(x_low, x_high, y_low, y_high)

    def sx(self, x: float) -> float:
        return _MARGIN_LEFT + (x - self.x_low) / (self.x_high - self.x_low) * self.plot_w

    def sy(self, y: float) -> float:
        return _MARGIN_TOP + (self.y_high - y) / (self.y_high - self.y_low) * self.plot_h

    def axes(self, metric: str) -> list[str]:
        """The axes, their ticks and grid lines, and their labels."""
        plot_w, plot_h = self.plot_w, self.plot_h
        parts = [
            f'<g class="axes" stroke="currentColor" stroke-opacity="0.55" stroke-width="1">'
            f'<line x1="{_MARGIN_LEFT}" y1="{_MARGIN_TOP + plot_h}" x2="{_MARGIN_LEFT + plot_w}" '
            f'y2="{_MARGIN_TOP + plot_h}"/><line x1="{_MARGIN_LEFT}" y1="{_MARGIN_TOP}" '
            f'x2="{_MARGIN_LEFT}" y2="{_MARGIN_TOP + plot_h}"/></g>'
        ]
        parts.append('<g class="ticks" font-size="11" fill-opacity="0.8">')
        for tick in nice_ticks(self.y_low, self.y_high):
            y = self.sy(tick)
            parts.append(
                f'<line x1="{_MARGIN_LEFT}" x2="{_MARGIN_LEFT + plot_w}" y1="{y:.1f}" y2="{y:.1f}" '
                f'class="grid" stroke="currentColor" stroke-opacity="0.12"/>'
                f'<text x="{_MARGIN_LEFT - 6}" y="{y + 4:.1f}" '
                f'text-anchor="end">{_label(tick)}</text>'
            )
        for tick in nice_ticks(self.x_low, self.x_high):
            if tick != int(tick):
                continue  # iterations are integers
            x = self.sx(tick)
            parts.append(
                f'<text x="{x:.1f}" y="{_MARGIN_TOP + plot_h + 16}" '
                f'text-anchor="middle">{int(tick)}</text>'
            )
        parts.append(
            f'</g><text x="{_MARGIN_LEFT + plot_w / 2}" y="{HEIGHT - 8}" text-anchor="middle" '
            'font-size="12">'
            f'training_iteration</text><text x="14" y="{_MARGIN_TOP + plot_h / 2}" '
            'text-anchor="middle" '
            'font-size="12" transform="rotate(-90 14 '
            f'{_MARGIN_TOP + plot_h / 2})">{escape(metric)}</text>'
        )
        return parts

    def curve(self, trial_id: str, curve: Curve, color: str, *, best: bool) -> list[str]:
        """One trial's polyline (and a dot when it has a single point: a polyline would draw
        nothing)."""
        path = " ".join(f"{self.sx(x):.1f},{self.sy(y):.1f}" for x, y in curve)
        parts = [
            f'<polyline class="curve{" best" if best else ""}" data-trial="{escape(trial_id)}" '
            f'fill="none" stroke="{color}" stroke-width="{3 if best else 1.2}" '
            f'stroke-opacity="{1 if best else 0.6}" points="{path}"><title>{escape(trial_id)}'
            f"{' (best)' if best else ''}</title></polyline>"
        ]
        if len(curve) == 1:
            x, y = curve[0]
            parts.append(
                f'<circle cx="{self.sx(x):.1f}" cy="{self.sy(y):.1f}" r="{4 if best else 3}" '
                f'fill="{color}"/>'
            )
        return parts
