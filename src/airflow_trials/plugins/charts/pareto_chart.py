"""The Pareto scatter as SVG: a run's trials on two of its metrics, the front emphasised and
joined by a step line, dominated trials faded, infeasible ones as crosses, the picked trial ringed
and labelled."""

from __future__ import annotations

from collections.abc import Callable
from html import escape

from airflow_trials.plugins.charts.kit import ACCENT, Plot, empty_svg, number_label, short, svg_open
from airflow_trials.plugins.datamodels.chart_scale import Scale
from airflow_trials.plugins.datamodels.runs import ParetoView, Point

WIDTH, HEIGHT = 860, 420
_LEFT, _RIGHT, _TOP, _BOTTOM = 80, 30, 36, 56
DOMINATED_COLOR = "#4e79a7"
INFEASIBLE_COLOR = "#b07aa1"
Pixel = Callable[[float], float]


def pareto_svg(view: ParetoView) -> str:
    """An ``<svg>`` scatter of the run's trials on ``view.x`` and ``view.y``: the front's points
    emphasised and joined by a step line, dominated trials faded, infeasible ones as crosses,
    and the picked trial (when known) ringed and labelled."""
    title = f"Pareto front: {view.mode(view.x)} {view.x}, {view.mode(view.y)} {view.y}"
    if not view.points:
        message = f"No trial has reported both {view.x} and {view.y} yet."
        return empty_svg("pareto", WIDTH, HEIGHT, title, message)
    plot = Plot(
        _LEFT,
        _TOP,
        WIDTH - _LEFT - _RIGHT,
        HEIGHT - _TOP - _BOTTOM,
        x=Scale.numeric(p.x for p in view.points),
        y=Scale.numeric(p.y for p in view.points),
        pad=10,
    )
    sx, sy = plot.px, plot.py
    x_title = f"{view.mode(view.x)} {view.x}{plot.x.describe()}"
    y_title = f"{view.mode(view.y)} {view.y}{plot.y.describe()}"
    parts = [
        svg_open("pareto", WIDTH, HEIGHT, title),
        plot.axes(x_title, y_title, title_y=HEIGHT - 18),
    ]
    parts.extend(_points(view, sx, sy))
    parts.append(_step_line(view, sx, sy))
    parts.extend(_front_points(view, sx, sy))
    parts.append(_legend(view))
    parts.append("</svg>")
    return "".join(parts)


def _tip(view: ParetoView, p: Point) -> str:
    rank = "no rank" if p.pareto_rank is None else f"Pareto rank {p.pareto_rank}"
    feasible = "" if p.feasible is None else ("; feasible" if p.feasible else "; infeasible")
    return (
        f"<title>{escape(p.trial_id)}: {escape(view.x)} {number_label(p.x)}, {escape(view.y)} "
        f"{number_label(p.y)} ({rank}{feasible})</title>"
    )


def _points(view: ParetoView, sx: Pixel, sy: Pixel) -> list[str]:
    """The trials off the front: faded dots, infeasible ones as crosses."""
    parts = ['<g class="dominated" fill-opacity="0.35" stroke-width="1.5">']
    for p in view.points:
        if p.on_front:
            continue
        x, y = sx(p.x), sy(p.y)
        trial = escape(p.trial_id)
        if p.feasible is False:
            parts.append(
                f'<path class="point infeasible" data-trial="{trial}" d="M{x - 4} {y - 4}L{x + 4} '
                f'{y + 4}M{x - 4} {y + 4}L{x + 4} {y - 4}" stroke="{INFEASIBLE_COLOR}" '
                f'stroke-opacity="0.8">{_tip(view, p)}</path>'
            )
        else:
            parts.append(
                f'<circle class="point dominated" data-trial="{trial}" cx="{x}" cy="{y}" r="3.5" '
                f'fill="{DOMINATED_COLOR}">{_tip(view, p)}</circle>'
            )
    parts.append("</g>")
    return parts


def _step_line(view: ParetoView, sx: Pixel, sy: Pixel) -> str:
    """The front as a staircase: between neighbours, through the corner of the worse of each
    metric, so the line bounds the region the front dominates."""
    if not view.step:
        return ""
    x_min, y_min = view.mode(view.x) == "min", view.mode(view.y) == "min"
    corners = [(view.step[0].x, view.step[0].y)]
    for a, b in zip(view.step, view.step[1:], strict=False):
        worse_x = max(a.x, b.x) if x_min else min(a.x, b.x)
        worse_y = max(a.y, b.y) if y_min else min(a.y, b.y)
        corners += [(worse_x, worse_y), (b.x, b.y)]
    points = " ".join(f"{sx(cx)},{sy(cy)}" for cx, cy in corners)
    return (
        f'<polyline class="front-step" fill="none" stroke="{ACCENT}" stroke-width="2" '
        f'points="{points}"/>'
    )


def _front_points(view: ParetoView, sx: Pixel, sy: Pixel) -> list[str]:
    parts = [f'<g class="front" fill="{ACCENT}" stroke="currentColor" stroke-width="0.8">']
    for p in view.points:
        if p.on_front:
            parts.append(
                f'<circle class="point front" data-trial="{escape(p.trial_id)}" cx="{sx(p.x)}" '
                f'cy="{sy(p.y)}" r="5">{_tip(view, p)}</circle>'
            )
    parts.append("</g>")
    picked = next((p for p in view.points if p.trial_id == view.picked), None)
    if picked is not None:
        x, y = sx(picked.x), sy(picked.y)
        anchor = "end" if x > WIDTH - 200 else "start"
        dx = -12 if anchor == "end" else 12
        parts.append(
            f'<g class="picked" data-trial="{escape(picked.trial_id)}"><circle cx="{x}" '
            f'cy="{y}" r="9" fill="none" stroke="currentColor" stroke-width="2"/>'
            f'<text x="{x + dx}" y="{y - 10}" text-anchor="{anchor}" font-size="12" '
            f'font-weight="600">picked: {escape(short(picked.trial_id, 32))}</text></g>'
        )
    return parts


def _legend(view: ParetoView) -> str:
    y = 18
    parts = [
        '<g class="legend" font-size="11">',
        f'<line x1="{_LEFT}" x2="{_LEFT + 22}" y1="{y}" y2="{y}" stroke="{ACCENT}" '
        f'stroke-width="2"/><circle cx="{_LEFT + 11}" cy="{y}" r="4" fill="{ACCENT}"/>'
        f'<text x="{_LEFT + 28}" y="{y + 4}">front ({sum(p.on_front for p in view.points)})</text>',
        f'<circle cx="{_LEFT + 130}" cy="{y}" r="3.5" fill="{DOMINATED_COLOR}" '
        f'fill-opacity="0.35"/><text x="{_LEFT + 138}" y="{y + 4}">dominated</text>',
    ]
    if view.constrained:
        x = _LEFT + 230
        parts.append(
            f'<path d="M{x - 4} {y - 4}L{x + 4} {y + 4}M{x - 4} {y + 4}L{x + 4} {y - 4}" '
            f'stroke="{INFEASIBLE_COLOR}" stroke-width="1.5"/>'
            f'<text x="{x + 9}" y="{y + 4}">infeasible</text>'
        )
    if view.left_out:
        parts.append(
            f'<text x="{WIDTH - _RIGHT}" y="{y + 4}" text-anchor="end" fill-opacity="0.75">'
            f"{view.left_out} trial(s) without both values not shown</text>"
        )
    parts.append("</g>")
    return "".join(parts)
