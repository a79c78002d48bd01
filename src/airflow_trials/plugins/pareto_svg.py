"""The Pareto front of a run with several metrics: every trial on two of its metrics, as SVG drawn
on the server, and the JSON the API returns of it.

Each trial is placed by its last result, as the run's leaderboard of several metrics places it
(:meth:`~airflow_trials.store.TrialReader.pareto_leaderboard`): the front (Pareto rank 0, of the
feasible trials when the experiment has constraints) is emphasised and joined by a step line,
the other trials are faded, infeasible ones drawn as crosses. The trial ``select_best`` picked
(``at_experiment_runs.picked_trial_id``, recorded by ``TrialStore.record_pick``) is ringed and
labelled.
"""

from __future__ import annotations

from dataclasses import dataclass
from html import escape
from typing import Any

from fastapi import HTTPException, status
from markupsafe import Markup

from airflow_trials.plugins import reads
from airflow_trials.plugins.queries import NotFoundError
from airflow_trials.plugins.scales import ACCENT, Scale, number_label, short
from airflow_trials.store import ExperimentRunRecord, TrialReader

WIDTH, HEIGHT = 860, 420
_LEFT, _RIGHT, _TOP, _BOTTOM = 80, 30, 36, 56
DOMINATED_COLOR = "#4e79a7"
INFEASIBLE_COLOR = "#b07aa1"


@dataclass(frozen=True)
class Point:
    """One trial on the scatter.

    :param trial_id: the trial.
    :param x: its value of the x metric (last result).
    :param y: its value of the y metric.
    :param pareto_rank: its rank over all the experiment's metrics (0 = the front).
    :param feasible: meets the experiment's constraints; None without constraints.
    """

    trial_id: str
    x: float
    y: float
    pareto_rank: int | None
    feasible: bool | None

    @property
    def on_front(self) -> bool:
        return self.pareto_rank == 0


@dataclass(frozen=True)
class ParetoView:
    """A run's trials on two of its metrics.

    :param run: the run.
    :param metrics: the experiment's metrics; ``x`` and ``y`` are two of them.
    :param modes: one per metric.
    :param x: the horizontal metric.
    :param y: the vertical metric.
    :param points: the trials with a finite value of both, in leaderboard order.
    :param left_out: how many trials of the run have no value of one of them.
    :param step: the front's step line: the front trials no other front trial beats on both
        ``x`` and ``y`` (with two metrics, the whole front), sorted by ``x``.
    :param constrained: the experiment has constraints.
    :param picked: the trial ``select_best`` picked, when it picked one; default None.
    """

    run: ExperimentRunRecord
    metrics: list[str]
    modes: list[str]
    x: str
    y: str
    points: list[Point]
    left_out: int
    step: list[Point]
    constrained: bool
    picked: str | None = None

    def mode(self, metric: str) -> str:
        return self.modes[self.metrics.index(metric)]


def pareto_view(
    store: TrialReader, user: Any, run_pk: int, x: str | None, y: str | None
) -> ParetoView:
    """The run's trials on metrics ``x`` and ``y`` (default the experiment's first two); a 404
    for a run whose experiment records one metric, a 422 for a metric it does not record."""
    run = reads.experiment_run(store, user, run_pk)
    goal = reads.run_goal(store, run)
    if not goal.several:
        raise NotFoundError(
            f"Run {run.id} of experiment {run.experiment_name} has no Pareto front: its "
            "experiment records one metric; see its leaderboard."
        )
    return of_board(store, run, list(goal.metrics), [m or "min" for m in goal.modes], x, y)


def of_board(
    store: TrialReader,
    run: ExperimentRunRecord,
    metrics: list[str],
    modes: list[str],
    x: str | None,
    y: str | None,
) -> ParetoView:
    """The view of an already authorised run with several metrics."""
    x = x or metrics[0]
    y = y or next(m for m in metrics if m != x)
    for name, value in (("x", x), ("y", y)):
        if value not in metrics:
            raise HTTPException(
                status.HTTP_422_UNPROCESSABLE_CONTENT,
                f"?{name}= names no metric of experiment {run.experiment_name} (run {run.id}); "
                f"pick one of {', '.join(metrics)}.",
            )
    if x == y:
        raise HTTPException(
            status.HTTP_422_UNPROCESSABLE_CONTENT,
            f"?x= and ?y= both name {x}; the Pareto scatter of run {run.id} needs two different "
            f"metrics of {', '.join(metrics)}.",
        )
    board = store.pareto_leaderboard(run.id, metrics, modes)
    points = [
        Point(r.trial_id, vx, vy, r.pareto_rank, r.feasible)
        for r in board.rows
        if (vx := r.values.get(x)) is not None and (vy := r.values.get(y)) is not None
    ]
    x_mode, y_mode = modes[metrics.index(x)], modes[metrics.index(y)]
    return ParetoView(
        run=run,
        metrics=metrics,
        modes=modes,
        x=x,
        y=y,
        points=points,
        left_out=len(board.rows) - len(points),
        step=_step([p for p in points if p.on_front], x_mode == "min", y_mode == "min"),
        constrained=bool(board.constraints),
        picked=run.picked_trial_id,
    )


def _step(front: list[Point], x_min: bool, y_min: bool) -> list[Point]:
    """The points of ``front`` that no other beats on both x and y, sorted by x then y."""
    sx, sy = (1 if x_min else -1), (1 if y_min else -1)

    def beaten(p: Point) -> bool:
        return any(
            sx * q.x <= sx * p.x and sy * q.y <= sy * p.y and (q.x, q.y) != (p.x, p.y)
            for q in front
        )

    return sorted((p for p in front if not beaten(p)), key=lambda p: (p.x, p.y))


def pareto_svg(view: ParetoView) -> str:
    """An ``<svg>`` scatter of the run's trials on ``view.x`` and ``view.y``: the front's points
    emphasised and joined by a step line, dominated trials faded, infeasible ones as crosses,
    and the picked trial (when known) ringed and labelled."""
    title = f"Pareto front: {view.mode(view.x)} {view.x}, {view.mode(view.y)} {view.y}"
    head = (
        f'<svg xmlns="http://www.w3.org/2000/svg" class="pareto" role="img" width="{WIDTH}" '
        f'height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" fill="currentColor" '
        f'aria-label="{escape(title)}"><title>{escape(title)}</title>'
    )
    if not view.points:
        return (
            f'{head}<text x="{WIDTH // 2}" y="{HEIGHT // 2}" text-anchor="middle" class="empty">'
            f"No trial has reported both {escape(view.x)} and {escape(view.y)} yet.</text></svg>"
        )
    plot_w, plot_h = WIDTH - _LEFT - _RIGHT, HEIGHT - _TOP - _BOTTOM
    bottom = _TOP + plot_h
    x_scale = Scale.numeric(p.x for p in view.points)
    y_scale = Scale.numeric(p.y for p in view.points)

    def sx(value: float) -> float:
        return round(_LEFT + 10 + x_scale.fraction(value) * (plot_w - 20), 1)

    def sy(value: float) -> float:
        return round(bottom - 10 - y_scale.fraction(value) * (plot_h - 20), 1)

    parts = [
        head,
        f'<g class="axes" stroke="currentColor" stroke-opacity="0.55">'
        f'<line x1="{_LEFT}" y1="{bottom}" x2="{_LEFT + plot_w}" y2="{bottom}"/>'
        f'<line x1="{_LEFT}" y1="{_TOP}" x2="{_LEFT}" y2="{bottom}"/></g>'
        '<g class="ticks" font-size="11" fill-opacity="0.85">',
    ]
    for fraction, label in y_scale.ticks():
        y = round(bottom - 10 - fraction * (plot_h - 20), 1)
        parts.append(
            f'<line x1="{_LEFT}" x2="{_LEFT + plot_w}" y1="{y}" y2="{y}" stroke="currentColor" '
            f'stroke-opacity="0.12"/><text x="{_LEFT - 6}" y="{y + 4}" '
            f'text-anchor="end">{escape(label)}</text>'
        )
    for fraction, label in x_scale.ticks():
        x = round(_LEFT + 10 + fraction * (plot_w - 20), 1)
        parts.append(
            f'<line x1="{x}" x2="{x}" y1="{bottom}" y2="{bottom + 4}" stroke="currentColor"/>'
            f'<text x="{x}" y="{bottom + 17}" text-anchor="middle">{escape(label)}</text>'
        )
    mid_y = _TOP + plot_h // 2
    parts.append(
        f'</g><text class="x-label" x="{_LEFT + plot_w // 2}" y="{HEIGHT - 18}" '
        f'text-anchor="middle" font-size="12">{escape(view.mode(view.x))} {escape(view.x)}'
        f'{x_scale.describe()}</text><text class="y-label" x="16" y="{mid_y}" '
        f'text-anchor="middle" font-size="12" transform="rotate(-90 16 {mid_y})">'
        f"{escape(view.mode(view.y))} {escape(view.y)}{y_scale.describe()}</text>"
    )
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


def _points(view: ParetoView, sx: Any, sy: Any) -> list[str]:
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


def _step_line(view: ParetoView, sx: Any, sy: Any) -> str:
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


def _front_points(view: ParetoView, sx: Any, sy: Any) -> list[str]:
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


def pareto_of_board(
    store: TrialReader,
    run: ExperimentRunRecord,
    metrics: list[str] | None,
    modes: list[str] | None,
    x: str | None,
    y: str | None,
) -> tuple[ParetoView, Markup] | None:
    """The run page's Pareto scatter, when its leaderboard is the one of several metrics (None
    otherwise): the view and its SVG. ``run`` is already authorised."""
    if metrics is None or modes is None:
        return None
    view = of_board(store, run, metrics, modes, x, y)
    return view, Markup(pareto_svg(view))
