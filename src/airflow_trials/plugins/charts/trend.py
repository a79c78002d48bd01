"""An experiment's trend across its runs as SVG: each run's best value over time."""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import datetime, timedelta
from html import escape

from airflow_trials.plugins.charts.curves import HEIGHT, LEFT, WIDTH, value_plot
from airflow_trials.plugins.charts.kit import (
    BEST_COLOR,
    PALETTE,
    Plot,
    empty_svg,
    nice_ticks,
    number_label,
    svg_open,
)

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
    if not shown:
        return empty_svg("trend", WIDTH, HEIGHT, title, f"No run has a best {metric} yet.")
    start = shown[0][1]
    days = [(when - start).total_seconds() / 86_400 for _, when, _ in shown]
    plot = value_plot([(x, value) for x, (_, _, value) in zip(days, shown, strict=True)])
    best_index = (min if mode == "min" else max)(range(len(shown)), key=lambda i: shown[i][2])
    parts = [
        svg_open("trend", WIDTH, HEIGHT, title),
        plot.axes(
            "run date (UTC)", f"best {metric}", x_ticks=_date_ticks(plot, start), title_y=HEIGHT - 8
        ),
    ]
    path = " ".join(
        f"{plot.px(x)},{plot.py(value)}" for x, (_, _, value) in zip(days, shown, strict=True)
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
            f'data-value="{value!r}" cx="{plot.px(x)}" cy="{plot.py(value)}" '
            f'r="{radius + 1.5 if best else radius}" '
            f'fill="{BEST_COLOR if best else PALETTE[0]}"><title>{escape(key)} '
            f"({when:%Y-%m-%d}): {number_label(value)}{' (best run)' if best else ''}</title>"
            "</circle>"
        )
    key, _, value = shown[best_index]
    # Above the plot area on the left: no point is drawn there, and a long run key has room.
    parts.append(
        f'<g class="legend" font-size="12"><circle cx="{LEFT + 5}" cy="15" r="5" '
        f'fill="{BEST_COLOR}"/><text x="{LEFT + 15}" y="19">best run: {escape(key)} '
        f"({number_label(value)})</text></g></svg>"
    )
    return "".join(parts)


def _date_ticks(plot: Plot, start: datetime) -> list[tuple[float, str]]:
    """(pixel, date) of whole days only, few enough that "YYYY-MM-DD" labels never overlap (x in
    days since ``start``)."""
    ticks = [t for t in nice_ticks(plot.x.low, plot.x.high, 6) if t == int(t)]
    return [
        (plot.px(tick), f"{start + timedelta(days=tick):%Y-%m-%d}")
        for tick in ticks or [plot.x.low]
    ]
