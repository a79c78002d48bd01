"""Learning curves: every trial's metric per iteration on one chart, the best trial highlighted."""

from __future__ import annotations

from typing import Any


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
    figure, axes = plt.subplots(figsize=(9, 5.5), dpi=110)
    try:
        for trial_id, points in sorted(curves.items()):
            if not points:
                continue
            xs, ys = zip(*points, strict=True)
            best = trial_id == best_trial_id
            axes.plot(
                xs,
                ys,
                linewidth=2.6 if best else 1.0,
                alpha=1.0 if best else 0.55,
                color="tab:red" if best else None,
                label=f"{trial_id} (best)" if best else trial_id,
                zorder=3 if best else 2,
            )
        axes.set_xlabel("training_iteration")
        axes.set_ylabel(metric)
        axes.set_title(title or f"Learning curves: {metric}")
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
