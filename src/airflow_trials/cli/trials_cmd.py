"""The ``trials`` command: one run's trials, with why each stopped, and of an experiment with
several metrics each one's last value and Pareto rank."""

from __future__ import annotations

import math
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
    several_metrics,
)
from airflow_trials.cli.output import OutputFormat, emit, number
from airflow_trials.cli.trials_db import open_for_reading
from airflow_trials.core.stop_kind import StopKind

EarlyStopped = Annotated[
    bool,
    typer.Option(
        "--early-stopped",
        help="Only the trials their scheduler stopped early (stop kind 'scheduler': not at its "
        "whole budget max_t), as the dashboard marks them.",
    ),
]


@app.command("trials")
def trials(
    ctx: typer.Context,
    experiment: str,
    run: RunOption = "latest",
    early_stopped: EarlyStopped = False,
    db_url: DbUrl = None,
    output: Output = None,
    as_json: AsJson = False,
) -> None:
    """Show one run's trials: status, failures, best metric, best and latest checkpoints, and why
    each TERMINATED trial stopped (its criterion, or its scheduler: "stopped by ASHA at ...").
    Of an experiment with several metrics, the best column is the first metric's, then come each
    metric's value in the trial's last result and its Pareto rank over them (as ``leaderboard``
    ranks). JSON and YAML also give each trial's ASHA rungs and PBT lineage."""

    def body() -> None:
        fmt = output_format(output, as_json)
        store = open_for_reading(ctx, db_url)
        several = several_metrics(store, experiment, None, None)
        first, first_mode = (several[0][0], several[1][0]) if several else (None, None)
        exp_run, metric, _, board = leaderboard_rows(
            store, experiment, run, first, first_mode, None
        )
        rows = _trial_rows(
            store, exp_run.id, metric, board, fmt in (OutputFormat.JSON, OutputFormat.YAML)
        )
        metric_columns = several[0] if several else []
        if several:
            _add_last_values_and_ranks(store, exp_run.id, several, rows)
        if early_stopped:
            rows = [row for row in rows if row["stop_kind"] == StopKind.SCHEDULER.value]
        empty = (
            f"No trial of run {exp_run.run_key} of {experiment} was stopped early by its scheduler."
            if early_stopped and board
            else f"Run {exp_run.run_key} of {experiment} has no trials yet."
        )
        emit(
            out,
            fmt,
            {"experiment": experiment, "run": exp_run, "trials": rows},
            _trial_headers(metric, metric_columns, bool(several)),
            [_trial_cells(row, metric, metric_columns, bool(several)) for row in rows],
            title=f"{experiment} / {exp_run.run_key}",
            empty=empty,
        )

    guard(body)


def _trial_rows(
    store: Any, run_pk: int, metric: str, board: list[Any], decisions: bool
) -> list[dict[str, Any]]:
    """One dict per trial, by trial id; with ``decisions``, its ASHA rungs and PBT lineage too
    (two queries for the whole run)."""
    records = {t.trial_id: t for t in store.list_trials(experiment_run_id=run_pk)}
    rungs = store.rungs_of_run(run_pk) if decisions else {}
    lineages = store.lineages_of_run(run_pk) if decisions else {}
    rows = []
    for r in sorted(board, key=lambda r: r.trial_id):
        record = records[r.trial_id]
        row = {
            "trial_id": r.trial_id,
            "status": r.status.value,
            "num_failures": r.num_failures,
            "iterations": (record.last_result or {}).get("training_iteration", 0),
            f"best_{metric}": r.best_value,
            "best_checkpoint": r.best_checkpoint,
            "latest_checkpoint": r.latest_checkpoint,
            "config": r.config,
            "error": (record.error_msg or "").strip().splitlines()[-1:] or None,
            "stop_reason": record.stop_reason,
            "stop_kind": None if record.stop_kind is None else record.stop_kind.value,
        }
        if decisions:
            row["rungs"] = [_rung(rung) for rung in rungs.get(r.trial_id, [])]
            row["lineage"] = [_exploit(e) for e in lineages.get(r.trial_id, [])]
        rows.append(row)
    return rows


def _rung(rung: Any) -> dict[str, Any]:
    value = None if math.isnan(rung.value) else rung.value  # JSON has no NaN
    return {
        "milestone": rung.milestone,
        "iteration": rung.iteration,
        "value": value,
        "decision": rung.decision.value,
        "at_end": rung.at_end,
        "reason": rung.reason,
        "bracket": rung.bracket,
    }


#: What JSON and YAML give of each exploit in a trial's PBT lineage.
_EXPLOIT_FIELDS = (
    "trial_id",
    "donor_trial_id",
    "iteration",
    "donor_checkpoint",
    "old_config",
    "new_config",
    "operations",
    "created_at",
)


def _exploit(exploit: Any) -> dict[str, Any]:
    return {name: getattr(exploit, name) for name in _EXPLOIT_FIELDS}


def _add_last_values_and_ranks(
    store: Any, run_pk: int, several: tuple[list[str], list[str]], rows: list[dict[str, Any]]
) -> None:
    """With several metrics: each one's value in the trial's last result, and its Pareto rank
    over them, as `leaderboard` ranks the run (its best column is the first metric's)."""
    pareto = store.pareto_leaderboard(run_pk, several[0], several[1])
    placed = {place.trial_id: place for place in pareto.rows}
    for row in rows:
        place = placed.get(row["trial_id"])
        row["values"] = dict(place.values) if place else dict.fromkeys(several[0])
        row["pareto_rank"] = place.pareto_rank if place else None


def _trial_headers(metric: str, metric_columns: list[str], several: bool) -> list[str]:
    return [
        "trial",
        "status",
        "failures",
        "iterations",
        f"best {metric}",
        *(f"last {name}" for name in metric_columns),
        *(["pareto rank"] if several else []),
        "best checkpoint",
        "latest checkpoint",
        "stop reason",
    ]


def _trial_cells(
    row: dict[str, Any], metric: str, metric_columns: list[str], several: bool
) -> list[str]:
    return [
        row["trial_id"],
        row["status"],
        str(row["num_failures"]),
        str(row["iterations"]),
        number(row[f"best_{metric}"]),
        *(number(row["values"][name]) for name in metric_columns),
        *(["-" if row["pareto_rank"] is None else str(row["pareto_rank"])] if several else []),
        row["best_checkpoint"] or "-",
        row["latest_checkpoint"] or "-",
        row["stop_reason"] or "-",
    ]
