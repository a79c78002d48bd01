"""A run's scheduler decisions on the dashboard: ASHA's (HyperBand's, MOASHA's) rungs, their
cutoffs and the trials they stopped, and PBT's graph of who copied whom; the views of the page
(``routes/decisions.py``), drawn by ``charts/rungs_chart.py`` and ``charts/lineage_chart.py``.

Each view is one store read for the whole run (:mod:`~airflow_trials.store.run_decisions`).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from markupsafe import Markup

from airflow_trials.plugins.charts.lineage_chart import lineage_svg, natural
from airflow_trials.plugins.charts.rungs_chart import rungs_svg
from airflow_trials.plugins.datamodels.scheduler_steps import ConfigChange, config_changes
from airflow_trials.plugins.web import reads
from airflow_trials.plugins.web.render import Links
from airflow_trials.store import ExperimentRunRecord, TrialReader
from airflow_trials.store.run_decisions import RunExploit, RunRung

#: The lineage graph draws at most this many trials: those in the most exploits.
LINEAGE_TRIALS_SHOWN = 60
#: The page lists the newest exploits; the JSON has all of them.
EXPLOITS_LISTED = 50


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
    shown = sorted(top, key=natural)
    kept = set(shown)
    drawn = [e for e in edges if e.exploit.trial_id in kept and e.exploit.donor_trial_id in kept]
    chart = lineage_svg(shown, drawn, links)
    return LineageView(edges, len(counts), shown, len(drawn), Markup(chart))


# -- the page's metric and the JSON's models ---------------------------------------------------


def rung_metric(store: TrialReader, run: ExperimentRunRecord) -> tuple[str, list[str] | None]:
    """The name of the rungs' value, the experiment's metric (its first of several), and its
    several metrics (None with one)."""
    goal = reads.run_goal(store, run)
    return goal.metric or "value", list(goal.metrics) if goal.several else None
