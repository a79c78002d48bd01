"""The JSON API's response models: what ``/trials/api/...`` returns and its OpenAPI schema shows."""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field

from airflow_trials.core.stop_kind import StopKind
from airflow_trials.plugins.queries import AT_END, LineageStep, rung_verdict
from airflow_trials.store import ExperimentRunRecord, RungDecision, TrialRecord
from airflow_trials.store.records import CheckpointRecordRow


class RunOut(BaseModel):
    """One experiment run (one DAG run of an experiment's task group)."""

    id: int
    experiment_name: str
    run_key: str
    dag_id: str | None
    run_id: str | None
    status: str
    num_trials: int
    created_at: datetime
    ended_at: datetime | None
    url: str = Field(description="The run's dashboard page.")

    @classmethod
    def of(cls, run: ExperimentRunRecord, num_trials: int, url: str) -> RunOut:
        return cls(
            id=run.id,
            experiment_name=run.experiment_name,
            run_key=run.run_key,
            dag_id=run.dag_id,
            run_id=run.run_id,
            status=run.status.value,
            num_trials=num_trials,
            created_at=run.created_at,
            ended_at=run.ended_at,
            url=url,
        )


class ExperimentOut(BaseModel):
    """An experiment with the runs the user may read, oldest first."""

    name: str
    metric: str | None = Field(description="The metric it ranks by; null with several.")
    mode: str | None = Field(description="min or max; null with several metrics.")
    metrics: list[str] | None = Field(
        default=None, description="The several metrics it ranks by at once; null with one."
    )
    modes: list[str] | None = Field(
        default=None, description="min or max, one per metric of metrics; null with one metric."
    )
    constraints: list[str] = Field(
        default_factory=list,
        description="Its constraints on reported metrics, e.g. ['latency <= 5.0'] (a trial is "
        "feasible when its last result meets them all); empty when it has none.",
    )
    created_at: datetime
    runs: list[RunOut]


class LeaderboardRowOut(BaseModel):
    rank: int = Field(
        description="Place in the ranking by the metric over the whole run (1 = best)."
    )
    trial_id: str
    status: str
    num_failures: int
    config: dict[str, Any]
    best_value: float | None
    best_iteration: int | None
    best_checkpoint: CheckpointRecordRow | None = Field(
        description="Newest kept checkpoint at or before the best iteration, else the newest kept "
        "one."
    )
    stop_reason: str | None = Field(
        default=None,
        description="Why the trial ended TERMINATED; null when it has not, or nobody said.",
    )
    stop_kind: StopKind | None = Field(
        default=None,
        description="The kind of its end: finished, criterion, scheduler, max_t, experiment or "
        "airflow; null when it has not ended TERMINATED, or nobody said.",
    )
    early_stopped: bool = Field(
        default=False, description="Its scheduler stopped it early: stop_kind is 'scheduler'."
    )
    url: str
    values: dict[str, float | None] | None = Field(
        default=None,
        description="With several metrics: each metric's value in the trial's last result (null "
        "when not reported as a finite number); null with one metric.",
    )
    iteration: int | None = Field(
        default=None,
        description="With several metrics: training_iteration of the trial's last result.",
    )
    pareto_rank: int | None = Field(
        default=None,
        description="With several metrics: 0 on the Pareto front, k on the front once the ranks "
        "below k are removed; null without a rankable value of every metric, or with one metric.",
    )
    on_front: bool | None = Field(
        default=None,
        description="With several metrics: pareto_rank is 0; null with one metric.",
    )
    feasible: bool | None = Field(
        default=None,
        description="With the experiment's constraints: whether the trial's last result meets "
        "them all (feasible trials rank above every infeasible one); null without constraints.",
    )
    violations: dict[str, float | None] | None = Field(
        default=None,
        description="With constraints: those the last result misses, each with by how much "
        "(null: the metric is not reported as a finite number); empty when feasible, null "
        "without constraints.",
    )


class LeaderboardOut(BaseModel):
    run: RunOut = Field(
        description="The run; its num_trials counts all of them, whatever the filter."
    )
    metric: str = Field(
        description="The metric ranked by; with several metrics, the first (the tie-break "
        "within a Pareto rank)."
    )
    mode: str = Field(description="min or max; with several metrics, the first metric's.")
    metrics: list[str] | None = Field(
        default=None,
        description="With several metrics (the experiment's, no ?metric=): their names; rows "
        "are then ranked by Pareto rank over each trial's last result, then by the first metric "
        "in its mode, then by trial id. Null with one metric.",
    )
    modes: list[str] | None = Field(
        default=None, description="With several metrics: min or max, one per metric."
    )
    front_trial_ids: list[str] | None = Field(
        default=None,
        description="With several metrics: the ids of the run's trials on the Pareto front, "
        "sorted, whatever the filter and page; null with one metric.",
    )
    constraints: list[str] = Field(
        default_factory=list,
        description="The experiment's constraints (each row's feasible and violations are "
        "judged on them); empty when it has none.",
    )
    sort: str
    order: str
    stopped: str = Field(default="all", description="The filter: all, early or not_early.")
    page: int
    page_size: int
    pages: int
    total: int = Field(description="Trials the filter keeps; pages count those.")
    best_trial_id: str | None
    status_counts: dict[str, int]
    config_keys: list[str]
    rows: list[LeaderboardRowOut]


class CurvesOut(BaseModel):
    run_id: int = Field(description="The experiment run's id.")
    metric: str
    mode: str
    best_trial_id: str | None
    curves: dict[str, list[tuple[int, float]]] = Field(
        description="Trial id -> [[training_iteration, value], ...] for the best `top` trials."
    )


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
