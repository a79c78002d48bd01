"""A run's parallel coordinates as JSON: the axes and each trial's values."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from airflow_trials.plugins.charts.kit import Scale, ScaleKind
from airflow_trials.plugins.services.coordinates import TOP_TRIALS, Coordinates


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
    trials: list[TrialLineOut] = Field(description="In leaderboard order.")

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
