"""Parallel coordinates and slice plots of a run's trials, as SVG drawn on the server.

One ``<polyline>`` per trial with whole-pixel coordinates and its styles inherited from a group,
so 1,000 trials stay a few hundred kilobytes; thin, semi-transparent lines, the worst drawn first
and the best last, so the best stay on top. Text and axes are drawn in ``currentColor``; every
label is escaped.
"""

from __future__ import annotations

from html import escape

from airflow_trials.plugins.charts.kit import (
    ACCENT,
    NO_VALUE_COLOR,
    Plot,
    empty_svg,
    number_label,
    ramp,
    ramp_stops,
    short,
    svg_open,
)
from airflow_trials.plugins.datamodels.chart_scale import Scale
from airflow_trials.plugins.datamodels.coordinates import TOP_TRIALS, Coordinates, Line

AXIS_SPACING_MIN, AXIS_SPACING_MAX = 110, 200
PLOT_WIDTH = 860  # the span of the axes when that spacing allows
_LEFT, _RIGHT, _TOP, _PLOT_H = 70, 70, 48, 300
_MISSING_GAP = 24  # the "missing" mark sits this far below an axis
_LEGEND_Y = _TOP + _PLOT_H + _MISSING_GAP + 36
HEIGHT = _LEGEND_Y + 34


# Every vertical axis spans the same height: a value's pixel is its fraction of that height.
_COLUMN = Plot(_LEFT, _TOP, 0, _PLOT_H, x=Scale.linear(0, 1), y=Scale.linear(0, 1), whole=True)


def _empty(css_class: str, title: str, message: str) -> str:
    return empty_svg(css_class, PLOT_WIDTH, 120, title, message)


def _draw_order(found: Coordinates) -> list[Line]:
    """Trials without a value first, then worst to best, the top trials last (the best on
    top)."""
    no_value = [line for line in found.lines if line.value is None]
    rest = [line for line in found.lines if line.value is not None and not line.top]
    rest.sort(key=lambda line: found.goodness(line.value or 0.0))
    top = [line for line in found.lines if line.top]
    return no_value + rest + top[::-1]


def _color(found: Coordinates, line: Line) -> str:
    if line.value is None:
        return NO_VALUE_COLOR
    return ACCENT if line.top else ramp(found.goodness(line.value))


def _axis_group(x: int, name: str, title: str, scale: Scale | None, missing: str | None) -> str:
    """One vertical axis at ``x``: its line, ticks, name (cut; the whole in its tooltip) and,
    when some trials lack a value, the mark they are drawn at."""
    bottom = _TOP + _PLOT_H
    parts = [
        f'<g class="axis" data-key="{escape(title)}">'
        f'<line x1="{x}" x2="{x}" y1="{_TOP}" y2="{bottom}" stroke="currentColor" '
        'stroke-opacity="0.7"/>'
        f'<text class="axis-name" x="{x}" y="{_TOP - 22}" text-anchor="middle" font-size="12" '
        f'font-weight="600"><title>{escape(title)}</title>{escape(short(name, 18))}</text>'
    ]
    if scale is not None:
        kind = {"log": "log", "categorical": "categories", "linear": ""}[scale.kind]
        if kind:
            parts.append(
                f'<text x="{x}" y="{_TOP - 8}" text-anchor="middle" font-size="10" '
                f'fill-opacity="0.7">{kind}</text>'
            )
        for fraction, label in scale.ticks():
            y = _COLUMN.y_fraction(fraction)
            parts.append(
                f'<line x1="{x - 4}" x2="{x}" y1="{y}" y2="{y}" stroke="currentColor"/>'
                f'<text class="tick" x="{x - 6}" y="{y + 4}" text-anchor="end" '
                f'font-size="10">{escape(label)}</text>'
            )
    if missing is not None:
        y = bottom + _MISSING_GAP
        parts.append(
            f'<circle cx="{x}" cy="{y}" r="2.5"/><text class="tick" x="{x - 6}" y="{y + 4}" '
            f'text-anchor="end" font-size="10" font-style="italic">{missing}</text>'
        )
    parts.append("</g>")
    return "".join(parts)


def parallel_coordinates_svg(found: Coordinates) -> str:
    """An ``<svg>`` with one vertical axis per config key and the metric's last, and one
    polyline per trial coloured by its metric value; the :data:`TOP_TRIALS` best thicker, in
    the accent colour, drawn last."""
    title = f"Parallel coordinates: {found.run.experiment_name} / {found.run.run_key}"
    if not found.lines:
        return _empty("coordinates", title, "No trials in this run yet.")
    count = len(found.axes) + 1
    spacing = (
        AXIS_SPACING_MAX
        if count < 2
        else max(AXIS_SPACING_MIN, min(AXIS_SPACING_MAX, PLOT_WIDTH // (count - 1)))
    )
    width = _LEFT + spacing * (count - 1) + _RIGHT
    xs = [_LEFT + i * spacing for i in range(count)]
    parts = [svg_open("coordinates", width, HEIGHT, title)]
    gradient = "".join(
        f'<stop offset="{offset:.2f}" stop-color="{color}"/>' for offset, color in ramp_stops()
    )
    parts.append(f'<defs><linearGradient id="coordinates-ramp">{gradient}</linearGradient></defs>')
    parts.extend(_lines(found, xs))
    for x, axis in zip(xs, found.axes, strict=False):
        missing = f"missing ({axis.missing})" if axis.missing else None
        parts.append(_axis_group(x, axis.key, axis.key, axis.scale, missing))
    no_values = sum(1 for line in found.lines if line.value is None)
    parts.append(
        _axis_group(
            xs[-1],
            f"{found.mode} {found.metric}",
            found.metric,
            found.metric_scale,
            f"no value ({no_values})" if no_values else None,
        )
    )
    parts.append(_legend(found, width))
    parts.append("</svg>")
    return "".join(parts)


def _y_of(scale: Scale | None, present: bool, value: object) -> int:
    """A value's pixel on its axis; the missing mark's when it has none."""
    if not present or scale is None:
        return round(_TOP + _PLOT_H + _MISSING_GAP)
    return round(_COLUMN.y_fraction(scale.fraction(value)))


def _lines(found: Coordinates, xs: list[int]) -> list[str]:
    """One polyline per trial across the axes at ``xs``, in drawing order."""
    parts = [
        '<g class="lines" fill="none" stroke-width="1" stroke-opacity="0.35" '
        'stroke-linejoin="round">'
    ]
    for line in _draw_order(found):
        points = [
            f"{x},{_y_of(axis.scale, axis.key in line.config, line.config.get(axis.key))}"
            for x, axis in zip(xs, found.axes, strict=False)
        ]
        points.append(f"{xs[-1]},{_y_of(found.metric_scale, line.value is not None, line.value)}")
        extra = ' stroke-width="2.5" stroke-opacity="0.95"' if line.top else ""
        css = "trial top" if line.top else ("trial no-value" if line.value is None else "trial")
        value = "no value" if line.value is None else number_label(line.value)
        parts.append(
            f'<polyline class="{css}" data-trial="{escape(line.trial_id)}" '
            f'stroke="{_color(found, line)}"{extra} points="{" ".join(points)}">'
            f"<title>{escape(line.trial_id)}: {escape(found.metric)} {value} "
            f"(rank {line.rank})</title></polyline>"
        )
    parts.append("</g>")
    return parts


def _legend(found: Coordinates, width: int) -> str:
    """The colour ramp from the worst value to the best, and the accent of the best trials."""
    y = _LEGEND_Y
    parts = ['<g class="legend" font-size="11">']
    if found.metric_scale is not None:
        scale = found.metric_scale
        worst, best = (scale.low, scale.high) if found.mode == "max" else (scale.high, scale.low)
        parts.append(
            f'<text x="{_LEFT}" y="{y + 4}">{escape(short(found.metric, 24))}: worst '
            f"{number_label(worst)}</text>"
            f'<rect class="ramp" x="{_LEFT + 190}" y="{y - 7}" width="180" height="12" '
            'fill="url(#coordinates-ramp)"/>'
            f'<text x="{_LEFT + 378}" y="{y + 4}">best {number_label(best)}</text>'
        )
    shown = sum(1 for line in found.lines if line.top)
    parts.append(
        f'<line x1="{_LEFT + 480}" x2="{_LEFT + 505}" y1="{y}" y2="{y}" stroke="{ACCENT}" '
        f'stroke-width="2.5"/><text x="{_LEFT + 511}" y="{y + 4}">the best {shown} '
        f"(top {TOP_TRIALS})</text>"
    )
    if any(line.value is None for line in found.lines):
        parts.append(
            f'<line x1="{_LEFT + 650}" x2="{_LEFT + 675}" y1="{y}" y2="{y}" '
            f'stroke="{NO_VALUE_COLOR}" stroke-width="2"/>'
            f'<text x="{_LEFT + 681}" y="{y + 4}">no value</text>'
        )
    parts.append("</g>")
    return "".join(parts)


# -- the slice plot ------------------------------------------------------------------------------

SLICE_WIDTH, SLICE_HEIGHT = 860, 380
_S_LEFT, _S_RIGHT, _S_TOP, _S_BOTTOM = 80, 30, 20, 60


def slice_svg(found: Coordinates, key: str) -> str:
    """An ``<svg>`` scatter of the metric against config key ``key``: one circle per trial that
    has the key and a value, coloured as on the parallel coordinates; log axes where the values
    span more than two decades."""
    # The axis over every trial, as on the parallel coordinates (a 422 for an unknown key).
    x_scale = found.axis(key).scale
    title = f"{found.metric} against {key}"
    shown = [line for line in found.lines if line.value is not None and key in line.config]
    if not shown or found.metric_scale is None:
        return _empty("slice", title, f"No trial has both {key} and a value of {found.metric}.")
    plot = Plot(
        _S_LEFT,
        _S_TOP,
        SLICE_WIDTH - _S_LEFT - _S_RIGHT,
        SLICE_HEIGHT - _S_TOP - _S_BOTTOM,
        x=x_scale,
        y=found.metric_scale,
        whole=True,
    )
    sx, sy = plot.px, plot.py
    parts = [
        svg_open("slice", SLICE_WIDTH, SLICE_HEIGHT, title),
        plot.axes(
            f"{key}{x_scale.describe()}",
            f"{found.mode} {found.metric}{plot.y.describe()}",
            title_y=SLICE_HEIGHT - 18,
        ),
    ]
    parts.append('<g class="points" fill-opacity="0.6" stroke="none">')
    ordered = [line for line in shown if not line.top] + [line for line in shown if line.top][::-1]
    for line in ordered:
        value = line.value or 0.0
        r = 4.5 if line.top else 3
        extra = ' fill-opacity="0.95"' if line.top else ""
        parts.append(
            f'<circle class="{"point top" if line.top else "point"}" '
            f'data-trial="{escape(line.trial_id)}" cx="{sx(line.config[key])}" cy="{sy(value)}" '
            f'r="{r}" fill="{_color(found, line)}"{extra}><title>{escape(line.trial_id)}: '
            f"{escape(key)} {escape(_param_label(line.config[key]))}, "
            f"{escape(found.metric)} {number_label(value)}</title></circle>"
        )
    parts.append("</g>")
    left_out = len(found.lines) - len(shown)
    if left_out:
        parts.append(
            f'<text class="left-out" x="{_S_LEFT + plot.width}" y="{SLICE_HEIGHT - 4}" '
            f'text-anchor="end" font-size="11" fill-opacity="0.75">{left_out} trial(s) without '
            f"{escape(short(key, 24))} or a value not shown</text>"
        )
    parts.append("</svg>")
    return "".join(parts)


def _param_label(value: object) -> str:
    if isinstance(value, float):
        return number_label(value)
    return short(str(value), 40)
