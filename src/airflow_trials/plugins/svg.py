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
from datetime import datetime, timedelta
from html import escape

from airflow_trials.plotting import BEST_COLOR, PALETTE, Curve, learning_curves

WIDTH = 860
HEIGHT = 360
_MARGIN_LEFT, _MARGIN_RIGHT, _MARGIN_TOP, _MARGIN_BOTTOM = 70, 20, 30, 45


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
    chart = learning_curves(curves, metric=metric, best_trial_id=best_trial_id, title=title)
    title = chart.title
    head = (
        f'<svg xmlns="http://www.w3.org/2000/svg" class="curves" role="img" width="{WIDTH}" '
        f'height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" fill="currentColor" '
        f'aria-label="{escape(title)}">'
        f"<title>{escape(title)}</title>"
    )
    if not chart.has_points:
        return (
            f'{head}<text x="{WIDTH / 2}" y="{HEIGHT / 2}" text-anchor="middle" class="empty">'
            f"No results with metric {escape(metric)} yet.</text></svg>"
        )
    frame = _Frame.around([point for line in chart.series for point in line.points])
    parts = [head, *frame.axes(metric)]
    for line in chart.series:  # the best last: on top
        parts.extend(frame.curve(line.trial_id, line.points, line.color, best=line.best))
    best_shown = chart.best_trial_id
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


# -- hyperparameter importances: a horizontal bar per parameter, most important on top ----------
IMPORTANCE_ROW = 26
_IMPORTANCE_LABEL_CHARS = 36  # longer names are cut (the bar's tooltip has the whole name)


def importances_svg(importances: Sequence[tuple[str, float]], *, title: str) -> str:
    """An ``<svg>`` bar chart of hyperparameter importances: one bar per parameter, sorted
    descending (most important on top), its share printed at the bar's end.

    :param importances: (parameter, share) pairs; shares are 0 to 1 and need not be sorted.
    :param title: the chart's accessible title.
    """
    rows = sorted(importances, key=lambda row: (-row[1], row[0]))
    label_chars = min(max((len(name) for name, _ in rows), default=8), _IMPORTANCE_LABEL_CHARS)
    # About 7 px per character at 12 px: the labels' column, right-aligned against the bars.
    left = max(80, 7 * label_chars + 16)
    right, top, bottom = 64, 14, 40
    height = top + IMPORTANCE_ROW * max(len(rows), 1) + bottom
    plot_w = WIDTH - left - right
    head = (
        f'<svg xmlns="http://www.w3.org/2000/svg" class="importances" role="img" width="{WIDTH}" '
        f'height="{height}" viewBox="0 0 {WIDTH} {height}" fill="currentColor" '
        f'aria-label="{escape(title)}"><title>{escape(title)}</title>'
    )
    if not rows:
        return (
            f'{head}<text x="{WIDTH / 2}" y="{height / 2}" text-anchor="middle" class="empty">'
            "No hyperparameter to rank.</text></svg>"
        )
    high = max(share for _, share in rows)
    ticks = nice_ticks(0.0, high if high > 0 else 1.0, count=5)
    if ticks[-1] < high:  # one more tick, so the longest bar ends inside the grid
        ticks.append(round(2 * ticks[-1] - ticks[-2], 12))
    scale_max = ticks[-1]
    base_y = top + IMPORTANCE_ROW * len(rows)

    def sx(value: float) -> float:
        return left + value / scale_max * plot_w

    parts = [head, '<g class="ticks" font-size="11" fill-opacity="0.8">']
    for tick in ticks:
        x = sx(tick)
        parts.append(
            f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{top}" y2="{base_y}" class="grid" '
            f'stroke="currentColor" stroke-opacity="0.12"/>'
            f'<text x="{x:.1f}" y="{base_y + 16}" text-anchor="middle">{_label(tick)}</text>'
        )
    parts.append(
        f'</g><line class="axis" x1="{left}" x2="{left}" y1="{top}" y2="{base_y}" '
        'stroke="currentColor" stroke-opacity="0.55"/>'
        f'<text x="{left + plot_w / 2}" y="{height - 6}" text-anchor="middle" font-size="12">'
        "importance (share of the total)</text>"
    )
    for index, (name, share) in enumerate(rows):
        y = top + index * IMPORTANCE_ROW
        shown = name if len(name) <= label_chars else name[: label_chars - 1] + "…"
        width = max(sx(share) - left, 0.0)
        parts.append(
            f'<g class="importance" data-param="{escape(name)}" data-importance="{share:.6g}">'
            f"<title>{escape(name)}: {share:.4g}</title>"
            f'<text class="param" x="{left - 8}" y="{y + IMPORTANCE_ROW / 2 + 4:.1f}" '
            f'text-anchor="end" font-size="12">{escape(shown)}</text>'
            f'<rect class="bar" x="{left}" y="{y + 4}" width="{width:.1f}" '
            f'height="{IMPORTANCE_ROW - 8}" fill="{PALETTE[0]}"/>'
            f'<text class="value" x="{left + width + 6:.1f}" y="{y + IMPORTANCE_ROW / 2 + 4:.1f}" '
            f'font-size="12">{_share_label(share)}</text></g>'
        )
    parts.append("</svg>")
    return "".join(parts)


def _share_label(share: float) -> str:
    """A share as the bar's end shows it: 3 decimals, 2 significant digits below 0.01 (0.0036,
    not 0.004; 0.0002, not 0.000), and "<0.0001" below that."""
    if share >= 0.01 or share == 0:
        return f"{share:.3f}"
    return f"{share:.2g}" if share >= 0.0001 else "<0.0001"


# -- an experiment's trend across its runs ---------------------------------------------------------

TrendPoint = tuple[str, datetime, float]


def history_trend_svg(
    points: Sequence[TrendPoint],
    *,
    metric: str,
    mode: str,
    title: str | None = None,
) -> str:
    """An ``<svg>`` of each run's best value over time: one dot per run (``data-run`` is its run
    key) joined by a line, the best run of all drawn red; the x axis is the runs' dates (UTC).

    :param points: (run key, run date, best value) per run with a best, in date order; non-finite
        values are left out.
    :param metric: the metric's name, the y-axis label.
    :param mode: ``"min"`` or ``"max"``: which run is the best of all.
    :param title: the chart's accessible title; default "Best <metric> per run".
    """
    title = title or f"Best {metric} per run"
    shown = [(key, when, value) for key, when, value in points if math.isfinite(value)]
    head = (
        f'<svg xmlns="http://www.w3.org/2000/svg" class="trend" role="img" width="{WIDTH}" '
        f'height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" fill="currentColor" '
        f'aria-label="{escape(title)}">'
        f"<title>{escape(title)}</title>"
    )
    if not shown:
        return (
            f'{head}<text x="{WIDTH / 2}" y="{HEIGHT / 2}" text-anchor="middle" class="empty">'
            f"No run has a best {escape(metric)} yet.</text></svg>"
        )
    start = shown[0][1]
    days = [(when - start).total_seconds() / 86_400 for _, when, _ in shown]
    frame = _Frame.around([(x, value) for x, (_, _, value) in zip(days, shown, strict=True)])
    best_index = (min if mode == "min" else max)(range(len(shown)), key=lambda i: shown[i][2])
    parts = [head, *_trend_axes(frame, start, metric)]
    path = " ".join(
        f"{frame.sx(x):.1f},{frame.sy(value):.1f}"
        for x, (_, _, value) in zip(days, shown, strict=True)
    )
    parts.append(
        f'<polyline class="trend-line" fill="none" stroke="{PALETTE[0]}" stroke-width="1.5" '
        f'stroke-opacity="0.7" points="{path}"/>'
    )
    radius = 4 if len(shown) <= 60 else 2.5
    for index, (x, (key, when, value)) in enumerate(zip(days, shown, strict=True)):
        best = index == best_index
        parts.append(
            f'<circle class="trend-point{" best" if best else ""}" data-run="{escape(key)}" '
            f'data-value="{value!r}" cx="{frame.sx(x):.1f}" cy="{frame.sy(value):.1f}" '
            f'r="{radius + 1.5 if best else radius}" '
            f'fill="{BEST_COLOR if best else PALETTE[0]}"><title>{escape(key)} '
            f"({when:%Y-%m-%d}): {_label(value)}{' (best run)' if best else ''}</title></circle>"
        )
    key, _, value = shown[best_index]
    # Above the plot area on the left: no point is drawn there, and a long run key has room.
    parts.append(
        f'<g class="legend" font-size="12"><circle cx="{_MARGIN_LEFT + 5}" cy="15" r="5" '
        f'fill="{BEST_COLOR}"/><text x="{_MARGIN_LEFT + 15}" y="19">best run: {escape(key)} '
        f"({_label(value)})</text></g></svg>"
    )
    return "".join(parts)


def _trend_axes(frame: _Frame, start: datetime, metric: str) -> list[str]:
    """Axes, value grid and date ticks of :func:`history_trend_svg` (x in days since ``start``)."""
    plot_w, plot_h = frame.plot_w, frame.plot_h
    bottom = _MARGIN_TOP + plot_h
    parts = [
        f'<g class="axes" stroke="currentColor" stroke-opacity="0.55" stroke-width="1">'
        f'<line x1="{_MARGIN_LEFT}" y1="{bottom}" x2="{_MARGIN_LEFT + plot_w}" y2="{bottom}"/>'
        f'<line x1="{_MARGIN_LEFT}" y1="{_MARGIN_TOP}" x2="{_MARGIN_LEFT}" y2="{bottom}"/></g>',
        '<g class="ticks" font-size="11" fill-opacity="0.8">',
    ]
    for tick in nice_ticks(frame.y_low, frame.y_high):
        y = frame.sy(tick)
        parts.append(
            f'<line x1="{_MARGIN_LEFT}" x2="{_MARGIN_LEFT + plot_w}" y1="{y:.1f}" y2="{y:.1f}" '
            f'class="grid" stroke="currentColor" stroke-opacity="0.12"/>'
            f'<text x="{_MARGIN_LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{_label(tick)}</text>'
        )
    # Whole days only, and few enough that "YYYY-MM-DD" labels never overlap.
    ticks = [t for t in nice_ticks(frame.x_low, frame.x_high, 6) if t == int(t)]
    for tick in ticks or [frame.x_low]:
        x = frame.sx(tick)
        day = start + timedelta(days=tick)
        # A date is ~70 px wide: near the right edge it ends at its tick rather than centring.
        anchor = "end" if x > WIDTH - _MARGIN_RIGHT - 40 else "middle"
        parts.append(
            f'<text x="{x:.1f}" y="{bottom + 16}" text-anchor="{anchor}">{day:%Y-%m-%d}</text>'
        )
    parts.append(
        f'</g><text x="{_MARGIN_LEFT + plot_w / 2}" y="{HEIGHT - 8}" text-anchor="middle" '
        f'font-size="12">run date (UTC)</text><text x="14" y="{_MARGIN_TOP + plot_h / 2}" '
        f'text-anchor="middle" font-size="12" transform="rotate(-90 14 '
        f'{_MARGIN_TOP + plot_h / 2})">best {escape(metric)}</text>'
    )
    return parts
