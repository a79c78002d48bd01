"""A run's learning curves as JSON."""

from __future__ import annotations

from pydantic import BaseModel, Field


class CurvesOut(BaseModel):
    run_id: int = Field(description="The experiment run's id.")
    metric: str
    mode: str
    best_trial_id: str | None
    curves: dict[str, list[tuple[int, float]]] = Field(
        description="Trial id -> [[training_iteration, value], ...] for the best `top` trials."
    )
