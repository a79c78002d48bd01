"""A trial's JSON: status, checkpoints, ASHA rungs, PBT lineage, results."""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field

from airflow_trials.plugins.datamodels.scheduler_steps import AT_END, LineageStep, rung_verdict
from airflow_trials.store import RungDecision, TrialRecord
from airflow_trials.store.records import CheckpointRecordRow


class RungOut(BaseModel):
    """ASHA's record of the trial at one rung."""

    milestone: float = Field(description="The rung, in the scheduler's time_attr units.")
    iteration: int | None = Field(description="training_iteration of the result that reached it.")
    value: float | None = Field(description="The metric it reached the rung with; null for NaN.")
    decision: str = Field(description="CONTINUE or STOP.")
    verdict: str = Field(
        description=f"The decision, or '{AT_END}' for the value recorded when the trial "
        "ended (not acted on)."
    )
    reason: str | None
    at_end: bool
    bracket: int
    created_at: datetime

    @classmethod
    def of(cls, rung: RungDecision) -> RungOut:
        return cls(
            milestone=rung.milestone,
            iteration=rung.iteration,
            value=None if math.isnan(rung.value) else rung.value,
            decision=rung.decision.value,
            verdict=rung_verdict(rung),
            reason=rung.reason,
            at_end=rung.at_end,
            bracket=rung.bracket,
            created_at=rung.created_at,
        )


class ConfigChangeOut(BaseModel):
    key: str = Field(description="The config key, nested keys joined with dots.")
    old: Any
    new: Any
    operation: str | None = Field(description="What PBT's explore did, e.g. '0.01 * 1.2'.")


class ExploitOut(BaseModel):
    """One PBT exploit of a trial's lineage: the trial continued from the donor's checkpoint."""

    trial_id: str = Field(
        description="The trial that was exploited (the trial itself, or one of its donors)."
    )
    donor_trial_id: str
    donor_url: str = Field(description="The donor's dashboard page.")
    iteration: int = Field(description="training_iteration of the donor's checkpoint.")
    donor_checkpoint: str
    old_config: dict[str, Any]
    new_config: dict[str, Any]
    operations: dict[str, str]
    changes: list[ConfigChangeOut] = Field(description="The keys whose values the exploit changed.")
    created_at: datetime

    @classmethod
    def of(cls, step: LineageStep, donor_url: str) -> ExploitOut:
        e = step.exploit
        return cls(
            trial_id=e.trial_id,
            donor_trial_id=e.donor_trial_id,
            donor_url=donor_url,
            iteration=e.iteration,
            donor_checkpoint=e.donor_checkpoint,
            old_config=e.old_config,
            new_config=e.new_config,
            operations=e.operations,
            created_at=e.created_at,
            changes=[
                ConfigChangeOut(key=c.key, old=c.old, new=c.new, operation=c.operation)
                for c in step.changes
            ],
        )


class TrialOut(BaseModel):
    """A trial as the store records it (config, status, failures with the last traceback, why it
    stopped, its Airflow task instance), with its checkpoints, ASHA rungs and PBT lineage."""

    trial: TrialRecord
    early_stopped: bool = Field(
        default=False,
        description="Its scheduler stopped it early: trial.stop_kind is 'scheduler'.",
    )
    checkpoints: list[CheckpointRecordRow] = Field(
        description="Every recorded checkpoint, deleted ones too."
    )
    best_checkpoint: CheckpointRecordRow | None = Field(
        description="Newest kept checkpoint at or before the best iteration, else the newest kept "
        "one."
    )
    best_iteration: int | None = Field(
        description="First iteration that reached the trial's best value."
    )
    task_instance_url: str | None = Field(
        description="The Airflow UI page (logs) of the trial's task instance."
    )
    rungs: list[RungOut] = Field(
        default_factory=list, description="ASHA's verdicts, lowest milestone first."
    )
    lineage: list[ExploitOut] = Field(
        default_factory=list,
        description="The PBT exploits that made the trial's state, oldest first: its donors' "
        "lineage, then its own.",
    )


class ResultsOut(BaseModel):
    trial_id: str
    results: list[dict[str, Any]] = Field(description="Every stored result, by training_iteration.")
