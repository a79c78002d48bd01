"""The experiments' JSON: an experiment, its runs, and its history across runs."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field

from airflow_trials.store import ExperimentRunRecord


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


class WarmStartOut(BaseModel):
    """The earlier run a warm-started run took its first configs from; all null when that run is
    not one the user may read (on another DAG, or deleted)."""

    experiment_run_id: int | None
    run_key: str | None
    url: str | None = Field(description="The source run's page; null when it is not known.")


class HistoryRunOut(BaseModel):
    """One run's line in its experiment's history."""

    run: RunOut
    best_value: float | None = Field(description="The run's best value of the metric.")
    best_trial_id: str | None
    best_config: dict[str, Any] | None
    previous_run_id: int | None = Field(
        description="The closest earlier run with a best config that the user may read, which "
        "changed_keys compares with."
    )
    previous_best_config: dict[str, Any] | None = Field(
        description="That run's best config; null with it."
    )
    changed_keys: list[str] = Field(
        description="Keys of best_config whose value differs from that run's best config."
    )
    num_trials: int
    num_errored: int = Field(description="Trials that ended ERROR.")
    num_failed_tries: int = Field(description="Failed tries over all its trials.")
    stop_kinds: dict[str, int] = Field(
        description="Trials per kind of end: completed, early_stopped (by their scheduler), "
        "errored, unfinished."
    )
    warm_started_from: WarmStartOut | None
    picked_trial_id: str | None = Field(
        description="The trial select_best picked in the run; null until it picked one."
    )


class HistoryOut(BaseModel):
    """An experiment's runs the user may read, oldest first, each with its best and counts."""

    experiment: str
    metric: str | None = Field(description="The metric of each run's best; null when none.")
    mode: str | None
    several_metrics: bool = Field(
        description="The experiment ranks by several metrics; the bests are of the first alone."
    )
    note: str | None = Field(description="What the bests are of, when it is not plain.")
    runs: list[HistoryRunOut]
