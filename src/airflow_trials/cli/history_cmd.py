"""``airflow-trials history EXPERIMENT``: the experiment's runs, each with its best, trial count,
failures, stop kinds and the config keys its best changed from the previous run's."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from airflow_trials.cli.common import (
    MAX_COUNT,
    AsJson,
    DbUrl,
    Output,
    app,
    guard,
    out,
    output_format,
)
from airflow_trials.cli.output import OutputFormat, emit
from airflow_trials.cli.trials_db import open_for_reading

_TIME = "%Y-%m-%d %H:%M"

Last = Annotated[
    int | None,
    typer.Option(
        "--last", min=1, max=MAX_COUNT, help="Only the N newest runs (default: every run)."
    ),
]


@app.command("history")
def history(
    ctx: typer.Context,
    experiment: Annotated[str, typer.Argument(help="The experiment.")],
    last: Last = None,
    db_url: DbUrl = None,
    output: Output = None,
    as_json: AsJson = False,
) -> None:
    """An experiment's runs, oldest first: each run's best value of the metric, trials, errors,
    failed tries, stop kinds (completed, early-stopped, errored, unfinished), best trial, the
    config keys changed from the previous run's best, and the run it was warm-started from."""

    def body() -> None:
        fmt = output_format(output, as_json)
        store = open_for_reading(ctx, db_url)
        found = store.experiment_history(experiment, last)
        rows = [_cells(line) for line in found.runs]
        if fmt is OutputFormat.TABLE and found.several_metrics:
            out.print(
                f"Experiment {experiment} ranks by several metrics; each run's best is its best "
                f"{found.metric} ({found.mode}) alone, the first of them.",
                highlight=False,
                soft_wrap=True,
            )
        emit(
            out,
            fmt,
            {
                "experiment": experiment,
                "metric": found.metric,
                "mode": found.mode,
                "several_metrics": found.several_metrics,
                "runs": [_document(line) for line in found.runs],
            },
            _columns(found.metric),
            rows,
            title=_title(experiment, found),
            empty=f"Experiment {experiment} has no runs yet.",
        )

    guard(body)


def _columns(metric: str | None) -> list[str]:
    return [
        "run_key",
        "date (UTC)",
        "status",
        "trials",
        f"best {metric}" if metric else "best",
        "best trial",
        "errored",
        "failed tries",
        "completed",
        "early-stopped",
        "unfinished",
        "changed keys",
        "warm-started from",
    ]


def _title(experiment: str, found: Any) -> str:
    """The table's title: how many runs, and by which metric they rank."""
    title = f"{experiment}: history of {len(found.runs)} runs"
    if found.metric is not None:
        title += f", best {found.metric} ({found.mode})"
    if found.several_metrics:
        title += f", the first of its metrics ({', '.join(found.experiment.metrics)})"
    return title


def _cells(line: Any) -> list[str]:
    warm = line.warm_started_from
    kinds = line.stop_kinds
    return [
        line.run.run_key,
        line.run.created_at.strftime(_TIME),
        line.run.status.value,
        str(line.num_trials),
        "-" if line.best_value is None else f"{line.best_value:.6g}",
        line.best_trial_id or "-",
        str(line.num_errored),
        str(line.num_failed_tries),
        str(kinds["completed"]),
        str(kinds["early_stopped"]),
        str(kinds["unfinished"]),
        ", ".join(line.changed_keys) or "-",
        "-" if warm is None else (warm.run_key or str(warm.experiment_run_id)),
    ]


def _document(line: Any) -> dict[str, Any]:
    run = line.run
    return {
        "run_id": run.id,
        "run_key": run.run_key,
        "dag_id": run.dag_id,
        "dag_run_id": run.run_id,
        "status": run.status,
        "created_at": run.created_at,
        "ended_at": run.ended_at,
        "num_trials": line.num_trials,
        "num_errored": line.num_errored,
        "num_failed_tries": line.num_failed_tries,
        "stop_kinds": line.stop_kinds,
        "best_value": line.best_value,
        "best_trial_id": line.best_trial_id,
        "best_config": line.best_config,
        "previous_run_id": line.previous_run_id,
        "changed_keys": line.changed_keys,
        "warm_started_from": line.warm_started_from,
        "picked_trial_id": run.picked_trial_id,
    }
