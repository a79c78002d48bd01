"""``airflow-trials db end-run EXPERIMENT --run RUN --reason TEXT``: end by hand a run that nothing
else will end.

A run ends when its ``select_best`` runs. A DAG run marked failed (or success) in Airflow runs no
more of its tasks, ``select_best`` included, so its run stays RUNNING in the trials DB, and
``extend`` and ``db delete-run`` refuse it. This command ends it as ``select_best`` does, through
the store's one way of ending a run (``TrialStore.finish_experiment_run``), with the status and
the reason given (kept as the run's ``end_reason``); a RUNNING extension of it ends with it
(``end_run_extension``).

A run that has ended already is refused. So is one with a trial that has not ended (PENDING,
RUNNING or PAUSED), since its task may still write; ``--force`` records each such trial ERROR
first, through the store's one status setter (``Transition.ABANDONED``, as ``select_best`` records
a trial whose task ended without recording its end), its error saying who ended it and why. It
stops nothing on Ray: the trigger of a trial task that Airflow marks failed stops its trial there
(``on_kill``).
"""

from __future__ import annotations

import enum
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

#: The unended trials an error names, at most; it counts the others.
_NAMED = 10


class EndStatus(enum.StrEnum):
    """The status a run ends with."""

    FAILED = "FAILED"
    SUCCESS = "SUCCESS"


RunToEnd = Annotated[
    str,
    typer.Option(
        "--run",
        help="The experiment run to end: its id or its run key (Airflow run_id); 'latest' only "
        "when named. Required.",
    ),
]
Reason = Annotated[
    str,
    typer.Option(
        "--reason",
        help="Why you end it, e.g. 'DAG run marked failed: the cluster was lost'. Kept as the "
        "run's end_reason ('airflow-trials runs -o json'). Required.",
    ),
]
Status = Annotated[
    EndStatus,
    typer.Option(
        "--status",
        case_sensitive=False,
        help="The status it ends with: FAILED (default) or SUCCESS (it then counts as a "
        "successful run: the previous run for warm_start and the regression check).",
    ),
]
Force = Annotated[
    bool,
    typer.Option(
        "--force",
        help="Also end its trials that have not ended (PENDING, RUNNING, PAUSED): each is "
        "recorded ERROR, its error naming this command and the reason. Without it such a run "
        "is refused. Only once no task will run them: it stops nothing on Ray.",
    ),
]


@db_app.command("end-run")
def end_run(
    ctx: typer.Context,
    experiment: Annotated[str, typer.Argument(help="The experiment the run belongs to.")],
    run: RunToEnd,
    reason: Reason,
    status: Status = EndStatus.FAILED,
    force: Force = False,
    db_url: DbUrl = None,
    output: Output = None,
    as_json: AsJson = False,
) -> None:
    """End a RUNNING run that select_best will not end (its DAG run was marked failed in
    Airflow), as select_best ends one: FAILED (or --status SUCCESS) with --reason. A run that has
    ended is refused; so is one with a trial not ended, unless --force records those trials
    ERROR. Afterwards 'db delete-run' and 'extend' accept it."""

    def body() -> None:
        fmt = output_format(output, as_json)
        why = reason.strip()
        if not why:
            raise CliError(
                "--reason is empty; say why you end the run, e.g. --reason 'DAG run "
                "marked failed: the cluster was lost'."
            )
        reader = open_for_reading(ctx, db_url)  # it exists, with this version's schema
        url = reader.url
        reader.dispose()
        from airflow_trials.store import TrialStore

        store = TrialStore(url)
        try:
            ended = _end(store, resolve_run(store.reader, experiment, run), status, why, force)
        finally:
            store.dispose()
        _report(fmt, ended)

    guard(body)


def _end(store: Any, record: Any, status: EndStatus, reason: str, force: bool) -> dict[str, Any]:
    """End the run (its unended trials first, with ``force``) and its RUNNING extension; what
    was ended."""
    from airflow_trials.core.fate import Transition
    from airflow_trials.store.experiments import already_ended
    from airflow_trials.store.records import ExperimentRunStatus

    owner = f"Run {record.run_key} (id {record.id}) of experiment {record.experiment_name}"
    if record.status.is_terminal():
        raise CliError(
            already_ended(
                record.run_key,
                record.id,
                record.experiment_name,
                record.status.value,
                record.ended_at,
            )
        )
    trials = store.reader.list_trials(experiment_run_id=record.id)
    unended = [t for t in trials if not t.status.is_terminal()]
    if unended and not force:
        raise CliError(
            f"{owner} has {len(unended)} trial(s) that have not ended: {_named(unended)}. Their "
            "tasks may still run and write, so nothing was changed. Wait for them to end (a "
            "trial task marked failed in Airflow records its trial's end within seconds), or, "
            "once no task will run them, pass --force to record them ERROR with your reason."
        )
    for trial in unended:
        store.record_transition(
            trial.trial_id,
            Transition.ABANDONED,
            why=f"Trial {trial.trial_id} was {trial.status.value} when its run "
            f"{record.run_key} was ended by hand ('airflow-trials db end-run --force'): {reason}",
        )
    store.finish_experiment_run(record.id, status.value, reason=reason, if_running=True)
    extensions = [
        e.dag_run_id
        for e in store.reader.list_run_extensions(record.id)
        if e.status is ExperimentRunStatus.RUNNING
    ]
    for dag_run_id in extensions:  # at most one extends a run at a time
        store.end_run_extension(record.id, dag_run_id, status.value)
    return {
        "experiment": record.experiment_name,
        "experiment_run_id": record.id,
        "run_key": record.run_key,
        "status": status.value,
        "reason": reason,
        "trials_ended": [
            {"trial_id": t.trial_id, "was": t.status.value, "status": "ERROR"} for t in unended
        ],
        "extensions_ended": extensions,
    }


def _named(trials: list[Any]) -> str:
    named = ", ".join(f"{t.trial_id} ({t.status.value})" for t in trials[:_NAMED])
    more = len(trials) - _NAMED
    return named + (f" and {more} more" if more > 0 else "")


def _report(fmt: OutputFormat, ended: dict[str, Any]) -> None:
    if fmt in (OutputFormat.JSON, OutputFormat.YAML):
        print_document(ended, fmt)
        return
    lines = [
        f"Run {ended['run_key']} (id {ended['experiment_run_id']}) of experiment "
        f"{ended['experiment']}: RUNNING -> {ended['status']}; reason: {ended['reason']}",
        *(f"  trial {t['trial_id']}: {t['was']} -> ERROR" for t in ended["trials_ended"]),
        *(
            f"  its extension by DAG run {dag_run_id}: RUNNING -> {ended['status']}"
            for dag_run_id in ended["extensions_ended"]
        ),
    ]
    out.print("\n".join(lines), highlight=False, soft_wrap=True)
