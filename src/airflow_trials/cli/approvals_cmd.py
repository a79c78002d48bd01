"""``airflow-trials approvals EXPERIMENT``: the answers to a run's ``approve_best``
(``tuning_experiment(approval=True)``), as the trials DB recorded them: who, when, why, who
triggered the DAG run, and whether it let ``publish_best`` publish."""

from __future__ import annotations

from typing import Annotated

import typer

from airflow_trials.cli.common import (
    AsJson,
    DbUrl,
    Output,
    RunOption,
    app,
    guard,
    out,
    output_format,
    resolve_run,
)
from airflow_trials.cli.output import emit
from airflow_trials.cli.trials_db import open_for_reading

_TIME = "%Y-%m-%d %H:%M:%S"
_COLUMNS = (
    "DAG run",
    "answered (UTC)",
    "trial",
    "outcome",
    "by",
    "triggered by",
    "publishes",
    "reason",
)


@app.command("approvals")
def approvals(
    ctx: typer.Context,
    experiment: Annotated[str, typer.Argument(help="The experiment.")],
    run: RunOption = "latest",
    db_url: DbUrl = None,
    output: Output = None,
    as_json: AsJson = False,
) -> None:
    """The answers to a run's approve_best, one per DAG run that asked: outcome, who answered,
    when, who triggered the DAG run, and the reason. Only APPROVED published the best trial; a
    REJECTED answer is final."""

    def body() -> None:
        fmt = output_format(output, as_json)
        store = open_for_reading(ctx, db_url)
        record = resolve_run(store, experiment, run)
        found = store.run_approvals(record.id)
        rows = [
            [
                a.dag_run_id,
                a.responded_at.strftime(_TIME),
                a.trial_id,
                a.outcome.value,
                f"{a.responded_by_name} (id {a.responded_by_id})",
                a.triggered_by or "-",
                "yes" if a.outcome.publishes() else "no",
                a.reason or "-",
            ]
            for a in found
        ]
        emit(
            out,
            fmt,
            found,
            _COLUMNS,
            rows,
            title=f"{experiment} / {record.run_key}: approvals",
            empty=f"No answer to approve_best is recorded for run {record.run_key} of "
            f"experiment {experiment}: it was not declared with approval=True, or nobody has "
            "answered yet.",
        )

    guard(body)
