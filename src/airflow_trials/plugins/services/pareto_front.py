"""The Pareto front of a run with several metrics: every trial on two of its metrics (drawn by
``charts/pareto_chart.py``; its JSON in ``datamodels/runs.py``).

Each trial is placed by its last result, as the run's leaderboard of several metrics places it
(:meth:`~airflow_trials.store.TrialReader.pareto_leaderboard`): the front (Pareto rank 0, of the
feasible trials when the experiment has constraints) is emphasised and joined by a step line,
the other trials are faded, infeasible ones drawn as crosses. The trial ``select_best`` picked
(``at_experiment_runs.picked_trial_id``, recorded by ``TrialStore.record_pick``) is ringed and
labelled.
"""

from __future__ import annotations

from typing import Any

from fastapi import HTTPException, status

from airflow_trials.plugins.data.queries import NotFoundError, check_pareto_size
from airflow_trials.plugins.datamodels.runs import ParetoView, Point
from airflow_trials.plugins.web import reads
from airflow_trials.store import ExperimentRunRecord, TrialReader


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
    """The view of an already authorised run with several metrics; a 409 for a run of more
    than :data:`~airflow_trials.plugins.data.queries.MAX_PARETO_TRIALS` trials."""
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
    check_pareto_size(store, run, metrics)
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
