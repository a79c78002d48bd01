"""A run's JSON: its leaderboard page and its Pareto front."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, Field

from airflow_trials.core.stop_kind import StopKind
from airflow_trials.plugins.datamodels.experiments import RunOut
from airflow_trials.store import ExperimentRunRecord
from airflow_trials.store.records import CheckpointRecordRow


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


# -- the JSON API --------------------------------------------------------------------------------


class ParetoPointOut(BaseModel):
    trial_id: str
    x: float = Field(description="Its value of the x metric, in its last result.")
    y: float = Field(description="Its value of the y metric, in its last result.")
    pareto_rank: int | None = Field(description="Over all the experiment's metrics; 0 = front.")
    on_front: bool
    on_step: bool = Field(description="On the front's step line drawn through x and y.")
    feasible: bool | None = Field(description="Meets the constraints; null without any.")
    url: str


class ParetoOut(BaseModel):
    """A run's trials on two of its experiment's metrics, and its Pareto front."""

    run_id: int
    metrics: list[str]
    modes: list[str]
    x: str
    y: str
    constraints: bool = Field(description="The experiment has constraints.")
    picked_trial_id: str | None = Field(
        description="The trial select_best picked in the run; null until it picked one."
    )
    left_out: int = Field(description="Trials without a finite value of x or y (not plotted).")
    points: list[ParetoPointOut] = Field(description="In leaderboard order.")

    @classmethod
    def of(cls, view: ParetoView, trial_url: Any) -> ParetoOut:
        on_step = {p.trial_id for p in view.step}
        return cls(
            run_id=view.run.id,
            metrics=view.metrics,
            modes=view.modes,
            x=view.x,
            y=view.y,
            constraints=view.constrained,
            picked_trial_id=view.picked,
            left_out=view.left_out,
            points=[
                ParetoPointOut(
                    trial_id=p.trial_id,
                    x=p.x,
                    y=p.y,
                    pareto_rank=p.pareto_rank,
                    on_front=p.on_front,
                    on_step=p.trial_id in on_step,
                    feasible=p.feasible,
                    url=trial_url(p.trial_id),
                )
                for p in view.points
            ],
        )


@dataclass(frozen=True)
class Point:
    """One trial on the scatter.

    :param trial_id: the trial.
    :param x: its value of the x metric (last result).
    :param y: its value of the y metric.
    :param pareto_rank: its rank over all the experiment's metrics (0 = the front).
    :param feasible: meets the experiment's constraints; None without constraints.
    """

    trial_id: str
    x: float
    y: float
    pareto_rank: int | None
    feasible: bool | None

    @property
    def on_front(self) -> bool:
        return self.pareto_rank == 0


@dataclass(frozen=True)
class ParetoView:
    """A run's trials on two of its metrics.

    :param run: the run.
    :param metrics: the experiment's metrics; ``x`` and ``y`` are two of them.
    :param modes: one per metric.
    :param x: the horizontal metric.
    :param y: the vertical metric.
    :param points: the trials with a finite value of both, in leaderboard order.
    :param left_out: how many trials of the run have no value of one of them.
    :param step: the front's step line: the front trials no other front trial beats on both
        ``x`` and ``y`` (with two metrics, the whole front), sorted by ``x``.
    :param constrained: the experiment has constraints.
    :param picked: the trial ``select_best`` picked, when it picked one; default None.
    """

    run: ExperimentRunRecord
    metrics: list[str]
    modes: list[str]
    x: str
    y: str
    points: list[Point]
    left_out: int
    step: list[Point]
    constrained: bool
    picked: str | None = None

    def mode(self, metric: str) -> str:
        return self.modes[self.metrics.index(metric)]
