"""A run's parallel coordinates as JSON: the axes and each trial's values."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fastapi import HTTPException, status
from pydantic import BaseModel, Field

from airflow_trials.plugins.datamodels.chart_scale import Scale, ScaleKind
from airflow_trials.store import ExperimentRunRecord

# The best trials drawn last, thicker and in the accent colour.
TOP_TRIALS = 10
# The charts draw at most this many trials, the best of the ranking: 100,000 lines took 5 s to
# read and draw and 28 MB of SVG (docs/benchmarks.md, issue 53), and hide one another anyway.
MAX_LINES = 1_000


class AxisOut(BaseModel):
    """One axis: a config key's, or the metric's."""

    key: str
    scale: ScaleKind = Field(
        description="linear; log when all values are positive and span more than two decades; "
        "categorical when a trial holds something other than a finite number there."
    )
    low: float | None = Field(description="The smallest value; null on a categorical axis.")
    high: float | None = Field(description="The largest value; null on a categorical axis.")
    categories: list[str] = Field(
        description="A categorical axis's values in axis order (strings as they are, others as "
        "JSON); empty on a numeric one."
    )
    missing: int = Field(description="How many trials lack the key (or, on the metric's, a value).")

    @classmethod
    def of(cls, key: str, scale: Scale, missing: int) -> AxisOut:
        numeric = scale.kind != "categorical"
        return cls(
            key=key,
            scale=scale.kind,
            low=scale.low if numeric else None,
            high=scale.high if numeric else None,
            categories=list(scale.categories),
            missing=missing,
        )


class TrialLineOut(BaseModel):
    trial_id: str
    status: str
    rank: int = Field(description="Place on the run's leaderboard by the metric (1 = best).")
    value: float | None = Field(
        description="Best value of the metric; null when none was reported as a finite number."
    )
    top: bool = Field(description="One of the best trials the chart emphasises.")
    params: dict[str, Any] = Field(description="Its value of each axis's key it has.")
    url: str


class CoordinatesOut(BaseModel):
    """A run's trials on parallel coordinates: the axes and each trial's values."""

    run_id: int
    metric: str
    mode: str
    metrics: list[str] | None = Field(
        description="The experiment's several metrics; null with one."
    )
    top: int = Field(description="How many of the best trials are emphasised.")
    axes: list[AxisOut] = Field(description="One per config key, sorted by key.")
    metric_axis: AxisOut | None = Field(
        description="The metric's; null while no trial has a value."
    )
    num_trials: int = Field(description="The run's trials, in ``trials`` or not.")
    trials: list[TrialLineOut] = Field(
        description=f"In leaderboard order: every trial, or the best {MAX_LINES:,} of a larger run."
    )

    @classmethod
    def of(cls, found: Coordinates, trial_url: Any) -> CoordinatesOut:
        keys = [a.key for a in found.axes]
        missing_values = sum(1 for line in found.lines if line.value is None)
        return cls(
            run_id=found.run.id,
            metric=found.metric,
            mode=found.mode,
            metrics=found.metrics,
            top=TOP_TRIALS,
            num_trials=found.num_trials,
            axes=[AxisOut.of(a.key, a.scale, a.missing) for a in found.axes],
            metric_axis=(
                AxisOut.of(found.metric, found.metric_scale, missing_values)
                if found.metric_scale is not None
                else None
            ),
            trials=[
                TrialLineOut(
                    trial_id=line.trial_id,
                    status=line.status,
                    rank=line.rank,
                    value=line.value,
                    top=line.top,
                    params={k: line.config[k] for k in keys if k in line.config},
                    url=trial_url(line.trial_id),
                )
                for line in found.lines
            ],
        )


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
    :param lines: every trial, in leaderboard order; of a run of more than :data:`MAX_LINES`
        trials, the best :data:`MAX_LINES`.
    :param num_trials: the run's trials, drawn or not; default 0.
    """

    run: ExperimentRunRecord
    metric: str
    mode: str
    metrics: list[str] | None
    axes: list[Axis]
    metric_scale: Scale | None
    lines: list[Line]
    num_trials: int = 0

    @property
    def capped(self) -> bool:
        """Are some of the run's trials left out (past the best :data:`MAX_LINES`)?"""
        return len(self.lines) < self.num_trials

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
