"""``airflow-trials db delete-run``: prune a finished experiment run, its rows and its checkpoints.

Modelled on ``airflow db clean``: it says what it will delete, asks (``--yes`` does not),
``--dry-run`` deletes nothing. The rows go first, in one transaction
(``TrialStore.delete_experiment_run``, which refuses a RUNNING run); then the checkpoints the
rows named, through the storage (a local path or an fsspec URL such as ``s3://``), so that a
checkpoint is never left named by a row whose file is gone.
"""

from __future__ import annotations

import os
from typing import Annotated, Any

import typer

from airflow_trials.cli.common import (
    AsJson,
    CliError,
    DbUrl,
    Output,
    RunOption,
    db_app,
    guard,
    out,
    output_format,
    resolve_run,
)
from airflow_trials.cli.output import OutputFormat, print_document
from airflow_trials.cli.trials_db import open_for_reading


@db_app.command("delete-run")
def delete_run(
    ctx: typer.Context,
    experiment: Annotated[str, typer.Argument(help="The experiment the run belongs to.")],
    run: RunOption = "latest",
    storage_path: Annotated[
        str | None,
        typer.Option(
            "--storage-path",
            help="The trials' storage (a path or URL such as s3://bucket/trials): also delete "
            "each trial's folder there (logs, trial.json). Without it only the checkpoints the "
            "trials DB names are deleted.",
        ),
    ] = None,
    keep_checkpoints: Annotated[
        bool,
        typer.Option("--keep-checkpoints", help="Delete the rows only; leave the files."),
    ] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Say what would be deleted; delete nothing.")
    ] = False,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
    db_url: DbUrl = None,
    output: Output = None,
    as_json: AsJson = False,
) -> None:
    """Delete a finished experiment run: its rows in the trials DB (the run, its trials, their
    results, checkpoints, rungs, median points and exploits) in one transaction, then its
    checkpoint files. A RUNNING run is refused."""

    def body() -> None:
        from airflow_trials.store import TrialStore

        fmt = output_format(output, as_json)
        reader = open_for_reading(ctx, db_url)  # it exists, with this version's schema
        url = reader.url
        reader.dispose()
        store = TrialStore(url)
        try:
            record = resolve_run(store, experiment, run)
            plan = store.delete_experiment_run(record.id, dry_run=True)
            if dry_run:
                _report(fmt, plan, [], [], keep_checkpoints)
                return
            if not yes:
                _report(OutputFormat.TABLE, plan, [], [], keep_checkpoints, stream=True)
                if not typer.confirm("Delete them?", default=False):
                    raise CliError(
                        f"Nothing was deleted of run {plan.run_key}; pass --yes to delete "
                        "without asking."
                    )
            done = store.delete_experiment_run(record.id)
        finally:
            store.dispose()
        deleted, failed = ([], []) if keep_checkpoints else _delete_files(done, storage_path)
        _report(fmt, done, deleted, failed, keep_checkpoints)
        if failed:
            raise CliError(
                f"The rows of run {done.run_key} are deleted, but {len(failed)} checkpoint or "
                f"trial folder(s) could not be: {failed[0][0]} ({failed[0][1]}); delete them by "
                "hand."
            )

    guard(body)


def _delete_files(done: Any, storage_path: str | None) -> tuple[list[str], list[tuple[str, str]]]:
    """Delete the run's live checkpoints (and with ``storage_path`` its trials' folders): the
    paths deleted, and ``(path, why)`` of those that could not be."""
    from airflow_trials.exceptions import CheckpointError
    from airflow_trials.execution.storage import TrialStorage

    targets: list[tuple[Any, str]] = []
    for path in done.checkpoint_paths:  # each on the storage its own path names
        targets.append((TrialStorage(os.path.dirname(path.rstrip("/"))), path))
    if storage_path is not None:
        storage = TrialStorage(storage_path)
        for trial_id in done.trial_ids:
            targets.append((storage, storage.trial_dir(done.experiment_name, trial_id)))
            targets.append(
                (storage, os.path.dirname(storage.log_paths(done.experiment_name, trial_id)[0]))
            )
    deleted, failed = [], []
    for storage, path in dict.fromkeys(targets):  # each once, in order
        try:
            storage.delete(path)
        except CheckpointError as e:
            failed.append((path, str(e)))
        else:
            deleted.append(path)
    return deleted, failed


def _report(
    fmt: OutputFormat,
    deletion: Any,
    deleted: list[str],
    failed: list[tuple[str, str]],
    keep_checkpoints: bool,
    *,
    stream: bool = False,
) -> None:
    """What was (or, for a dry run or before asking, would be) deleted."""
    verb = "would delete" if deletion.dry_run else "deleted"
    if fmt in (OutputFormat.JSON, OutputFormat.YAML):
        print_document(
            {
                "experiment": deletion.experiment_name,
                "experiment_run_id": deletion.experiment_run_id,
                "run_key": deletion.run_key,
                "status": deletion.status,
                "dry_run": deletion.dry_run,
                "rows": deletion.rows,
                "checkpoints": len(deletion.checkpoint_paths),
                "files_deleted": deleted,
                "files_not_deleted": [{"path": p, "error": e} for p, e in failed],
                "checkpoints_kept": keep_checkpoints,
            },
            fmt,
        )
        return
    lines = [
        f"Run {deletion.run_key} (id {deletion.experiment_run_id}, {deletion.status}) of "
        f"experiment {deletion.experiment_name}: {verb} "
        f"{sum(deletion.rows.values())} rows:",
        *(f"  {table}: {count}" for table, count in deletion.rows.items()),
    ]
    files = len(deletion.checkpoint_paths)
    if keep_checkpoints:
        lines.append(f"  {files} checkpoint(s) kept on the storage (--keep-checkpoints)")
    elif deletion.dry_run or stream:
        lines.append(f"  and then {files} checkpoint(s) on the storage")
    else:
        lines.append(f"  and {len(deleted)} checkpoint(s) or trial folder(s) on the storage")
    if deletion.dry_run and not stream:
        lines.append("Dry run: nothing was deleted.")
    out.print("\n".join(lines), highlight=False, soft_wrap=True)
