"""``airflow-trials export mlflow EXPERIMENT --run RUN --tracking-uri URI``: one experiment run
and its trials, from the trials DB into MLflow (a parent run, one child run per trial)."""

from __future__ import annotations

import enum
from typing import Annotated, Any

import typer

from airflow_trials.cli.common import (
    AsJson,
    CliError,
    DbUrl,
    Output,
    RunOption,
    app,
    guard,
    out,
    output_format,
)
from airflow_trials.cli.output import OutputFormat, emit
from airflow_trials.cli.trials_db import open_for_reading

export_app = typer.Typer(
    help="Export an experiment run to another tool (MLflow).", no_args_is_help=True
)
app.add_typer(export_app, name="export")
#: --max-artifact-mb's ceiling, 1 TiB: a finite size that fits MlflowExport's byte count.
MAX_ARTIFACT_MB = 1024 * 1024


class Checkpoints(enum.StrEnum):
    """``--checkpoints``: :attr:`airflow_trials.export.MlflowExport.checkpoints`."""

    BEST = "best"
    ALL = "all"
    NONE = "none"


_COUNTS = [
    ("trials", "trials"),
    ("runs created", "runs_created"),
    ("runs updated", "runs_updated"),
    ("params logged", "params_logged"),
    ("metric points logged", "metrics_logged"),
    ("checkpoints logged", "artifacts_logged"),
    ("checkpoints referenced", "checkpoints_referenced"),
]


TrackingUri = Annotated[
    str | None,
    typer.Option(
        "--tracking-uri",
        envvar="MLFLOW_TRACKING_URI",
        help="The MLflow tracking server, e.g. http://mlflow:5000 (default: $MLFLOW_TRACKING_URI).",
    ),
]
MlflowExperiment = Annotated[
    str | None,
    typer.Option(
        "--mlflow-experiment", help="The MLflow experiment (default: the experiment's name)."
    ),
]
CheckpointsOption = Annotated[
    Checkpoints,
    typer.Option(
        case_sensitive=False,
        help="Whose best checkpoint is logged as an artifact: best (the run's best trial's), "
        "all (every trial's) or none; each is referenced by its URI all the same.",
    ),
]
MaxArtifactMb = Annotated[
    float,
    typer.Option(
        "--max-artifact-mb",
        min=0,
        max=MAX_ARTIFACT_MB,
        help="A checkpoint larger than this (MiB) is referenced by its URI, not logged.",
    ),
]
StoragePath = Annotated[
    str | None,
    typer.Option(
        "--storage-path",
        help="The trials' storage root (a path or URL such as s3://bucket/trials): only a "
        "checkpoint below it is read and logged; one the trials DB names elsewhere is "
        "referenced only. Default: the configured root (\\[airflow_trials] storage_path, "
        "AIRFLOW_TRIALS_STORAGE).",
    ),
]


@export_app.command("mlflow")
def export_mlflow(
    ctx: typer.Context,
    experiment: Annotated[str, typer.Argument(help="The experiment.")],
    run: RunOption = "latest",
    tracking_uri: TrackingUri = None,
    mlflow_experiment: MlflowExperiment = None,
    checkpoints: CheckpointsOption = Checkpoints.BEST,
    max_artifact_mb: MaxArtifactMb = 100.0,
    storage_path: StoragePath = None,
    db_url: DbUrl = None,
    output: Output = None,
    as_json: AsJson = False,
) -> None:
    """Export an experiment run and its trials to MLflow: a parent run for the run, one child
    run per trial with its config (params), every reported metric at its training_iteration
    (step), its status and stop reason (tags), and its best checkpoint (an artifact, or its URI
    in the tag airflow_trials.best_checkpoint when too large). Run it again to update: what was
    logged already is found by its tags and not logged twice. Needs mlflow, the mlflow extra
    of airflow-trials."""

    def body() -> None:
        fmt = output_format(output, as_json)
        from airflow_trials.export.mlflow import export_to_mlflow
        from airflow_trials.export.mlflow_mapping import MlflowExport

        if not tracking_uri:
            raise CliError(
                "No MLflow tracking URI: pass --tracking-uri (e.g. http://mlflow:5000) or set "
                "MLFLOW_TRACKING_URI."
            )
        settings = MlflowExport(
            tracking_uri=tracking_uri,
            experiment_name=mlflow_experiment,
            checkpoints=checkpoints.value,
            max_artifact_bytes=int(max_artifact_mb * 1024 * 1024),
        )
        store = open_for_reading(ctx, db_url)
        exp_run = store.resolve_run(experiment, run)
        summary = export_to_mlflow(store, exp_run, settings, storage_path)
        _print_summary(fmt, experiment, exp_run, summary)

    guard(body)


def _print_summary(fmt: OutputFormat, experiment: str, exp_run: Any, summary: Any) -> None:
    """Say what was exported where, in the format asked; the notes on the table only."""
    document = {
        "experiment": experiment,
        "run_key": exp_run.run_key,
        "run_id": exp_run.id,
        **summary.to_dict(),
    }
    if fmt is OutputFormat.TABLE:
        out.print(
            f"Exported {experiment} / {exp_run.run_key} to MLflow experiment "
            f"{summary.experiment_name} (id {summary.experiment_id}) at "
            f"{summary.tracking_uri}: parent run {summary.parent_run_id}.",
            highlight=False,
            soft_wrap=True,
        )
    emit(
        out,
        fmt,
        document,
        ["exported", "count"],
        [[label, str(document[key])] for label, key in _COUNTS],
    )
    for note in summary.notes if fmt is OutputFormat.TABLE else []:
        out.print(f"Note: {note}", highlight=False, soft_wrap=True)
