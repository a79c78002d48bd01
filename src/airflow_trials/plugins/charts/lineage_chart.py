"""PBT's lineage as SVG: one row per trial, an arrow from the donor's row to the exploited
trial's at the iteration of the donor's checkpoint."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from html import escape
from typing import Any, Protocol

from airflow_trials.plugins.charts.kit import Plot, empty_svg, nice_ticks, svg_open
from airflow_trials.plugins.datamodels.chart_scale import Scale
from airflow_trials.plugins.datamodels.scheduler_steps import ConfigChange
from airflow_trials.plugins.web.render import Links, utc
from airflow_trials.store.run_decisions import RunExploit

WIDTH = 860
_LEFT, _RIGHT, _TOP, _BOTTOM = 70, 20, 34, 45
_ROW = 16
_LABEL_W = 150
_DONOR_COLORS = ("#4e79a7", "#59a14f", "#9c755f", "#b07aa1", "#76b7b2", "#edc948", "#ff9da7")


class Edge(Protocol):
    """What the chart reads of an exploit (``decisions.LineageEdge``)."""

    @property
    def exploit(self) -> RunExploit: ...
    @property
    def changes(self) -> Sequence[ConfigChange]: ...


def natural(trial_id: str) -> list[Any]:
    """``t-2`` before ``t-10``."""
    return [(0, int(p)) if p.isdigit() else (1, p) for p in re.split(r"(\d+)", trial_id) if p]


def change_text(changes: Sequence[ConfigChange]) -> str:
    """``lr 0.01 → 0.012 (0.01 * 1.2); layers 2 → 3`` (``no config change`` when none)."""
    if not changes:
        return "no config change"
    return "; ".join(
        f"{c.key} {_short(c.old)} → {_short(c.new)}" + (f" ({c.operation})" if c.operation else "")
        for c in changes
    )


def _short(value: Any) -> str:
    if value is None:
        return "-"
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def lineage_svg(trials: Sequence[str], edges: Sequence[Edge], links: Links) -> str:
    """An ``<svg>`` timeline: one row per trial, an arrow from the donor's row to the exploited
    trial's at the exploit's iteration (x), titled with who copied whom, when, and the config
    changes; exploits at one iteration fan out a little so each stays visible."""
    height = _TOP + len(trials) * _ROW + _BOTTOM
    title = "PBT lineage: who copied whom, at which iteration"
    css = "curves lineage-chart"
    if not edges:
        return empty_svg(css, WIDTH, height, title, "No exploit between the trials shown.")
    iterations = sorted({e.exploit.iteration for e in edges})
    high = max(iterations) or 1
    left = _LEFT + _LABEL_W - 50
    plot = Plot(
        left,
        _TOP,
        WIDTH - left - _RIGHT - 10,
        len(trials) * _ROW,
        x=Scale.linear(0, high),
        y=Scale.linear(0, 1),
    )
    parts = [
        svg_open(css, WIDTH, height, title),
        '<defs><marker id="lineage-arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="6" '
        'markerHeight="6" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" '
        'fill="currentColor"/></marker></defs>',
        *_rows(plot, trials, links),
        *_iteration_axis(plot, height),
        *_arrows(plot, trials, edges, iterations),
    ]
    parts.append("</svg>")
    return "".join(parts)


def _row_y(plot: Plot, row: int) -> float:
    return plot.top + (row + 0.5) * _ROW


def _rows(plot: Plot, trials: Sequence[str], links: Links) -> list[str]:
    """A faint line and a linked label per trial."""
    parts = ['<g class="rows" font-size="11">']
    right = plot.left + plot.width
    for row, trial_id in enumerate(trials):
        y = _row_y(plot, row)
        label = trial_id if len(trial_id) <= 22 else trial_id[:21] + "…"
        parts.append(
            f'<line x1="{plot.left}" x2="{right}" y1="{y:.1f}" y2="{y:.1f}" '
            'stroke="currentColor" stroke-opacity="0.12"/>'
            f'<a href="{escape(links.trial(trial_id))}"><text class="trial-label" '
            f'data-trial="{escape(trial_id)}" x="{plot.left - 6}" y="{y + 4:.1f}" '
            f'text-anchor="end"><title>{escape(trial_id)}</title>{escape(label)}</text></a>'
        )
    parts.append("</g>")
    return parts


def _iteration_axis(plot: Plot, height: float) -> list[str]:
    """Whole iterations: a faint vertical line and a label each; the axis's title."""
    parts = ['<g class="ticks" font-size="11" fill-opacity="0.8">']
    for tick in nice_ticks(plot.x.low, plot.x.high):
        if tick != int(tick):
            continue
        x = plot.px(tick)
        parts.append(
            f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{plot.top}" y2="{plot.bottom}" '
            'stroke="currentColor" stroke-opacity="0.08"/>'
            f'<text x="{x:.1f}" y="{plot.bottom + 16}" text-anchor="middle">{int(tick)}</text>'
        )
    parts.append(
        f'</g><text x="{plot.left + plot.width / 2}" y="{height - 8}" text-anchor="middle" '
        'font-size="12">training_iteration of the donor\'s checkpoint</text>'
    )
    return parts


def _arrows(
    plot: Plot, trials: Sequence[str], edges: Sequence[Edge], iterations: list[int]
) -> list[str]:
    """One arrow per exploit, coloured by donor; arrows at one iteration fan out."""
    row = {trial_id: i for i, trial_id in enumerate(trials)}
    gaps = [b - a for a, b in zip([0, *iterations], iterations, strict=False) if b > a]
    # Half the width the arrows of one iteration fan out over: 2.5 px apart, within 40% of the
    # space to the next iteration.
    room = (min(gaps) / plot.x.high * plot.width) * 0.4 if gaps else 14.0
    donors = sorted({e.exploit.donor_trial_id for e in edges}, key=natural)
    color = {d: _DONOR_COLORS[i % len(_DONOR_COLORS)] for i, d in enumerate(donors)}
    at_iteration: Counter[int] = Counter(e.exploit.iteration for e in edges)
    placed: Counter[int] = Counter()
    parts = ['<g class="exploits">']
    for edge in edges:
        e = edge.exploit
        count, index = at_iteration[e.iteration], placed[e.iteration]
        placed[e.iteration] += 1
        fan = min(room, max(7.0, 1.25 * count))
        offset = 0.0 if count == 1 else (index / (count - 1) - 0.5) * 2 * fan
        x = plot.px(e.iteration) + offset
        y1, y2 = _row_y(plot, row[e.donor_trial_id]), _row_y(plot, row[e.trial_id])
        # Stop the arrowhead at the row, not past it.
        y2 -= 3 if y2 > y1 else -3
        tip = (
            f"{e.trial_id} copied {e.donor_trial_id}'s checkpoint at iteration {e.iteration} "
            f"({utc(e.created_at)} UTC): {change_text(edge.changes)}"
        )
        parts.append(
            f'<g class="exploit" data-trial="{escape(e.trial_id)}" '
            f'data-donor="{escape(e.donor_trial_id)}" data-iteration="{e.iteration}">'
            f"<title>{escape(tip)}</title>"
            f'<circle cx="{x:.1f}" cy="{y1:.1f}" r="2.5" fill="{color[e.donor_trial_id]}"/>'
            f'<line x1="{x:.1f}" y1="{y1:.1f}" x2="{x:.1f}" y2="{y2:.1f}" '
            f'stroke="{color[e.donor_trial_id]}" stroke-width="1.4" '
            'marker-end="url(#lineage-arrow)"/></g>'
        )
    parts.append("</g>")
    return parts
