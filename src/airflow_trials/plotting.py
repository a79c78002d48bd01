"""Learning curves: every trial's metric per iteration on one chart, the best trial highlighted.

:func:`learning_curves` builds the chart's series once (what is drawn, in which order and colour);
the dashboard's SVG (``plugins/charts``) and the CLI's PNG (:func:`plot_learning_curves`, with
matplotlib) both draw them, as Optuna's matplotlib backend reuses ``_get_pareto_front_info``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

Curve = Sequence[tuple[int, float]]

PALETTE = ("#4e79a7", "#59a14f", "#9c755f", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7", "#bab0ac")
BEST_COLOR = "#e15759"


@dataclass(frozen=True)
class CurveSeries:
    """One trial's line: its finite (iteration, value) points, its colour, whether it is best."""

    trial_id: str
    points: list[tuple[int, float]]
    color: str
    best: bool


@dataclass(frozen=True)
class LearningCurves:
    """The chart's data, whatever draws it.

    :param series: the lines in drawing order (the best last, on top); trials without a finite
        value are left out.
    :param best_trial_id: the best trial when it is among the curves (the legend names it), else
        None.
    :param has_points: whether any trial has a finite value (else the chart says there is none).
    """

    metric: str
    title: str
    series: list[CurveSeries]
    best_trial_id: str | None
    has_points: bool


def learning_curves(
    curves: Mapping[str, Curve],
    *,
    metric: str,
    best_trial_id: str | None = None,
    title: str | None = None,
) -> LearningCurves:
    """The series of ``curves`` (trial id -> [(iteration, value)]): the others by trial id, each
    in the palette's next colour, then the best trial, red."""
    shown = best_trial_id if best_trial_id is not None and best_trial_id in curves else None
    ordered = sorted(trial_id for trial_id in curves if trial_id != shown)
    if shown is not None:
        ordered.append(shown)
    series = []
    for index, trial_id in enumerate(ordered):
        points = [(x, y) for x, y in curves[trial_id] if math.isfinite(y)]
        if points:
            best = trial_id == best_trial_id
            color = BEST_COLOR if best else PALETTE[index % len(PALETTE)]
            series.append(CurveSeries(trial_id, points, color, best))
    return LearningCurves(
        metric=metric,
        title=title or f"Learning curves: {metric}",
        series=series,
        best_trial_id=shown,
        has_points=bool(series),
    )


def plot_learning_curves(
    curves: dict[str, list[tuple[int, float]]],
    path: str,
    *,
    metric: str,
    best_trial_id: str | None = None,
    title: str | None = None,
) -> str:
    """Write a PNG of ``curves`` (trial id -> [(iteration, value)]) to ``path``; returns
    ``path``."""
    import matplotlib

    matplotlib.use("Agg")  # no display: render to a file
    import matplotlib.pyplot as plt

    if not curves:
        raise ValueError(f"No results with metric {metric!r} to plot; did the trials report it?")
    chart = learning_curves(curves, metric=metric, best_trial_id=best_trial_id, title=title)
    figure, axes = plt.subplots(figsize=(9, 5.5), dpi=110)
    try:
        for line in chart.series:
            xs, ys = zip(*line.points, strict=True)
            axes.plot(
                xs,
                ys,
                linewidth=2.6 if line.best else 1.0,
                alpha=1.0 if line.best else 0.55,
                color=line.color,
                label=f"{line.trial_id} (best)" if line.best else line.trial_id,
                zorder=3 if line.best else 2,
            )
        axes.set_xlabel("training_iteration")
        axes.set_ylabel(metric)
        axes.set_title(chart.title)
        axes.grid(alpha=0.3)
        if len(curves) <= 12:
            axes.legend(fontsize=8)
        figure.tight_layout()
        figure.savefig(path, format="png")
    finally:
        plt.close(figure)
    return path


def curves_from_results(
    results: dict[str, list[dict[str, Any]]], metric: str
) -> dict[str, list[tuple[int, float]]]:
    """(iteration, value) pairs of ``metric`` per trial, skipping results without a number."""
    curves: dict[str, list[tuple[int, float]]] = {}
    for trial_id, rows in results.items():
        points = [
            (int(r["training_iteration"]), float(r[metric]))
            for r in rows
            if isinstance(r.get(metric), (int, float)) and not isinstance(r.get(metric), bool)
        ]
        curves[trial_id] = points
    return curves
