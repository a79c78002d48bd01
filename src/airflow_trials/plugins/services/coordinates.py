"""A run's trials as parallel coordinates and slice plots: one axis per config key and one for
the metric, each trial's values on them (its JSON: ``datamodels/coordinates.py``); of a run of
more than :data:`~airflow_trials.plugins.datamodels.coordinates.MAX_LINES` trials, its best ones
(docs/dashboard.md, "Performance")."""

from __future__ import annotations

import math
from typing import Annotated, Any

from fastapi import Query

from airflow_trials.core.constraints import is_counted
from airflow_trials.plugins.datamodels.chart_scale import Scale
from airflow_trials.plugins.datamodels.coordinates import (
    MAX_LINES,
    TOP_TRIALS,
    Axis,
    Coordinates,
    Line,
)
from airflow_trials.plugins.web import reads
from airflow_trials.plugins.web.params import METRIC_PATTERN
from airflow_trials.store import TrialReader


def coordinates(
    store: TrialReader, user: Any, run_pk: int, metric: str | None, mode: str | None
) -> Coordinates:
    """The run's best :data:`MAX_LINES` trials (every trial of a smaller run) the user may read,
    with the axes to draw them on. The metric and mode default to the experiment's (the first
    of several); each trial's value is its best, in the order of the run's one-metric ranking
    (feasible trials first when it has constraints), read a page in SQL
    (:meth:`TrialReader.ranked_page`); the top ones are the best of those that count
    (docs/store.md "Which trials count")."""
    run = reads.experiment_run(store, user, run_pk)
    recorded = reads.run_goal(store, run)
    metric, mode = reads.goal(store, run, metric, mode)
    page = store.ranked_page(run.id, metric, mode, limit=MAX_LINES, leaders=1)
    configs = store.configs_of([trial.trial_id for _, trial in page.rows])
    rows = [(rank, trial, configs.get(trial.trial_id, {})) for rank, trial in page.rows]
    values = [
        t.best_value if t.best_value is not None and math.isfinite(t.best_value) else None
        for _, t, _ in rows
    ]
    ranked = [i for i, v in enumerate(values) if v is not None and is_counted(rows[i][1].status)]
    top = set(ranked[:TOP_TRIALS])
    keys = sorted({key for _, _, config in rows for key in config})
    axes = [
        Axis(
            key,
            Scale.of([config[key] for _, _, config in rows if key in config]),
            sum(1 for _, _, config in rows if key not in config),
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
            Line(t.trial_id, t.status.value, rank, config, values[i], i in top)
            for i, (rank, t, config) in enumerate(rows)
        ],
        num_trials=page.num_trials,
    )


Param = Annotated[
    str | None,
    Query(
        pattern=METRIC_PATTERN,
        description="The config key the slice plot draws the metric against; default the first.",
    ),
]
