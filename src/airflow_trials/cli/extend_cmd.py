"""``airflow-trials extend RUN --num-samples +N --stop training_iteration=M``: extend a finished
experiment run with more samples and/or a raised stop, as a new DAG run of its DAG whose params
name the run (:mod:`airflow_trials.experiment.extension`); and ``extensions RUN``: list them."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from airflow_trials.cli.common import (
    AsJson,
    CliError,
    DbUrl,
    Output,
    app,
    guard,
    out,
    output_format,
)
from airflow_trials.cli.output import emit
from airflow_trials.cli.trials_db import open_for_reading

_TIME = "%Y-%m-%d %H:%M"

RunArgument = Annotated[
    str, typer.Argument(help="The run: its id, or its run key (the Airflow run id).")
]
NumSamples = Annotated[
    int,
    typer.Option(
        "--num-samples",
        help="New samples: +N (N >= 0). As Ray Tune's num_samples, a sample is one pass over the "
        "search space's grid (N x its combinations trials, the random keys drawn afresh); a "
        "space that draws nothing at random is refused.",
    ),
]
DryRun = Annotated[
    bool, typer.Option("--dry-run", help="Print what it would do (the plan); trigger nothing.")
]
ExperimentOption = Annotated[
    str | None,
    typer.Option("--experiment", help="The run's experiment, when a run key names runs of two."),
]


def find_run(store: Any, run: str, experiment: str | None) -> Any:
    """The run ``run`` names (an id or a run key), in ``experiment`` if given."""
    runs = [r for r in store.list_experiment_runs(experiment) if run in (str(r.id), r.run_key)]
    if not runs:
        where = f"experiment {experiment}" if experiment else "the trials DB"
        raise CliError(
            f"No run {run!r} in {where}; name a run by an id or run key that "
            "'airflow-trials runs' lists."
        )
    if len(runs) > 1:
        names = ", ".join(sorted({r.experiment_name for r in runs}))
        raise CliError(
            f"Run key {run!r} names runs of several experiments ({names}); pass --experiment."
        )
    return runs[0]


def parse_stop(values: list[str]) -> dict[str, float] | None:
    """``["training_iteration=20"]`` as ``{"training_iteration": 20}``."""
    stop: dict[str, float] = {}
    for value in values:
        key, sep, number = value.partition("=")
        try:
            parsed = float(number)
        except ValueError:
            parsed = float("nan")
        if not sep or not key or parsed != parsed:
            raise CliError(
                f"--stop {value!r} is not METRIC=NUMBER; e.g. --stop training_iteration=20."
            )
        stop[key] = int(parsed) if parsed.is_integer() else parsed
    return stop or None


def inferred_stop(store: Any, run: Any, stop: dict[str, float] | None) -> dict[str, float] | None:
    """The run's stopping criterion: its latest extension's, else what the trials its criterion
    stopped had reached of the keys asked for (the DAG file's is known to the DAG run only)."""
    from airflow_trials.core.stop_kind import StopKind

    for extension in reversed(store.list_run_extensions(run.id)):
        if extension.stop_after:
            return dict(extension.stop_after)
    met = [
        dict(t.last_result or {})
        for t in store.list_trials(experiment_run_id=run.id)
        if t.stop_kind is StopKind.CRITERION
    ]
    reached = {
        key: max(r[key] for r in met if key in r)
        for key in stop or {}
        if any(key in r for r in met)
    }
    return reached or None


@app.command("extend")
def extend(
    ctx: typer.Context,
    run: RunArgument,
    num_samples: NumSamples = 0,
    stop: Annotated[
        list[str] | None,
        typer.Option("--stop", help="A raised stop, METRIC=NUMBER; repeat for several."),
    ] = None,
    experiment: ExperimentOption = None,
    dry_run: DryRun = False,
    db_url: DbUrl = None,
) -> None:
    """Extend a finished run: trigger a DAG run of its DAG that continues its TERMINATED trials
    to a raised stop (from their latest checkpoints) and adds new samples to its search."""

    def body() -> None:
        from airflow_trials.core.run_extension import describe_new_samples, plan_extension

        store = open_for_reading(ctx, db_url)
        record = find_run(store, run, experiment)
        owner = f"Run {record.run_key} (id {record.id}) of experiment {record.experiment_name}"
        wanted = parse_stop(stop or [])
        plan = plan_extension(
            owner=owner,
            run_status=record.status.value,
            trials=store.list_trials(experiment_run_id=record.id),
            stop_before=inferred_stop(store, record, wanted),
            stop=wanted,
            num_samples=num_samples,
            has_checkpoint=lambda t: store.latest_checkpoint(t) is not None,
            space_before=record.search_space,
        )
        if not record.dag_id:
            raise CliError(f"{owner} was not run by an Airflow DAG; only a DAG's run extends.")
        conf = {
            "extend_run": record.run_key,
            "extend_num_samples": num_samples,
            "extend_stop": wanted,
        }
        if not dry_run:  # before anything is printed: the trigger needs the deployment's DB
            require_deployment(record.dag_id)
        _print_plan(owner, describe_new_samples(num_samples, record.search_space), plan)
        if dry_run:
            out.print(
                f"Dry run: would trigger DAG {record.dag_id} with conf {conf}; nothing was done.",
                highlight=False,
                soft_wrap=True,
            )
            return
        dag_run_id = trigger_extension(record.dag_id, conf)
        out.print(
            f"Triggered DAG run {dag_run_id} of DAG {record.dag_id}. Follow it with "
            f"'airflow dags list-runs {record.dag_id}' and 'airflow-trials extensions "
            f"{record.id}'.",
            highlight=False,
            soft_wrap=True,
        )

    guard(body)


def _print_plan(owner: str, samples: str, plan: Any) -> None:
    """What the extension does: its new samples (``samples``, as
    :func:`~airflow_trials.core.run_extension.describe_new_samples` says them), its stop, the
    trials that continue and why each other keeps its end."""
    out.print(
        f"{owner}: {samples}; stop {plan.stop_after or 'unchanged'}; "
        f"{len(plan.continued)} trials continue ({', '.join(plan.continued) or 'none'}).",
        highlight=False,
        soft_wrap=True,
    )
    for trial_id, why in plan.kept:
        out.print(f"Trial {trial_id} keeps its end: {why}.", highlight=False, soft_wrap=True)


def require_deployment(dag_id: str) -> None:
    """Refuse, creating nothing, unless Airflow's metadata DB (AIRFLOW_HOME's, or
    ``AIRFLOW__DATABASE__SQL_ALCHEMY_CONN``) exists and is migrated: an empty AIRFLOW_HOME is
    not the deployment that runs ``dag_id``, and Airflow's ORM would create an empty
    ``airflow.db`` there before failing on its missing tables."""
    from airflow_trials.pools import require_migrated_airflow_db

    require_migrated_airflow_db(
        f"trigger DAG {dag_id}",
        fix=(
            "point AIRFLOW_HOME (or AIRFLOW__DATABASE__SQL_ALCHEMY_CONN) at the Airflow "
            f"deployment that runs DAG {dag_id} (the main job's is its state directory's "
            "airflow/, ./.state/airflow), then retry; nothing was triggered"
        ),
    )


def trigger_extension(dag_id: str, conf: dict[str, Any]) -> str:
    """Trigger a run of ``dag_id`` with ``conf`` in Airflow's metadata DB (AIRFLOW_HOME's, as
    ``pool set`` writes it); its run id."""
    require_deployment(dag_id)
    from airflow.api.common.trigger_dag import trigger_dag
    from airflow.exceptions import AirflowException
    from airflow.utils.types import DagRunTriggeredByType
    from sqlalchemy.exc import SQLAlchemyError

    try:
        dag_run = trigger_dag(dag_id, triggered_by=DagRunTriggeredByType.CLI, conf=conf)
    except AirflowException as e:
        raise CliError(
            f"Airflow could not trigger DAG {dag_id}: {e}. Check that its DAG file is parsed "
            "(airflow dags list) and AIRFLOW_HOME names the deployment's metadata DB."
        ) from e
    except SQLAlchemyError as e:
        cause = " ".join(str(getattr(e, "orig", None) or e).split())
        raise CliError(
            f"Airflow could not trigger DAG {dag_id}: its metadata DB failed "
            f"({type(e).__name__}: {cause}). Check that AIRFLOW_HOME names the deployment that "
            "runs the DAG and that its DB is up and migrated (airflow db check-migrations)."
        ) from e
    if dag_run is None:
        raise CliError(f"Airflow triggered no run of DAG {dag_id}; is it parsed and unpaused?")
    return str(dag_run.run_id)


@app.command("extensions")
def extensions(
    ctx: typer.Context,
    run: RunArgument,
    experiment: ExperimentOption = None,
    db_url: DbUrl = None,
    output: Output = None,
    as_json: AsJson = False,
) -> None:
    """List a run's extensions: which DAG run, when, what changed, and how each ended."""

    def body() -> None:
        fmt = output_format(output, as_json)
        store = open_for_reading(ctx, db_url)
        record = find_run(store, run, experiment)
        records = store.list_run_extensions(record.id)
        rows = [
            [
                str(e.id),
                e.dag_run_id,
                e.created_at.strftime(_TIME),
                e.changes(),
                str(len(e.trials_added)),
                e.status.value,
            ]
            for e in records
        ]
        emit(
            out,
            fmt,
            records,
            ["id", "dag run", "created", "changes", "new trials", "status"],
            rows,
            empty=f"Run {record.run_key} of experiment {record.experiment_name} has no extension.",
        )

    guard(body)
