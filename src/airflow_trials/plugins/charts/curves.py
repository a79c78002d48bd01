"""Learning curves as SVG: every trial's metric per iteration, the best highlighted.

The series are :func:`airflow_trials.plotting.learning_curves`'s, which the CLI's PNG draws too.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from html import escape

from airflow_trials.plotting import Curve, CurveSeries, learning_curves
from airflow_trials.plugins.charts.kit import BEST_COLOR, Plot, empty_svg, nice_ticks, svg_open
from airflow_trials.plugins.datamodels.chart_scale import Scale

WIDTH = 860
HEIGHT = 360
LEFT, RIGHT, TOP, BOTTOM = 70, 20, 30, 45


def value_plot(points: Sequence[tuple[float, float]], height: float = HEIGHT) -> Plot:
    """The plot area that shows every (x, y) point on linear scales; a single x or y value
    still gets a range."""
    x_low, x_high = min(x for x, _ in points), max(x for x, _ in points)
    y_low, y_high = min(y for _, y in points), max(y for _, y in points)
    if x_high == x_low:
        x_high = x_low + 1
    if y_high == y_low:
        y_low, y_high = y_low - 0.5, y_high + 0.5
    return Plot(
        LEFT,
        TOP,
        WIDTH - LEFT - RIGHT,
        height - TOP - BOTTOM,
        x=Scale.linear(x_low, x_high, tick_count=5),
        y=Scale.linear(y_low, y_high, tick_count=5),
    )


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
    if not chart.has_points:
        return empty_svg(
            "curves", WIDTH, HEIGHT, chart.title, f"No results with metric {metric} yet."
        )
    plot = value_plot([point for line in chart.series for point in line.points])
    # Iterations are integers: whole ticks only.
    iterations = nice_ticks(plot.x.low, plot.x.high)
    x_ticks = [(plot.px(t), str(int(t))) for t in iterations if t == int(t)]
    parts = [
        svg_open("curves", WIDTH, HEIGHT, chart.title),
        plot.axes("training_iteration", metric, x_ticks=x_ticks, title_y=HEIGHT - 8),
    ]
    for line in chart.series:  # the best last: on top
        parts.extend(_curve(plot, line))
    if chart.best_trial_id is not None:
        parts.append(
            f'<g class="legend" font-size="12"><line x1="{WIDTH - 230}" x2="{WIDTH - 205}" y1="16" '
            f'y2="16" stroke="{BEST_COLOR}" stroke-width="3"/><text x="{WIDTH - 200}" y="20">best: '
            f"{escape(chart.best_trial_id)}</text></g>"
        )
    parts.append("</svg>")
    return "".join(parts)


def _curve(plot: Plot, line: CurveSeries) -> list[str]:
    """One trial's polyline (and a dot when it has a single point: a polyline would draw
    nothing)."""
    best = line.best
    path = plot.path(line.points)
    parts = [
        f'<polyline class="curve{" best" if best else ""}" data-trial="{escape(line.trial_id)}" '
        f'fill="none" stroke="{line.color}" stroke-width="{3 if best else 1.2}" '
        f'stroke-opacity="{1 if best else 0.6}" points="{path}"><title>{escape(line.trial_id)}'
        f"{' (best)' if best else ''}</title></polyline>"
    ]
    if len(line.points) == 1:
        x, y = line.points[0]
        parts.append(
            f'<circle cx="{plot.px(x)}" cy="{plot.py(y)}" r="{4 if best else 3}" '
            f'fill="{line.color}"/>'
        )
    return parts
