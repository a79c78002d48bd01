"""ASHA's (HyperBand's, MOASHA's) rungs of one bracket as SVG: one column per rung, each trial's
value there, and the rung's cutoff."""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence
from html import escape
from typing import Protocol

from airflow_trials.core.scheduler import format_number
from airflow_trials.plugins.charts.kit import BEST_COLOR, Plot, category, empty_svg, svg_open
from airflow_trials.plugins.datamodels.chart_scale import Scale
from airflow_trials.plugins.datamodels.scheduler_steps import AT_END
from airflow_trials.plugins.web.render import Links
from airflow_trials.store.run_decisions import RunRung

WIDTH, HEIGHT = 860, 320
_LEFT, _RIGHT, _TOP, _BOTTOM = 70, 20, 34, 45
STOP_COLOR = BEST_COLOR
CONTINUE_COLOR = "#4e79a7"
CUTOFF_COLOR = "#f28e2b"
AT_END_COLOR = "#8a96a3"  # grey in both modes (a dot's link would make currentColor the link's)


class Rung(Protocol):
    """What the chart reads of a rung's summary (``decisions.RungSummary``)."""

    @property
    def milestone(self) -> float: ...
    @property
    def cutoff(self) -> float | None: ...
    @property
    def cutoff_low(self) -> float | None: ...
    @property
    def cutoff_high(self) -> float | None: ...


def rungs_svg(
    rungs: Sequence[Rung],
    records: Sequence[RunRung],
    *,
    metric: str,
    title: str,
    links: Links,
) -> str:
    """An ``<svg>``: one column per rung (x: its milestone), each trial's value there as a dot
    (red: stopped there; hollow: recorded at its end), and the rung's latest cutoff as an orange
    tick across the column (a faint band from its lowest to its highest cutoff)."""
    shown = [r for r in records if math.isfinite(r.value)]
    cutoffs = [
        c
        for s in rungs
        for c in (s.cutoff_low, s.cutoff_high)
        if c is not None and math.isfinite(c)
    ]
    values = [r.value for r in shown] + cutoffs
    if not rungs or not values:
        message = f"No finite {metric} recorded at a rung."
        return empty_svg("curves rungs-chart", WIDTH, HEIGHT, title, message)
    plot = _rung_plot(rungs, values)
    milestones = [(plot.px(s.milestone), format_number(s.milestone)) for s in rungs]
    parts = [
        svg_open("curves rungs-chart", WIDTH, HEIGHT, title),
        plot.axes(
            "rung (milestone)",
            metric,
            x_ticks=milestones,
            tick_class="milestone",
            title_y=HEIGHT - 8,
        ),
    ]
    slot = plot.width / len(rungs)
    parts.extend(_points(plot, shown, metric, slot, links))
    parts.extend(_cutoffs(plot, rungs, slot))
    parts.append(_legend())
    parts.append("</svg>")
    return "".join(parts)


def _rung_plot(rungs: Sequence[Rung], values: list[float]) -> Plot:
    """Columns for the rungs, in order; the values' range, widened a little."""
    low, high = min(values), max(values)
    if high == low:
        low, high = low - 0.5, high + 0.5
    pad = (high - low) * 0.04
    return Plot(
        _LEFT,
        _TOP,
        WIDTH - _LEFT - _RIGHT,
        HEIGHT - _TOP - _BOTTOM,
        x=Scale("categorical", categories=tuple(category(s.milestone) for s in rungs)),
        y=Scale.linear(low - pad, high + pad, tick_count=5),
    )


def _points(plot: Plot, shown: list[RunRung], metric: str, slot: float, links: Links) -> list[str]:
    """A dot per trial and rung, each trial at the same place in every column."""
    spread = slot * 0.34
    parts = []
    # Stopped trials last: on top of the many that went on.
    for r in sorted(shown, key=lambda r: (r.stopped, not r.at_end)):
        offset = (zlib.crc32(r.trial_id.encode()) % 1000 / 999 - 0.5) * 2 * spread
        x, y = plot.px(r.milestone) + offset, plot.py(r.value)
        kind = "stopped" if r.stopped else "at-end" if r.at_end else "continued"
        verdict = AT_END if r.at_end else r.decision.value
        tip = f"{r.trial_id}: {metric} {r.value:.6g} at milestone {format_number(r.milestone)}"
        tip += f" ({verdict})" + (f": {r.reason}" if r.stopped and r.reason else "")
        if r.stopped:
            shape = f'fill="{STOP_COLOR}" r="3.2"'
        elif r.at_end:
            shape = f'fill="none" stroke="{AT_END_COLOR}" r="2.6"'
        else:
            shape = f'fill="{CONTINUE_COLOR}" fill-opacity="0.55" r="2.4"'
        parts.append(
            f'<a href="{escape(links.trial(r.trial_id))}"><circle class="rung-point {kind}" '
            f'data-trial="{escape(r.trial_id)}" cx="{x:.1f}" cy="{y:.1f}" {shape}>'
            f"<title>{escape(tip)}</title></circle></a>"
        )
    return parts


def _cutoffs(plot: Plot, rungs: Sequence[Rung], slot: float) -> list[str]:
    """Each rung's latest cutoff across its column, over the band of all its cutoffs."""
    parts = []
    for s in rungs:
        if s.cutoff is None or not math.isfinite(s.cutoff):
            continue
        x = plot.px(s.milestone)
        if s.cutoff_low is not None and s.cutoff_high is not None and s.cutoff_high > s.cutoff_low:
            top, bottom = plot.py(s.cutoff_high), plot.py(s.cutoff_low)
            parts.append(
                f'<rect class="cutoff-range" x="{x - slot * 0.42:.1f}" y="{top:.1f}" '
                f'width="{slot * 0.84:.1f}" height="{bottom - top:.1f}" fill="{CUTOFF_COLOR}" '
                'fill-opacity="0.12"/>'
            )
        y = plot.py(s.cutoff)
        parts.append(
            f'<line class="cutoff" data-milestone="{escape(format_number(s.milestone))}" '
            f'x1="{x - slot * 0.42:.1f}" x2="{x + slot * 0.42:.1f}" y1="{y:.1f}" y2="{y:.1f}" '
            f'stroke="{CUTOFF_COLOR}" stroke-width="2.5"><title>cutoff at milestone '
            f"{escape(format_number(s.milestone))}: {s.cutoff:.4g} (latest recorded)</title></line>"
        )
    return parts


def _legend() -> str:
    legend = [
        (f'<circle r="3" fill="{CONTINUE_COLOR}"/>', "continued"),
        (f'<circle r="3.2" fill="{STOP_COLOR}"/>', "stopped"),
        (f'<circle r="2.6" fill="none" stroke="{AT_END_COLOR}"/>', "recorded at end"),
        (f'<line x1="-7" x2="7" stroke="{CUTOFF_COLOR}" stroke-width="2.5"/>', "cutoff"),
    ]
    parts = ['<g class="legend" font-size="12">']
    x = _LEFT + 4
    for mark, label in legend:
        parts.append(
            f'<g transform="translate({x},14)">{mark}<text x="10" y="4">{label}</text></g>'
        )
        x += 28 + 7 * len(label)
    parts.append("</g>")
    return "".join(parts)
