"""A run's hyperparameter importances as JSON."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, Field

from airflow_trials.core.importances import Importances
from airflow_trials.plugins.datamodels.experiments import RunOut
from airflow_trials.store import ExperimentRunRecord


class ParamImportanceOut(BaseModel):
    """One hyperparameter's share of the importance, and the distribution it was evaluated on."""

    name: str = Field(description="The config key; nested keys joined with '/'.")
    importance: float = Field(description="Its share, 0 to 1; the shares sum to 1.")
    kind: str = Field(description="float, int or categorical.")
    low: float | None = Field(description="The smallest value (numbers); null for categories.")
    high: float | None = Field(description="The largest value (numbers); null for categories.")
    log: bool = Field(description="Evaluated on a log scale.")
    choices: list[Any] = Field(description="The categories; empty for numbers.")
    from_search_space: bool = Field(
        description="The run's recorded search space gave the distribution; false: inferred "
        "from the values the trials took."
    )


class ImportancesOut(BaseModel):
    """A run's hyperparameter importances for one metric, most important first."""

    run: RunOut
    metric: str
    mode: str
    metrics: list[str] = Field(description="The experiment's metrics; ?metric= picks one.")
    evaluator: str = Field(description="ped-anova or fanova.")
    trials: int = Field(description="Trials the importances were computed from.")
    skipped: int = Field(
        description="Trials left out: no value of the metric (failed, or not reported yet)."
    )
    constant: list[str] = Field(description="Config keys left out: one value in every trial.")
    notes: list[str] = Field(description="What the evaluator warned about.")
    importances: list[ParamImportanceOut]

    @classmethod
    def of(cls, found: RunImportances, run_url: str) -> ImportancesOut:
        result = found.importances
        if result is None:  # the route answers found.problem instead
            raise ValueError(f"No importances for {run_subject(found.run)}: {found.problem}")
        return cls(
            run=RunOut.of(found.run, found.num_trials, run_url),
            metric=found.metric,
            mode=found.mode,
            metrics=found.metrics,
            evaluator=found.evaluator,
            trials=result.num_trials,
            skipped=result.num_skipped,
            constant=result.constant,
            notes=result.notes,
            importances=[
                ParamImportanceOut(
                    name=p.name,
                    importance=p.importance,
                    kind=p.spec.kind,
                    low=p.spec.low,
                    high=p.spec.high,
                    log=p.spec.log,
                    choices=list(p.spec.choices),
                    from_search_space=p.spec.from_search_space,
                )
                for p in result.params
            ],
        )


@dataclass(frozen=True)
class RunImportances:
    """A run's importances for one metric, or why there are none.

    :param run: the experiment run.
    :param metric: the metric they are of.
    :param mode: ``"min"`` or ``"max"``.
    :param metrics: the experiment's metrics (a choice with several), the metric first if not
        recorded.
    :param evaluator: ``"ped-anova"`` or ``"fanova"``.
    :param num_trials: the run's trials, usable or not.
    :param importances: the ranking; None when it cannot be computed.
    :param problem: why not (too few trials, scikit-learn missing); None when computed.
    :param status_code: the API's answer for ``problem``: 409 (the run's trials cannot tell yet)
        or 501 (fANOVA without scikit-learn on the api-server); 200 with importances.
    """

    run: ExperimentRunRecord
    metric: str
    mode: str
    metrics: list[str]
    evaluator: str
    num_trials: int
    importances: Importances | None
    problem: str | None
    status_code: int


def run_subject(run: ExperimentRunRecord) -> str:
    """How messages name a run: ``run manual__1 (id 3) of experiment mnist``."""
    return f"run {run.run_key} (id {run.id}) of experiment {run.experiment_name}"
