"""``airflow-trials importances``: which hyperparameters mattered to a run's metric, by Optuna's
PED-ANOVA (default) or fANOVA over the run's trials and their best values."""

from __future__ import annotations

import enum
from typing import Annotated, Any

import typer

from airflow_trials.cli.boards import leaderboard_rows
from airflow_trials.cli.common import (
    AsJson,
    DbUrl,
    Output,
    RunOption,
    app,
    guard,
    out,
    output_format,
    recorded_goal,
)
from airflow_trials.cli.output import OutputFormat, emit
from airflow_trials.cli.trials_db import open_for_reading


class EvaluatorName(enum.StrEnum):
    """``--evaluator``: :data:`airflow_trials.core.importances.EVALUATORS`."""

    PED_ANOVA = "ped-anova"
    FANOVA = "fanova"


@app.command("importances")
def importances(
    ctx: typer.Context,
    experiment: str,
    run: RunOption = "latest",
    metric: Annotated[
        str | None,
        typer.Option(help="Default: the experiment's metric (the first of several)."),
    ] = None,
    mode: Annotated[str | None, typer.Option(help="min or max; default: the experiment's.")] = None,
    evaluator: Annotated[
        EvaluatorName,
        typer.Option(
            case_sensitive=False,
            help="ped-anova (Optuna's default; numpy only) or fanova (a random forest; needs "
            "scikit-learn).",
        ),
    ] = EvaluatorName.PED_ANOVA,
    db_url: DbUrl = None,
    output: Output = None,
    as_json: AsJson = False,
) -> None:
    """Rank a run's hyperparameters by their importance to the metric: each trial's config
    against its best value (as the leaderboard ranks it), through Optuna's importance
    evaluators. Only the trials that ended TERMINATED count (as Optuna's COMPLETE trials);
    the others, those without a value of the metric, and keys with one value in every trial,
    are left out and counted. Exits 1 when there are too few trials to tell."""

    def body() -> None:
        fmt = output_format(output, as_json)
        store = open_for_reading(ctx, db_url)
        recorded = recorded_goal(store, experiment)
        chosen = metric or recorded.first().metric  # of several, the first
        exp_run, metric_, mode_, board = leaderboard_rows(
            store, experiment, run, chosen, mode, None
        )
        found = _evaluate(exp_run, metric_, mode_, board, evaluator.value)
        document = _document(experiment, exp_run, metric_, mode_, list(recorded.metrics), found)
        columns = ["rank", "hyperparameter", "importance", "evaluated on"]
        rows = [
            [str(rank), p.name, f"{p.importance:.4f}", _domain(p.spec)]
            for rank, p in enumerate(found.params, start=1)
        ]
        emit(
            out,
            fmt,
            document,
            columns,
            rows,
            title=f"{experiment} / {exp_run.run_key}: importances of {mode_} {metric_} "
            f"({found.evaluator})",
        )
        if fmt is OutputFormat.TABLE:
            _print_counts(found, metric_, len(board))

    guard(body)


def _document(
    experiment: str, exp_run: Any, metric: str, mode: str, metrics: list[str], found: Any
) -> dict[str, Any]:
    """What JSON and YAML print: the run, its goal and each hyperparameter's importance."""
    return {
        "experiment": experiment,
        "run_key": exp_run.run_key,
        "run_id": exp_run.id,
        "metric": metric,
        "mode": mode,
        "metrics": metrics,
        "evaluator": found.evaluator,
        "trials": found.num_trials,
        "skipped": found.num_skipped,
        "constant": found.constant,
        "notes": found.notes,
        "importances": [_param(p) for p in found.params],
    }


def _print_counts(found: Any, metric: str, trials: int) -> None:
    """Under the table: the trials counted of the run's, what was left out, and the notes."""
    skipped = (
        f"; {found.num_skipped} without {metric} or not TERMINATED left out"
        if found.num_skipped
        else ""
    )
    constant = f"; the same in every trial: {', '.join(found.constant)}" if found.constant else ""
    out.print(
        f"From {found.num_trials} of {trials} trials{skipped}{constant}.",
        highlight=False,
        soft_wrap=True,
    )
    for note in found.notes:
        out.print(f"Note: {note}", highlight=False, soft_wrap=True)


def _evaluate(exp_run: Any, metric: str, mode: str, board: list[Any], evaluator: str) -> Any:
    """The importances of the leaderboard's trials: read from the cache when these trials, values
    and settings were computed before (:mod:`~airflow_trials.searchers.importances_cache`), else
    computed, which imports Optuna (seconds: its ``optuna.importance`` imports scikit-learn)."""
    from airflow_trials.core.constraints import counted_values
    from airflow_trials.core.importances import prepare_importances
    from airflow_trials.searchers.importances_cache import ImportancesCache

    data = prepare_importances(
        [row.config for row in board],
        # Only the trials that count (docs/store.md "Which trials count"), as Optuna.
        counted_values([row.status for row in board], [row.best_value for row in board]),
        metric=metric,
        mode=mode,
        subject=f"run {exp_run.run_key} (id {exp_run.id}) of experiment {exp_run.experiment_name}",
        search_space=exp_run.search_space,
        trial_ids=[row.trial_id for row in board],
    )
    return ImportancesCache().get_or_compute(data, evaluator, _quietly_evaluated)


def _quietly_evaluated(data: Any, evaluator: str) -> Any:
    """``evaluate_importances``, without Optuna's "A new study created in memory" line on stderr,
    which says nothing to whoever asked."""
    import optuna

    from airflow_trials.searchers.optuna_importances import evaluate_importances

    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        return evaluate_importances(data, evaluator)
    finally:
        optuna.logging.set_verbosity(verbosity)


def _param(p: Any) -> dict[str, Any]:
    spec = p.spec
    return {
        "name": p.name,
        "importance": p.importance,
        "kind": spec.kind,
        "low": spec.low,
        "high": spec.high,
        "log": spec.log,
        "choices": list(spec.choices),
        "from_search_space": spec.from_search_space,
    }


def _domain(spec: Any) -> str:
    if spec.kind == "categorical":
        shown = ", ".join(str(c) for c in spec.choices[:6])
        more = f", ... ({len(spec.choices)})" if len(spec.choices) > 6 else ""
        return f"one of {shown}{more}"
    scale = ", log" if spec.log else ""
    return f"{spec.kind} {spec.low:.4g} to {spec.high:.4g}{scale}"
