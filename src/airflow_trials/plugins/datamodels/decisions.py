"""A run's scheduler decisions as JSON: ASHA's rungs and PBT's exploits."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field

from airflow_trials.plugins.datamodels.scheduler_steps import AT_END
from airflow_trials.plugins.datamodels.trials import ConfigChangeOut


class RungPointOut(BaseModel):
    """One trial's record at a rung."""

    trial_id: str
    iteration: int | None
    value: float | None = Field(description="The metric; MOASHA's first; null for NaN or inf.")
    values: list[float | None] | None = Field(description="MOASHA's metric vector; null on ASHA.")
    decision: str = Field(description="CONTINUE or STOP.")
    verdict: str = Field(description=f"The decision, or '{AT_END}' (not acted on).")
    reason: str | None


class RunRungOut(BaseModel):
    """One rung of one bracket, and every trial's record there in the order recorded."""

    bracket: int
    milestone: float
    reached: int
    continued: int
    stopped: int
    recorded_at_end: int
    cutoff: float | None = Field(
        description="The cutoff of the rung's latest STOP verdict, as its reason records it (4 "
        "significant digits); null when it stopped nobody, or for MOASHA."
    )
    cutoff_min: float | None
    cutoff_max: float | None
    trials: list[RungPointOut]


class RunExploitOut(BaseModel):
    """One PBT exploit: ``trial_id`` continued from ``donor_trial_id``'s checkpoint."""

    id: int
    trial_id: str
    trial_url: str
    donor_trial_id: str
    donor_url: str
    iteration: int = Field(description="training_iteration of the donor's checkpoint.")
    donor_checkpoint: str
    changes: list[ConfigChangeOut]
    created_at: datetime


class RunDecisionsOut(BaseModel):
    """A run's scheduler decisions: its rungs (ASHA, HyperBand, MOASHA) and PBT exploits."""

    run_id: int
    metric: str = Field(description="The rungs' value: the experiment's metric (MOASHA: first).")
    vector: bool = Field(description="MOASHA's rungs: each record has a vector of metrics.")
    rungs: list[RunRungOut]
    exploits: list[RunExploitOut]
