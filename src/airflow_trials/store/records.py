"""Plain, frozen records the store hands out, so callers never hold a live SQLAlchemy row."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from airflow_trials.core.status import TrialStatus


class ExperimentRunStatus(StrEnum):
    """Status of one run of an experiment (e.g. one DAG run)."""

    RUNNING = "RUNNING"
    SUCCESS = "SUCCESS"
    FAILED = "FAILED"

    def is_terminal(self) -> bool:
        return self is not ExperimentRunStatus.RUNNING


@dataclass(frozen=True)
class ExperimentRecord:
    """An experiment.

    :param id: primary key.
    :param name: unique name.
    :param metric: metric its leaderboard ranks by; None when not set.
    :param mode: ``"min"`` or ``"max"``; None when not set.
    :param created_at: when it was first registered (UTC).
    """

    id: int
    name: str
    metric: str | None
    mode: str | None
    created_at: datetime


@dataclass(frozen=True)
class ExperimentRunRecord:
    """One run of an experiment.

    :param id: primary key, the ``experiment_run_id`` of its trials.
    :param experiment_id: the experiment's primary key.
    :param experiment_name: the experiment's name.
    :param run_key: unique within the experiment, e.g. the Airflow run_id.
    :param dag_id: Airflow DAG id; None outside Airflow.
    :param run_id: Airflow run id; None outside Airflow.
    :param search_space: the search space as JSON; None when not recorded.
    :param seed: random seed of the search; None when not recorded.
    :param num_samples: trials the search was asked for; None when not recorded.
    :param status: RUNNING, SUCCESS or FAILED.
    :param created_at: when it was created (UTC).
    :param ended_at: when it finished (UTC); None while RUNNING.
    """

    id: int
    experiment_id: int
    experiment_name: str
    run_key: str
    dag_id: str | None
    run_id: str | None
    search_space: Any
    seed: int | None
    num_samples: int | None
    status: ExperimentRunStatus
    created_at: datetime
    ended_at: datetime | None


@dataclass(frozen=True)
class TrialRecord:
    """Everything the store knows about one trial, except its results and checkpoints.

    :param trial_id: globally unique id.
    :param experiment_run_id: the run it belongs to; None for trials run outside Airflow.
    :param trainable: import path of the trainable.
    :param config: hyperparameters.
    :param resources: resources per trial, as a dict.
    :param status: current status.
    :param num_failures: failures so far.
    :param max_failures: failures tolerated (-1: unlimited).
    :param error_msg: full traceback of the last failure; None if it never failed.
    :param last_result: the stored result with the highest iteration; None before the first.
    :param created_at: when it was registered (UTC).
    :param started_at: when it first went RUNNING (UTC); None before.
    :param ended_at: when it reached TERMINATED or ERROR (UTC); None while not terminal.
    :param updated_at: last change (UTC).
    :param dag_id: Airflow DAG id of the task running it; None outside Airflow.
    :param run_id: Airflow run id; None outside Airflow.
    :param task_id: Airflow task id; None outside Airflow.
    :param map_index: Airflow map index; -1 when not mapped.
    :param try_number: Airflow try number; None outside Airflow.
    """

    trial_id: str
    experiment_run_id: int | None
    trainable: str
    config: dict[str, Any]
    resources: dict[str, Any]
    status: TrialStatus
    num_failures: int
    max_failures: int
    error_msg: str | None
    last_result: dict[str, Any] | None
    created_at: datetime
    started_at: datetime | None
    ended_at: datetime | None
    updated_at: datetime
    dag_id: str | None
    run_id: str | None
    task_id: str | None
    map_index: int
    try_number: int | None


@dataclass(frozen=True)
class CheckpointRecordRow:
    """A stored checkpoint of a trial.

    :param path: directory or URL of the checkpoint.
    :param iteration: training_iteration it was taken at.
    :param score: score it was ranked by; None when not scored.
    :param deleted: True once the keep policy dropped it.
    """

    path: str
    iteration: int
    score: float | None
    deleted: bool


@dataclass(frozen=True)
class LeaderboardRow:
    """One trial's line on a leaderboard.

    :param trial_id: the trial.
    :param status: its current status.
    :param num_failures: failures so far.
    :param config: its hyperparameters.
    :param best_value: best value of the metric over its results; None when it never reported it.
    :param best_iteration: first iteration that reached ``best_value``; None with it.
    :param best_checkpoint: path of its best checkpoint: the kept checkpoint whose iteration's
        result is best on the leaderboard's metric (the model a downstream task should take);
        the newest kept one when none of them has the metric; None when none is kept.
    :param latest_checkpoint: path of its newest kept checkpoint (what a restore resumes from).
    """

    trial_id: str
    status: TrialStatus
    num_failures: int
    config: dict[str, Any]
    best_value: float | None
    best_iteration: int | None
    best_checkpoint: str | None
    latest_checkpoint: str | None
