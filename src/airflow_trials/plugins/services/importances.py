"""A run's hyperparameter importances on the dashboard: Optuna's evaluators over the run's trials
that count (ended TERMINATED, docs/store.md "Which trials count", as Optuna takes its COMPLETE
trials only): their configs and their best values of the metric, as the leaderboard ranks them;
a page with a bar chart, and its JSON.

The importances are on a page of their own (``/runs/{run}/importances``, linked from the run
page), not on the run page: at 1,000 trials building Optuna's study and evaluating it takes from
0.7 to 1.5 s on a loaded 2-core machine (docs/dashboard.md, "Performance"), which the run page
(refreshed every 10 s while the run is live) should not pay.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Query, status

from airflow_trials.core.constraints import counted_values
from airflow_trials.core.importances import (
    DEFAULT_EVALUATOR,
    EVALUATORS,
    EvaluatorUnavailableError,
    ImportancesError,
    prepare_importances,
)
from airflow_trials.plugins.datamodels.importances import RunImportances, run_subject
from airflow_trials.plugins.web import reads
from airflow_trials.searchers.optuna_importances import evaluate_importances
from airflow_trials.store import TrialReader

Evaluator = Annotated[
    str,
    Query(
        pattern=f"^({'|'.join(EVALUATORS)})$",
        description="ped-anova (default; Optuna's default evaluator) or fanova (needs "
        "scikit-learn on the api-server).",
    ),
]


def run_importances(
    store: TrialReader,
    user: Any,
    run_pk: int,
    metric: str | None,
    mode: str | None,
    evaluator: str = DEFAULT_EVALUATOR,
) -> RunImportances:
    """The importances of the run's hyperparameters for ``metric`` (default the experiment's;
    the first of several), from each trial's best value as the leaderboard ranks it, of the
    trials that count only (ended TERMINATED, as Optuna's COMPLETE trials)."""
    run = reads.experiment_run(store, user, run_pk)
    metric_, mode_ = reads.goal(store, run, metric, mode)
    metrics = list(reads.run_goal(store, run).metrics)
    if metric_ not in metrics:
        metrics = [metric_, *metrics]
    board = store.leaderboard(run.id, metric_, mode_)
    importances, problem, code = None, None, status.HTTP_200_OK
    try:
        data = prepare_importances(
            [row.config for row in board],
            # Only the trials that count (docs/store.md "Which trials count"), as Optuna.
            counted_values([row.status for row in board], [row.best_value for row in board]),
            metric=metric_,
            mode=mode_,
            subject=run_subject(run),
            search_space=run.search_space,
            trial_ids=[row.trial_id for row in board],
        )
        importances = evaluate_importances(data, evaluator)
    except EvaluatorUnavailableError as e:
        problem, code = str(e), status.HTTP_501_NOT_IMPLEMENTED
    except ImportancesError as e:
        problem, code = str(e), status.HTTP_409_CONFLICT
    return RunImportances(
        run=run,
        metric=metric_,
        mode=mode_,
        metrics=metrics,
        evaluator=evaluator,
        num_trials=len(board),
        importances=importances,
        problem=problem,
        status_code=code,
    )
