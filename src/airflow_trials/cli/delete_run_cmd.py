"""``airflow-trials db delete-run``: prune a finished experiment run, its rows and its checkpoints.

Modelled on ``airflow db clean``: it says what it will delete, path by path, asks (``--yes`` does
not), ``--dry-run`` deletes nothing. The rows go first, in one transaction
(``TrialStore.delete_experiment_run``, which refuses a RUNNING run or one with a trial not ended);
then the checkpoints the rows named, through the storage (a local path or an fsspec URL such as
``s3://``), so that a checkpoint is never left named by a row whose file is gone.

Only paths below the storage root (``--storage-path``, else the configured one) are deleted: when
a row names any other place, the whole delete is refused before anything changes.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Annotated, Any

import typer

from airflow_trials.cli.common import (
    AsJson,
    CliError,
    DbUrl,
    Output,
    db_app,
    guard,
    out,
    output_format,
    resolve_run,
)
from airflow_trials.cli.output import OutputFormat, print_document
from airflow_trials.cli.trials_db import open_for_reading

RunToDelete = Annotated[
    str,
    typer.Option(
        "--run",
        help="The experiment run to delete: its id or its run key (Airflow run_id); "
        "'latest' only when named. Required.",
    ),
]
StoragePath = Annotated[
    str | None,
    typer.Option(
        "--storage-path",
        help="The trials' storage root (a path or URL such as s3://bucket/trials): only "
        "what lies below it is deleted, and each trial's folder there (logs, trial.json) "
        "is deleted too. Without it the configured root (\\[airflow_trials] storage_path, "
        "AIRFLOW_TRIALS_STORAGE) bounds the deletes and only the checkpoints the trials DB "
        "names are deleted.",
    ),
]
KeepCheckpoints = Annotated[
    bool, typer.Option("--keep-checkpoints", help="Delete the rows only; leave the files.")
]
DryRun = Annotated[
    bool, typer.Option("--dry-run", help="Say what would be deleted; delete nothing.")
]
Yes = Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")]


@db_app.command("delete-run")
def delete_run(
    ctx: typer.Context,
    experiment: Annotated[str, typer.Argument(help="The experiment the run belongs to.")],
    run: RunToDelete,
    storage_path: StoragePath = None,
    keep_checkpoints: KeepCheckpoints = False,
    dry_run: DryRun = False,
    yes: Yes = False,
    db_url: DbUrl = None,
    output: Output = None,
    as_json: AsJson = False,
) -> None:
    """Delete a finished experiment run: its rows in the trials DB (the run, its trials, their
    results, checkpoints, rungs, median points and exploits) in one transaction, then its
    checkpoint files below the storage root. A RUNNING run, a run with a trial not ended, and a
    run whose rows name a path outside the storage root are refused, and nothing is deleted."""

    def body() -> None:
        from airflow_trials.storage.trial_storage import TrialStorage, configured_storage_root
        from airflow_trials.store import TrialStore

        fmt = output_format(output, as_json)
        storage = TrialStorage(storage_path or configured_storage_root())
        check = None if keep_checkpoints else _inside(storage, experiment, run)
        reader = open_for_reading(ctx, db_url)  # it exists, with this version's schema
        url = reader.url
        reader.dispose()
        store = TrialStore(url)
        try:
            record = resolve_run(store.reader, experiment, run)
            plan = store.delete_experiment_run(record.id, dry_run=True, check_paths=check)
            targets = {} if keep_checkpoints else _targets(plan, storage, storage_path is not None)
            if dry_run:
                _report(fmt, plan, [], [], keep_checkpoints, planned=list(targets))
                return
            if not yes:
                _confirm(plan, list(targets), keep_checkpoints)
            done = store.delete_experiment_run(record.id, check_paths=check)
        finally:
            store.dispose()
        deleted, failed = (
            ([], [])
            if keep_checkpoints
            else _delete_files(_targets(done, storage, storage_path is not None))
        )
        _report(fmt, done, deleted, failed, keep_checkpoints)
        if failed:
            raise CliError(
                f"The rows of run {done.run_key} are deleted, but {len(failed)} checkpoint or "
                f"trial folder(s) could not be: {failed[0][0]} ({failed[0][1]}); delete them by "
                "hand."
            )

    guard(body)


def _confirm(plan: Any, planned: list[str], keep_checkpoints: bool) -> None:
    """Show what would be deleted and ask; CliError, and nothing deleted, unless the answer is
    yes."""
    _report(OutputFormat.TABLE, plan, [], [], keep_checkpoints, stream=True, planned=planned)
    if not typer.confirm("Delete them?", default=False):
        raise CliError(
            f"Nothing was deleted of run {plan.run_key}; pass --yes to delete without asking."
        )


def _inside(storage: Any, experiment: str, run: str) -> Callable[[Sequence[str]], None]:
    """The store's check of the checkpoint paths, before it deletes a row: each must lie below
    the storage root, else the whole delete is refused."""
    from airflow_trials.storage.storage_root import is_inside

    def check(paths: Sequence[str]) -> None:
        outside = [path for path in paths if not is_inside(path, storage.root)]
        if outside:
            raise CliError(
                f"Run {run} of experiment {experiment}: the trials DB names {len(outside)} "
                f"checkpoint path(s) outside the storage root {storage.root}: "
                f"{', '.join(outside)}. Nothing was deleted. Pass --storage-path with the root "
                "the trials wrote to, or --keep-checkpoints to delete the rows only and remove "
                "those files by hand."
            )

    return check


def _targets(deletion: Any, storage: Any, trial_folders: bool) -> dict[str, Any]:
    """What is deleted, each path with the storage that deletes it (only below its root): the
    run's live checkpoints, and with ``trial_folders`` its trials' folders and their log folders,
    which are local (below ``local_log_path``) when the storage is a URL."""
    targets = dict.fromkeys(deletion.checkpoint_paths, storage)  # each once, in order
    if trial_folders:
        from airflow_trials.storage.trial_storage import TrialStorage

        logs = storage if storage.is_local else TrialStorage(storage.local_log_path)
        for trial_id in deletion.trial_ids:
            targets[storage.trial_dir(deletion.experiment_name, trial_id)] = storage
            log_dir = os.path.dirname(storage.log_paths(deletion.experiment_name, trial_id)[0])
            targets.setdefault(log_dir, logs)
    return targets


def _delete_files(targets: dict[str, Any]) -> tuple[list[str], list[tuple[str, str]]]:
    """Delete each path through its storage: the paths deleted, and ``(path, why)`` of those
    that could not be."""
    from airflow_trials.exceptions import CheckpointError

    deleted, failed = [], []
    for path, storage in targets.items():
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
    planned: Sequence[str] = (),
) -> None:
    """What was (or, for a dry run or before asking, would be: ``planned``) deleted."""
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
                "files_to_delete": list(planned),
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
        lines.append(f"  and then these {len(planned)} path(s) on the storage:")
        lines.extend(f"    {path}" for path in planned)
    else:
        lines.append(f"  and {len(deleted)} checkpoint(s) or trial folder(s) on the storage")
    if deletion.dry_run and not stream:
        lines.append("Dry run: nothing was deleted.")
    out.print("\n".join(lines), highlight=False, soft_wrap=True)
