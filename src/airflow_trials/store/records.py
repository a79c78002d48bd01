"""Plain, frozen records the store hands out, so callers never hold a live SQLAlchemy row."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from airflow_trials.core.approval_rule import ApprovalOutcome, refusal
from airflow_trials.core.constraints import Constraints
from airflow_trials.core.goal import Goal
from airflow_trials.core.pareto import MetricSpec, ModeSpec
from airflow_trials.core.scheduler import Decision
from airflow_trials.core.status import TrialStatus
from airflow_trials.core.status_cause import StatusCause
from airflow_trials.core.stop_kind import StopKind


def decode_constraints(stored: str | None) -> list[str]:
    """The constraint strings of ``at_experiments.constraints`` (a JSON list; NULL: none)."""
    if not stored:
        return []
    spec = json.loads(stored)
    return [str(one) for one in spec] if isinstance(spec, list) else []


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

    ``metric`` and ``mode`` are the columns as stored: with several metrics, ``metric`` holds
    them as one JSON object and ``mode`` is None. Read :attr:`metrics` and :attr:`modes` (or
    :meth:`metric_and_mode`) rather than parse it::

        record.metrics, record.modes    # ["val_acc", "latency"], ["max", "min"]
        record.metric_and_mode()        # the same lists; one metric: ("loss", "min")

    :param id: primary key.
    :param name: unique name.
    :param metric: metric its leaderboard ranks by, as stored; None when not set.
    :param mode: ``"min"`` or ``"max"``; None when not set, or with several metrics.
    :param created_at: when it was first registered (UTC).
    :param constraints: its constraints on reported metrics as stored (a JSON list of strings
        such as ``'["latency <= 5.0"]'``); None when it has none. Read :attr:`constraint_spec`
        or :meth:`parsed_constraints` rather than parse it. Default None.
    """

    id: int
    name: str
    metric: str | None
    mode: str | None
    created_at: datetime
    constraints: str | None = None

    @property
    def constraint_spec(self) -> list[str]:
        """The constraints' canonical strings (``["latency <= 5.0"]``); ``[]`` when none."""
        return decode_constraints(self.constraints)

    def parsed_constraints(self) -> Constraints:
        """The constraints, parsed (:class:`~airflow_trials.core.constraints.Constraints`);
        empty when none, so every result is feasible."""
        return Constraints.parse(self.constraint_spec, f"Experiment {self.name}")

    def metric_and_mode(self) -> tuple[MetricSpec | None, ModeSpec | None]:
        """The metric and mode of its :attr:`goal`: a name and its mode for one metric, a list
        of names and a list of one mode per name for several, (None, None) when none is
        recorded."""
        goal = self.goal
        if not goal.metrics:
            return None, None
        if goal.several:
            # Several metrics are recorded with a mode each (decode_metrics), never None.
            return list(goal.metrics), [m for m in goal.modes if m is not None]
        return goal.metrics[0], goal.modes[0]

    @property
    def metrics(self) -> list[str]:
        """The experiment's metrics (its :attr:`goal`'s): ``[]`` when none is recorded, one
        name, or several."""
        return list(self.goal.metrics)

    @property
    def modes(self) -> list[str | None]:
        """One mode per name of :attr:`metrics`, in the same order (None: a metric recorded
        without a mode)."""
        return list(self.goal.modes)

    @property
    def goal(self) -> Goal:
        """Its metrics, modes and constraints as one :class:`~airflow_trials.core.goal.Goal`,
        resolved once from the record: every other reading of its metrics derives from it, and
        a reader's ``--metric``/``?metric=`` is resolved against it (:meth:`Goal.pick`)."""
        return Goal.recorded(self.metric, self.mode, self.constraint_spec)

    @property
    def several_metrics(self) -> bool:
        """Were its metrics recorded as a list (several at once), not one name?"""
        return self.goal.several


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
    :param picked_trial_id: the trial ``select_best`` picked; None until it picked one.
    :param end_reason: why it was ended by hand (``airflow-trials db end-run``); None when it
        ended on its own, or runs.
    :param data_version: the version of the data it tuned on (``tuning_experiment(
        data_version=...)``); None when it named none.
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
    picked_trial_id: str | None = None
    end_reason: str | None = None
    data_version: str | None = None


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
    :param stop_reason: why it ended TERMINATED, e.g. ``"it met its stopping criterion"`` or
        ``"stopped by ASHA at training_iteration=3 (rung 1 of 4): ..."`` (a scheduler's reasons
        start ``"stopped by"``); None while it is not TERMINATED or when its end gave none.
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
    :param warm_start: where a warm-started trial came from (``run_key``, ``experiment_run_id``,
        ``trial_id``, ``value``, ``checkpoint``); None for any other trial.
    :param stopped_from_airflow: Airflow stopped it (its task was cleared, marked or killed:
        ``TrialsHook.record_stop_from_airflow``) and it has not started since; default False.
    :param stop_kind: why it ended TERMINATED, as a value (``core/stop_kind.py``); None while it
        is not TERMINATED or when its end gave none; default None.
    :param status_cause: why its status last changed (``core/status_cause.py``), e.g.
        ``failure_decision`` for an ERROR trial that failed for good, ``abandoned`` for one whose
        task ended without recording its end; None when recorded before migration 0018; default
        None.
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
    stop_reason: str | None
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
    warm_start: dict[str, Any] | None = None
    stopped_from_airflow: bool = False
    stop_kind: StopKind | None = None
    status_cause: StatusCause | None = None


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
    :param feasible: does its last result meet the experiment's constraints? None when the
        experiment has none. Default None.
    :param violations: with constraints, those its last result misses, each with by how much
        (None: the metric is not reported as a finite number); None without constraints.
    :param stop_kind: how it ended (:class:`~airflow_trials.core.stop_kind.StopKind`'s value);
        None while it has not ended TERMINATED.
    """

    trial_id: str
    status: TrialStatus
    num_failures: int
    config: dict[str, Any]
    best_value: float | None
    best_iteration: int | None
    best_checkpoint: str | None
    latest_checkpoint: str | None
    feasible: bool | None = None
    violations: dict[str, float | None] | None = None
    stop_kind: str | None = None


@dataclass(frozen=True)
class TrialStop:
    """How a TERMINATED trial ended: the sentence a person reads and the kind code decides on.

    :param reason: why it ended, e.g. ``"it met its stopping criterion"``; None when its end gave
        none.
    :param kind: the kind of that end (``core/stop_kind.py``); None when its end gave none.
    """

    reason: str | None
    kind: StopKind | None


@dataclass(frozen=True)
class RankedTrial:
    """A trial's place in a ranking, without its config (read only for the rows a page shows).

    :param trial_id: the trial.
    :param status: its current status.
    :param num_failures: failures so far.
    :param best_value: its best value of the metric; None when it never reported it.
    :param best_iteration: the first iteration that reached ``best_value``; None with it.
    :param feasible: does its last result meet the experiment's constraints? None when the
        experiment has none. Default None.
    :param violations: with constraints, those it misses (as :class:`LeaderboardRow`'s); None
        without constraints.
    :param stop_kind: how it ended, as the board's rows say it (``at_trials.stop_kind``); None
        while it has not ended TERMINATED, and in the batch ranking, which does not read it.
    """

    trial_id: str
    status: TrialStatus
    num_failures: int
    best_value: float | None
    best_iteration: int | None
    feasible: bool | None = None
    violations: dict[str, float | None] | None = None
    stop_kind: str | None = None


@dataclass(frozen=True)
class RungDecision:
    """ASHA's record of one trial at one rung, as ``TrialStore.record_rung`` stored it.

    :param experiment_run_id: the run whose trials share the rung.
    :param trial_id: the trial.
    :param bracket: its ASHA bracket (0 with one bracket).
    :param milestone: the rung's milestone, in ``time_attr`` units.
    :param iteration: training_iteration of the result that reached the rung; None when not given.
    :param value: the metric it reached the rung with; NaN when it was NaN.
    :param decision: the rung's verdict: STOP when the value fell below the cutoff, else CONTINUE.
    :param reason: why, as the scheduler says it; None for most CONTINUEs.
    :param at_end: recorded when the trial ended, with its last result; the verdict was not acted
        on.
    :param created_at: when it was recorded (UTC).
    :param fresh: True when this call recorded it, False when it was stored already.
    """

    experiment_run_id: int
    trial_id: str
    bracket: int
    milestone: float
    iteration: int | None
    value: float
    decision: Decision
    reason: str | None
    at_end: bool
    created_at: datetime
    fresh: bool = False


@dataclass(frozen=True)
class MedianPoint:
    """The median stopping rule's record of one of a trial's results, as
    ``TrialStore.record_median_point`` stored it.

    :param experiment_run_id: the run whose trials the rule compares.
    :param trial_id: the trial.
    :param iteration: training_iteration of the result.
    :param time: its ``time_attr``.
    :param seq: how many of the trial's results from grace_period the running mean covers.
    :param mean: the trial's running mean up to this result; NaN when not finite.
    :param decision: the rule's verdict: STOP or CONTINUE.
    :param reason: why it stops; None for CONTINUE.
    :param at_end: the trial's last result, recorded again when it ended (not acted on).
    :param created_at: when it was recorded (UTC).
    :param fresh: True when this call recorded it, False when it was stored already.
    """

    experiment_run_id: int
    trial_id: str
    iteration: int
    time: float
    seq: int
    mean: float
    decision: Decision
    reason: str | None
    at_end: bool
    created_at: datetime
    fresh: bool = False


@dataclass(frozen=True)
class ExploitRecord:
    """A PBT exploit as ``TrialStore.record_exploit`` stored it: the trial continued from its
    donor's checkpoint with a new config (``airflow_trials.schedulers.pbt.pbt_scheduler.Exploit``).

    :param id: primary key; later exploits have larger ids.
    :param trial_id: the trial that took over the donor's state.
    :param experiment_run_id: the trial's run when it was recorded; None outside a run.
    :param iteration: training_iteration of the donor's checkpoint; the trial reports on from there.
    :param donor_trial_id: the trial it cloned.
    :param donor_checkpoint: path of the donor's checkpoint that was copied into the trial.
    :param old_config: the trial's config before the exploit.
    :param new_config: its config from then on: the donor's, explored.
    :param operations: dotted config key -> what explore did, e.g. ``{"lr": "0.01 * 1.2"}``.
    :param replaced_results: the trial's results after ``iteration`` when it was recorded (the state
        it gave up), in iteration order; they left its results, so its new ones take their place.
    :param created_at: when it was recorded (UTC).
    :param fresh: True when this call recorded it, False when it was stored already.
    """

    id: int
    trial_id: str
    experiment_run_id: int | None
    iteration: int
    donor_trial_id: str
    donor_checkpoint: str
    old_config: dict[str, Any]
    new_config: dict[str, Any]
    operations: dict[str, str]
    replaced_results: list[dict[str, Any]]
    created_at: datetime
    fresh: bool = False


@dataclass(frozen=True)
class RunExtensionRecord:
    """One extension of a finished experiment run (``airflow-trials extend``).

    :param id: primary key.
    :param experiment_run_id: the run it extends; its trials stay in that run.
    :param dag_run_id: the Airflow DAG run that extends it.
    :param created_at: when it was recorded (UTC). :param ended_at: when it ended; None while
        RUNNING.
    :param num_samples_added: new trials asked for.
    :param stop_before: the stopping criterion before; None when unchanged.
    :param stop_after: the raised stopping criterion; None when unchanged.
    :param trials_continued: ids of the TERMINATED trials that continue from their latest
        checkpoint. :param trials_added: ids of the new trials.
    :param status: RUNNING, SUCCESS or FAILED.
    """

    id: int
    experiment_run_id: int
    dag_run_id: str
    created_at: datetime
    ended_at: datetime | None
    num_samples_added: int
    stop_before: dict[str, Any] | None
    stop_after: dict[str, Any] | None
    trials_continued: list[str]
    trials_added: list[str]
    status: ExperimentRunStatus

    def changes(self) -> str:
        """What it changed, in words (the CLI's and the dashboard's line)."""
        parts = []
        if self.num_samples_added:
            parts.append(f"+{self.num_samples_added} samples")
        if self.stop_after:
            parts.append(f"stop {self.stop_before or {}} -> {self.stop_after}")
        if self.trials_continued:
            parts.append(f"{len(self.trials_continued)} trials continued")
        return ", ".join(parts) or "nothing"


@dataclass(frozen=True)
class RunApprovalRecord:
    """The answer to one DAG run's ``approve_best`` (``tuning_experiment(approval=True)``), as
    recorded beside the experiment run when the person answered.

    :param id: primary key.
    :param experiment_run_id: the run whose best trial was asked about.
    :param dag_run_id: the Airflow DAG run whose ``approve_best`` asked (an extension's DAG run
        asks again about the same run).
    :param trial_id: the best trial the person was shown.
    :param outcome: what the answer counts as (:class:`~airflow_trials.core.approval_rule
        .ApprovalOutcome`); only APPROVED lets ``publish_best`` publish, and REJECTED is final.
    :param responded_by_id: the user's id, as Airflow's HITL detail gives it.
    :param responded_by_name: the user's name.
    :param responded_at: when they answered (UTC).
    :param reason: the reason they gave ("" when none).
    :param triggered_by: the user who triggered the DAG run; None when no user did.
    :param recorded_at: when it was recorded (UTC).
    """

    id: int
    experiment_run_id: int
    dag_run_id: str
    trial_id: str
    outcome: ApprovalOutcome
    responded_by_id: str
    responded_by_name: str
    responded_at: datetime
    reason: str
    triggered_by: str | None
    recorded_at: datetime

    def describe(self) -> str:
        """The decision in words (the CLI's and the dashboard's line)."""
        who = f"{self.responded_by_name} (id {self.responded_by_id})"
        why = refusal(self.outcome, who, self.triggered_by) or f"approved by {who}"
        return f"{why}; reason: {self.reason or '(none given)'}"
