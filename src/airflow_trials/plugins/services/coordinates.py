"""A run's trials as parallel coordinates and slice plots: one axis per config key and one for
the metric, each trial's values on them (its JSON: ``datamodels/coordinates.py``)."""

from __future__ import annotations

import math
from typing import Annotated, Any

from fastapi import Query

from airflow_trials.core.goal import Goal
from airflow_trials.plugins.datamodels.chart_scale import Scale
from airflow_trials.plugins.datamodels.coordinates import TOP_TRIALS, Axis, Coordinates, Line
from airflow_trials.plugins.web import reads
from airflow_trials.plugins.web.params import METRIC_PATTERN
from airflow_trials.store import TrialReader


def coordinates(
    store: TrialReader, user: Any, run_pk: int, metric: str | None, mode: str | None
) -> Coordinates:
    """Every trial of the run the user may read, with the axes to draw them on. The metric and
    mode default to the experiment's (the first of several); each trial's value is its best
    (the run's one-metric board, feasible trials first when it has constraints); the top ones
    are the best of those that count (docs/store.md "Which trials count")."""
    run = reads.experiment_run(store, user, run_pk)
    recorded = reads.run_goal(store, run)
    metric, mode = reads.goal(store, run, metric, mode)
    rows = store.board(run.id, Goal.of(metric, mode)).rows
    values = [
        row.value if row.value is not None and math.isfinite(row.value) else None for row in rows
    ]
    ranked = [i for i, v in enumerate(values) if v is not None and rows[i].counted]
    top = set(ranked[:TOP_TRIALS])
    keys = sorted({key for row in rows for key in row.config})
    axes = [
        Axis(
            key,
            Scale.of([row.config[key] for row in rows if key in row.config]),
            sum(1 for row in rows if key not in row.config),
        )
        for key in keys
    ]
    finite = [v for v in values if v is not None]
    return Coordinates(
        run=run,
        metric=metric,
        mode=mode,
        metrics=list(recorded.metrics) if recorded.several else None,
        axes=axes,
        metric_scale=Scale.numeric(finite) if finite else None,
        lines=[
            Line(row.trial_id, row.status.value, row.rank, row.config, values[i], i in top)
            for i, row in enumerate(rows)
        ],
    )


Param = Annotated[
    str | None,
    Query(
        pattern=METRIC_PATTERN,
        description="The config key the slice plot draws the metric against; default the first.",
    ),
]
