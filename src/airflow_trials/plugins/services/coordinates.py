"""A run's trials as parallel coordinates and slice plots: one axis per config key and one for
the metric, each trial's values on them (its JSON: ``datamodels/coordinates.py``)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import HTTPException, Query, status

from airflow_trials.core.goal import Goal
from airflow_trials.plugins import reads
from airflow_trials.plugins.charts.kit import Scale
from airflow_trials.plugins.params import METRIC_PATTERN
from airflow_trials.store import ExperimentRunRecord, TrialReader

# The best trials drawn last, thicker and in the accent colour.
TOP_TRIALS = 10


@dataclass(frozen=True)
class Axis:
    """One config key's axis.

    :param key: the config key.
    :param scale: numeric (linear or log) when every trial that has the key holds a finite
        number there, else categorical.
    :param missing: how many of the run's trials lack the key (drawn at the axis's "missing"
        mark below it).
    """

    key: str
    scale: Scale
    missing: int


@dataclass(frozen=True)
class Line:
    """One trial across the axes.

    :param trial_id: the trial.
    :param status: its status.
    :param rank: its place on the run's leaderboard by the metric (1 = best).
    :param config: its config.
    :param value: its best value of the metric; None when it reported none as a finite number.
    :param top: one of the :data:`TOP_TRIALS` best.
    """

    trial_id: str
    status: str
    rank: int
    config: dict[str, Any]
    value: float | None
    top: bool


@dataclass(frozen=True)
class Coordinates:
    """What the parallel-coordinates and slice charts draw of a run.

    :param run: the run.
    :param metric: the metric that colours the lines.
    :param mode: its mode (min or max).
    :param metrics: the experiment's several metrics (links to colour by each); None with one.
    :param axes: one per config key, sorted by key.
    :param metric_scale: the metric's axis; None when no trial has a finite value.
    :param lines: every trial, in leaderboard order.
    """

    run: ExperimentRunRecord
    metric: str
    mode: str
    metrics: list[str] | None
    axes: list[Axis]
    metric_scale: Scale | None
    lines: list[Line]

    def goodness(self, value: float) -> float:
        """0 for the worst value on the metric's axis, 1 for the best."""
        if self.metric_scale is None:
            return 0.5
        place = self.metric_scale.fraction(value)
        return place if self.mode == "max" else 1 - place

    def axis(self, key: str) -> Axis:
        """The axis of config key ``key``; a 422 naming the keys when the run has no such key."""
        for axis in self.axes:
            if axis.key == key:
                return axis
        keys = ", ".join(a.key for a in self.axes) or "none: the run has no trials yet"
        raise HTTPException(
            status.HTTP_422_UNPROCESSABLE_CONTENT,
            f"?param= names no config key of run {self.run.id} of experiment "
            f"{self.run.experiment_name}; its keys are: {keys}.",
        )


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
