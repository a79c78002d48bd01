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

#: The most trials a request evaluates: Optuna's evaluators read every trial that counts, and took
#: 12 s over 100,000 (docs/benchmarks.md, issue 53); a larger run is refused, pointing to the CLI.
MAX_TRIALS = 10_000

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
    num_trials = store.trial_counts().get(run.id, 0)
    problem: str | None
    if num_trials > MAX_TRIALS:
        importances, problem = None, _too_many(run, num_trials, metric_)
        code = status.HTTP_409_CONFLICT
    else:
        board = store.leaderboard(run.id, metric_, mode_)
        num_trials = len(board)
        importances, problem, code = _evaluate(run, board, metric_, mode_, evaluator)
    return RunImportances(
        run=run,
        metric=metric_,
        mode=mode_,
        metrics=metrics,
        evaluator=evaluator,
        num_trials=num_trials,
        importances=importances,
        problem=problem,
        status_code=code,
    )


def _evaluate(
    run: Any, board: list[Any], metric: str, mode: str, evaluator: str
) -> tuple[Any, str | None, int]:
    """The importances of ``board``'s trials, or why there are none and the status code."""
    try:
        data = prepare_importances(
            [row.config for row in board],
            # Only the trials that count (docs/store.md "Which trials count"), as Optuna.
            counted_values([row.status for row in board], [row.best_value for row in board]),
            metric=metric,
            mode=mode,
            subject=run_subject(run),
            search_space=run.search_space,
            trial_ids=[row.trial_id for row in board],
        )
        return evaluate_importances(data, evaluator), None, status.HTTP_200_OK
    except EvaluatorUnavailableError as e:
        return None, str(e), status.HTTP_501_NOT_IMPLEMENTED
    except ImportancesError as e:
        return None, str(e), status.HTTP_409_CONFLICT


def _too_many(run: Any, num_trials: int, metric: str) -> str:
    """Why a run's importances are not evaluated on a request, and where to get them."""
    return (
        f"Run {run.id} of experiment {run.experiment_name} has {num_trials:,} trials; the "
        f"dashboard evaluates importances over at most {MAX_TRIALS:,} (each request evaluates "
        "every trial that counts, seconds at this size). Run airflow-trials importances "
        f"{run.experiment_name} --run {run.id} --metric {metric} instead."
    )
