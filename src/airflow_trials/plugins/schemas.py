"""The JSON API's response models: what ``/trials/api/...`` returns and its OpenAPI schema shows."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field

from airflow_trials.store import ExperimentRunRecord, TrialRecord
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
        return cls(id=run.id, experiment_name=run.experiment_name, run_key=run.run_key, dag_id=run.dag_id,
                   run_id=run.run_id, status=run.status.value, num_trials=num_trials,
                   created_at=run.created_at, ended_at=run.ended_at, url=url)


class ExperimentOut(BaseModel):
    """An experiment with the runs the user may read, oldest first."""

    name: str
    metric: str | None
    mode: str | None
    created_at: datetime
    runs: list[RunOut]


class LeaderboardRowOut(BaseModel):
    rank: int = Field(description="Place in the ranking by the metric over the whole run (1 = best).")
    trial_id: str
    status: str
    num_failures: int
    config: dict[str, Any]
    best_value: float | None
    best_iteration: int | None
    best_checkpoint: CheckpointRecordRow | None = Field(
        description="Newest kept checkpoint at or before the best iteration, else the newest kept one."
    )
    url: str


class LeaderboardOut(BaseModel):
    run: RunOut
    metric: str
    mode: str
    sort: str
    order: str
    page: int
    page_size: int
    pages: int
    total: int
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


class TrialOut(BaseModel):
    """A trial as the store records it (config, status, failures with the last traceback, its
    Airflow task instance), with its checkpoints."""

    trial: TrialRecord
    checkpoints: list[CheckpointRecordRow] = Field(description="Every recorded checkpoint, deleted ones too.")
    best_checkpoint: CheckpointRecordRow | None = Field(
        description="Newest kept checkpoint at or before the best iteration, else the newest kept one."
    )
    best_iteration: int | None = Field(description="First iteration that reached the trial's best value.")
    task_instance_url: str | None = Field(description="The Airflow UI page (logs) of the trial's task instance.")


class ResultsOut(BaseModel):
    trial_id: str
    results: list[dict[str, Any]] = Field(description="Every stored result, by training_iteration.")
