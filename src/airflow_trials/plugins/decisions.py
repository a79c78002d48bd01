"""A run's scheduler decisions on the dashboard: ASHA's (HyperBand's, MOASHA's) rungs, their
cutoffs and the trials they stopped, and PBT's graph of who copied whom; a page and its JSON.

Each view is one store read for the whole run (:mod:`~airflow_trials.store.run_decisions`), drawn
as server-rendered SVG like :mod:`~airflow_trials.plugins.svg`'s charts: no script, text and axes in
``currentColor``, every label escaped.
"""

from __future__ import annotations

import math
import re
import zlib
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape
from typing import Any

from markupsafe import Markup

from airflow_trials.core.scheduler import format_number
from airflow_trials.plugins import reads
from airflow_trials.plugins.queries import AT_END, ConfigChange, config_changes
from airflow_trials.plugins.render import Links, utc
from airflow_trials.plugins.svg import BEST_COLOR, WIDTH, nice_ticks
from airflow_trials.store import ExperimentRunRecord, TrialReader
from airflow_trials.store.run_decisions import RunExploit, RunRung

#: The lineage graph draws at most this many trials: those in the most exploits.
LINEAGE_TRIALS_SHOWN = 60
#: The page lists the newest exploits; the JSON has all of them.
EXPLOITS_LISTED = 50

STOP_COLOR = BEST_COLOR
CONTINUE_COLOR = "#4e79a7"
CUTOFF_COLOR = "#f28e2b"
AT_END_COLOR = "#8a96a3"  # grey in both modes (a dot's link would make currentColor the link's)
_DONOR_COLORS = ("#4e79a7", "#59a14f", "#9c755f", "#b07aa1", "#76b7b2", "#edc948", "#ff9da7")

# What ASHA's stop reason ends with (core/rung_math.py rung_stop_reason): "... the rung's cutoff
# 0.55". The cutoff is not a column of its own, so a rung's is read back from its STOP verdicts.
_CUTOFF = re.compile(r"the rung's cutoff (\S+)$")


def recorded_cutoff(reason: str | None) -> float | None:
    """The cutoff an ASHA stop reason names (to the 4 significant digits it is written with), or
    None: a CONTINUE, MOASHA's rank score, or a reason without one."""
    found = _CUTOFF.search(reason or "")
    if found is None:
        return None
    try:
        cutoff = float(found.group(1))
    except ValueError:
        return None
    return cutoff if math.isfinite(cutoff) else None


# -- ASHA's rungs ------------------------------------------------------------------------------


@dataclass(frozen=True)
class RungSummary:
    """One rung of one bracket: what its trials got there.

    :param reached: trials with a value recorded at the rung (those recorded at their end too).
    :param continued: verdicts that let the trial go on.
    :param stopped: verdicts that stopped it.
    :param at_end: values recorded when the trial ended (not acted on).
    :param cutoff: the cutoff of the rung's latest STOP verdict, as its reason records it; None
        when the rung stopped nobody (or the scheduler records no cutoff: MOASHA).
    :param cutoff_low: the lowest cutoff its verdicts recorded; ``cutoff_high`` the highest.
    """

    bracket: int
    milestone: float
    reached: int
    continued: int
    stopped: int
    at_end: int
    cutoff: float | None
    cutoff_low: float | None
    cutoff_high: float | None


@dataclass(frozen=True)
class BracketView:
    """A bracket's rungs, lowest milestone first, the records at them, and its chart."""

    bracket: int
    rungs: list[RungSummary]
    records: list[RunRung]
    chart: Markup


@dataclass(frozen=True)
class RungsView:
    """A run's rungs: one :class:`BracketView` per bracket (one with ASHA).

    :param metric: the value's name: the experiment's metric; MOASHA's first metric.
    :param vector: MOASHA's rungs (metric vectors; the chart shows the first metric).
    :param trials: trials judged at a rung; ``stopped_trials`` those a rung stopped.
    """

    brackets: list[BracketView]
    metric: str
    vector: bool
    trials: int
    stopped_trials: int


def rung_summaries(records: Sequence[RunRung]) -> list[RungSummary]:
    """One summary per (bracket, milestone), in that order; ``records`` in the order recorded."""
    by_rung: dict[tuple[int, float], list[RunRung]] = {}
    for record in records:
        by_rung.setdefault((record.bracket, record.milestone), []).append(record)
    summaries = []
    for (bracket, milestone), rung in sorted(by_rung.items()):
        cutoffs = [
            c for c in (recorded_cutoff(r.reason) for r in rung if r.stopped) if c is not None
        ]
        summaries.append(
            RungSummary(
                bracket=bracket,
                milestone=milestone,
                reached=len(rung),
                continued=sum(not r.at_end and not r.stopped for r in rung),
                stopped=sum(r.stopped for r in rung),
                at_end=sum(r.at_end for r in rung),
                cutoff=cutoffs[-1] if cutoffs else None,
                cutoff_low=min(cutoffs) if cutoffs else None,
                cutoff_high=max(cutoffs) if cutoffs else None,
            )
        )
    return summaries


def rungs_view(records: Sequence[RunRung], metric: str, links: Links) -> RungsView:
    summaries = rung_summaries(records)
    vector = any(r.values is not None for r in records)
    brackets = []
    numbers = sorted({s.bracket for s in summaries})
    for bracket in numbers:
        of_bracket = [r for r in records if r.bracket == bracket]
        rungs = [s for s in summaries if s.bracket == bracket]
        # Numbered from 1, as the scheduler's stop reasons number brackets.
        title = f"{metric} at each rung" + (f", bracket {bracket + 1}" if len(numbers) > 1 else "")
        chart = rungs_svg(rungs, of_bracket, metric=metric, title=title, links=links)
        brackets.append(BracketView(bracket, rungs, of_bracket, Markup(chart)))
    return RungsView(
        brackets=brackets,
        metric=metric,
        vector=vector,
        trials=len({r.trial_id for r in records}),
        stopped_trials=len({r.trial_id for r in records if r.stopped}),
    )


_W, _H = WIDTH, 320
_LEFT, _RIGHT, _TOP, _BOTTOM = 70, 20, 34, 45


def rungs_svg(
    rungs: Sequence[RungSummary],
    records: Sequence[RunRung],
    *,
    metric: str,
    title: str,
    links: Links,
) -> str:
    """An ``<svg>``: one column per rung (x: its milestone), each trial's value there as a dot
    (red: stopped there; hollow: recorded at its end), and the rung's latest cutoff as an orange
    tick across the column (a faint band from its lowest to its highest cutoff)."""
    head = (
        f'<svg xmlns="http://www.w3.org/2000/svg" class="curves rungs-chart" role="img" '
        f'width="{_W}" height="{_H}" viewBox="0 0 {_W} {_H}" fill="currentColor" '
        f'aria-label="{escape(title)}"><title>{escape(title)}</title>'
    )
    shown = [r for r in records if math.isfinite(r.value)]
    cutoffs = [
        c
        for s in rungs
        for c in (s.cutoff_low, s.cutoff_high)
        if c is not None and math.isfinite(c)
    ]
    values = [r.value for r in shown] + cutoffs
    if not rungs or not values:
        return (
            f'{head}<text x="{_W / 2}" y="{_H / 2}" text-anchor="middle" class="empty">'
            f"No finite {escape(metric)} recorded at a rung.</text></svg>"
        )
    low, high = min(values), max(values)
    if high == low:
        low, high = low - 0.5, high + 0.5
    pad = (high - low) * 0.04
    low, high = low - pad, high + pad
    plot_w, plot_h = _W - _LEFT - _RIGHT, _H - _TOP - _BOTTOM
    slot = plot_w / len(rungs)
    column = {s.milestone: i for i, s in enumerate(rungs)}

    def sx(milestone: float) -> float:
        return _LEFT + (column[milestone] + 0.5) * slot

    def sy(value: float) -> float:
        return _TOP + (high - value) / (high - low) * plot_h

    parts = [
        head,
        f'<g class="axes" stroke="currentColor" stroke-opacity="0.55">'
        f'<line x1="{_LEFT}" y1="{_TOP + plot_h}" x2="{_LEFT + plot_w}" y2="{_TOP + plot_h}"/>'
        f'<line x1="{_LEFT}" y1="{_TOP}" x2="{_LEFT}" y2="{_TOP + plot_h}"/></g>',
        '<g class="ticks" font-size="11" fill-opacity="0.8">',
    ]
    for tick in nice_ticks(low, high):
        y = sy(tick)
        parts.append(
            f'<line x1="{_LEFT}" x2="{_LEFT + plot_w}" y1="{y:.1f}" y2="{y:.1f}" class="grid" '
            f'stroke="currentColor" stroke-opacity="0.12"/><text x="{_LEFT - 6}" y="{y + 4:.1f}" '
            f'text-anchor="end">{tick:.4g}</text>'
        )
    for s in rungs:
        parts.append(
            f'<text x="{sx(s.milestone):.1f}" y="{_TOP + plot_h + 16}" text-anchor="middle" '
            f'class="milestone">{escape(format_number(s.milestone))}</text>'
        )
    parts.append(
        f'</g><text x="{_LEFT + plot_w / 2}" y="{_H - 8}" text-anchor="middle" font-size="12">'
        f'rung (milestone)</text><text x="14" y="{_TOP + plot_h / 2}" text-anchor="middle" '
        f'font-size="12" transform="rotate(-90 14 {_TOP + plot_h / 2})">{escape(metric)}</text>'
    )
    spread = slot * 0.34
    # Stopped trials last: on top of the many that went on.
    for r in sorted(shown, key=lambda r: (r.stopped, not r.at_end)):
        # Spread a rung's dots across its column, each trial at the same place in every column.
        offset = (zlib.crc32(r.trial_id.encode()) % 1000 / 999 - 0.5) * 2 * spread
        x, y = sx(r.milestone) + offset, sy(r.value)
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
    for s in rungs:
        if s.cutoff is None or not math.isfinite(s.cutoff):
            continue
        x = sx(s.milestone)
        if s.cutoff_low is not None and s.cutoff_high is not None and s.cutoff_high > s.cutoff_low:
            top, bottom = sy(s.cutoff_high), sy(s.cutoff_low)
            parts.append(
                f'<rect class="cutoff-range" x="{x - slot * 0.42:.1f}" y="{top:.1f}" '
                f'width="{slot * 0.84:.1f}" height="{bottom - top:.1f}" fill="{CUTOFF_COLOR}" '
                'fill-opacity="0.12"/>'
            )
        y = sy(s.cutoff)
        parts.append(
            f'<line class="cutoff" data-milestone="{escape(format_number(s.milestone))}" '
            f'x1="{x - slot * 0.42:.1f}" x2="{x + slot * 0.42:.1f}" y1="{y:.1f}" y2="{y:.1f}" '
            f'stroke="{CUTOFF_COLOR}" stroke-width="2.5"><title>cutoff at milestone '
            f"{escape(format_number(s.milestone))}: {s.cutoff:.4g} (latest recorded)</title></line>"
        )
    legend = [
        (f'<circle r="3" fill="{CONTINUE_COLOR}"/>', "continued"),
        (f'<circle r="3.2" fill="{STOP_COLOR}"/>', "stopped"),
        (f'<circle r="2.6" fill="none" stroke="{AT_END_COLOR}"/>', "recorded at end"),
        (f'<line x1="-7" x2="7" stroke="{CUTOFF_COLOR}" stroke-width="2.5"/>', "cutoff"),
    ]
    parts.append('<g class="legend" font-size="12">')
    x = _LEFT + 4
    for mark, label in legend:
        parts.append(
            f'<g transform="translate({x},14)">{mark}<text x="10" y="4">{label}</text></g>'
        )
        x += 28 + 7 * len(label)
    parts.append("</g></svg>")
    return "".join(parts)


# -- PBT's lineage -----------------------------------------------------------------------------


@dataclass(frozen=True)
class LineageEdge:
    """One exploit and the config keys it changed."""

    exploit: RunExploit
    changes: list[ConfigChange]


@dataclass(frozen=True)
class LineageView:
    """A run's exploits and their graph.

    :param edges: every exploit, oldest first.
    :param trials: trials in an exploit (exploited, or copied).
    :param shown_trials: the graph's rows; all ``trials`` up to :data:`LINEAGE_TRIALS_SHOWN`,
        else those in the most exploits.
    :param shown_exploits: exploits between two shown trials: the graph's arrows.
    """

    edges: list[LineageEdge]
    trials: int
    shown_trials: list[str]
    shown_exploits: int
    chart: Markup

    @property
    def capped(self) -> bool:
        return len(self.shown_trials) < self.trials


def involvement(exploits: Sequence[RunExploit]) -> Counter[str]:
    """Exploits per trial, as the exploited trial or as the donor."""
    counts: Counter[str] = Counter()
    for e in exploits:
        counts[e.trial_id] += 1
        counts[e.donor_trial_id] += 1
    return counts


def lineage_view(
    exploits: Sequence[RunExploit], links: Links, limit: int = LINEAGE_TRIALS_SHOWN
) -> LineageView:
    edges = [
        LineageEdge(e, config_changes(e.old_config, e.new_config, e.operations)) for e in exploits
    ]
    counts = involvement(exploits)
    top = sorted(counts, key=lambda t: (-counts[t], t))[:limit]
    shown = sorted(top, key=_natural)
    kept = set(shown)
    drawn = [e for e in edges if e.exploit.trial_id in kept and e.exploit.donor_trial_id in kept]
    chart = lineage_svg(shown, drawn, links)
    return LineageView(edges, len(counts), shown, len(drawn), Markup(chart))


def _natural(trial_id: str) -> list[Any]:
    """``t-2`` before ``t-10``."""
    return [(0, int(p)) if p.isdigit() else (1, p) for p in re.split(r"(\d+)", trial_id) if p]


_ROW = 16
_LABEL_W = 150


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


def lineage_svg(trials: Sequence[str], edges: Sequence[LineageEdge], links: Links) -> str:
    """An ``<svg>`` timeline: one row per trial, an arrow from the donor's row to the exploited
    trial's at the exploit's iteration (x), titled with who copied whom, when, and the config
    changes; exploits at one iteration fan out a little so each stays visible."""
    height = _TOP + len(trials) * _ROW + _BOTTOM
    title = "PBT lineage: who copied whom, at which iteration"
    head = (
        f'<svg xmlns="http://www.w3.org/2000/svg" class="curves lineage-chart" role="img" '
        f'width="{_W}" height="{height}" viewBox="0 0 {_W} {height}" fill="currentColor" '
        f'aria-label="{escape(title)}"><title>{escape(title)}</title>'
    )
    if not edges:
        return (
            f'{head}<text x="{_W / 2}" y="{height / 2}" text-anchor="middle" class="empty">'
            "No exploit between the trials shown.</text></svg>"
        )
    row = {trial_id: i for i, trial_id in enumerate(trials)}
    iterations = sorted({e.exploit.iteration for e in edges})
    low, high = 0, max(iterations)
    if high == low:
        high = low + 1
    left = _LEFT + _LABEL_W - 50
    plot_w = _W - left - _RIGHT - 10
    plot_h = len(trials) * _ROW

    def sx(iteration: float) -> float:
        return left + (iteration - low) / (high - low) * plot_w

    def sy(trial_id: str) -> float:
        return _TOP + (row[trial_id] + 0.5) * _ROW

    gaps = [b - a for a, b in zip([low, *iterations], iterations, strict=False) if b > a]
    # Half the width the arrows of one iteration fan out over: 2.5 px apart, within 40% of the
    # space to the next iteration.
    room = (min(gaps) / (high - low) * plot_w) * 0.4 if gaps else 14.0
    parts = [
        head,
        '<defs><marker id="lineage-arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="6" '
        'markerHeight="6" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" '
        'fill="currentColor"/></marker></defs>',
        '<g class="rows" font-size="11">',
    ]
    for trial_id in trials:
        y = sy(trial_id)
        label = trial_id if len(trial_id) <= 22 else trial_id[:21] + "…"
        parts.append(
            f'<line x1="{left}" x2="{left + plot_w}" y1="{y:.1f}" y2="{y:.1f}" '
            'stroke="currentColor" stroke-opacity="0.12"/>'
            f'<a href="{escape(links.trial(trial_id))}"><text class="trial-label" '
            f'data-trial="{escape(trial_id)}" x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">'
            f"<title>{escape(trial_id)}</title>{escape(label)}</text></a>"
        )
    parts.append("</g>")
    parts.append('<g class="ticks" font-size="11" fill-opacity="0.8">')
    for tick in nice_ticks(low, high):
        if tick != int(tick):
            continue
        x = sx(tick)
        parts.append(
            f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{_TOP}" y2="{_TOP + plot_h}" '
            'stroke="currentColor" stroke-opacity="0.08"/>'
            f'<text x="{x:.1f}" y="{_TOP + plot_h + 16}" text-anchor="middle">{int(tick)}</text>'
        )
    parts.append(
        f'</g><text x="{left + plot_w / 2}" y="{height - 8}" text-anchor="middle" font-size="12">'
        "training_iteration of the donor's checkpoint</text>"
    )
    donors = sorted({e.exploit.donor_trial_id for e in edges}, key=_natural)
    color = {d: _DONOR_COLORS[i % len(_DONOR_COLORS)] for i, d in enumerate(donors)}
    at_iteration: Counter[int] = Counter(e.exploit.iteration for e in edges)
    placed: Counter[int] = Counter()
    parts.append('<g class="exploits">')
    for edge in edges:
        e = edge.exploit
        count, index = at_iteration[e.iteration], placed[e.iteration]
        placed[e.iteration] += 1
        fan = min(room, max(7.0, 1.25 * count))
        offset = 0.0 if count == 1 else (index / (count - 1) - 0.5) * 2 * fan
        x = sx(e.iteration) + offset
        y1, y2 = sy(e.donor_trial_id), sy(e.trial_id)
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
    parts.append("</g></svg>")
    return "".join(parts)


# -- the page's metric and the JSON's models ---------------------------------------------------


def rung_metric(store: TrialReader, run: ExperimentRunRecord) -> tuple[str, list[str] | None]:
    """The name of the rungs' value, the experiment's metric (its first of several), and its
    several metrics (None with one)."""
    goal = reads.run_goal(store, run)
    return goal.metric or "value", list(goal.metrics) if goal.several else None
