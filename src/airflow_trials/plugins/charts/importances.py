"""Hyperparameter importances as SVG: a horizontal bar per parameter, most important on top."""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

from airflow_trials.plugins.charts.kit import PALETTE, Plot, empty_svg, nice_ticks, svg_open
from airflow_trials.plugins.datamodels.chart_scale import Scale

WIDTH = 860
IMPORTANCE_ROW = 26
_LABEL_CHARS = 36  # longer names are cut (the bar's tooltip has the whole name)


def importances_svg(importances: Sequence[tuple[str, float]], *, title: str) -> str:
    """An ``<svg>`` bar chart of hyperparameter importances: one bar per parameter, sorted
    descending (most important on top), its share printed at the bar's end.

    :param importances: (parameter, share) pairs; shares are 0 to 1 and need not be sorted.
    :param title: the chart's accessible title.
    """
    rows = sorted(importances, key=lambda row: (-row[1], row[0]))
    label_chars = min(max((len(name) for name, _ in rows), default=8), _LABEL_CHARS)
    # About 7 px per character at 12 px: the labels' column, right-aligned against the bars.
    left = max(80, 7 * label_chars + 16)
    top, bottom = 14, 40
    height = top + IMPORTANCE_ROW * max(len(rows), 1) + bottom
    if not rows:
        return empty_svg("importances", WIDTH, height, title, "No hyperparameter to rank.")
    plot = _share_plot(left, top, IMPORTANCE_ROW * len(rows), max(share for _, share in rows))
    parts = [svg_open("importances", WIDTH, height, title), *_share_axis(plot, height)]
    for index, (name, share) in enumerate(rows):
        y = top + index * IMPORTANCE_ROW
        shown = name if len(name) <= label_chars else name[: label_chars - 1] + "…"
        width = max(plot.px(share) - left, 0.0)
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


def _share_plot(left: float, top: float, height: float, high: float) -> Plot:
    """The bars' plot area: x from 0 to the tick after the longest bar (so it ends inside the
    grid)."""
    ticks = nice_ticks(0.0, high if high > 0 else 1.0, count=5)
    if ticks[-1] < high:
        ticks.append(round(2 * ticks[-1] - ticks[-2], 12))
    width = WIDTH - left - 64
    return Plot(left, top, width, height, x=Scale.linear(0.0, ticks[-1], 5), y=Scale.linear(0, 1))


def _share_axis(plot: Plot, height: float) -> list[str]:
    """The share's grid and ticks (vertical: the bars' value axis is x), the parameters' axis."""
    parts = ['<g class="ticks" font-size="11" fill-opacity="0.8">']
    for fraction, label in plot.x.ticks():
        x = plot.x_fraction(fraction)
        parts.append(
            f'<line x1="{x}" x2="{x}" y1="{plot.top}" y2="{plot.bottom}" class="grid" '
            'stroke="currentColor" stroke-opacity="0.12"/>'
            f'<text x="{x}" y="{plot.bottom + 16}" text-anchor="middle">{label}</text>'
        )
    parts.append(
        f'</g><line class="axis" x1="{plot.left}" x2="{plot.left}" y1="{plot.top}" '
        f'y2="{plot.bottom}" stroke="currentColor" stroke-opacity="0.55"/>'
        f'<text x="{plot.left + plot.width / 2}" y="{height - 6}" text-anchor="middle" '
        'font-size="12">importance (share of the total)</text>'
    )
    return parts


def _share_label(share: float) -> str:
    """A share as the bar's end shows it: 3 decimals, 2 significant digits below 0.01 (0.0036,
    not 0.004; 0.0002, not 0.000), and "<0.0001" below that."""
    if share >= 0.01 or share == 0:
        return f"{share:.3f}"
    return f"{share:.2g}" if share >= 0.0001 else "<0.0001"
