"""The trials-DB commands: ``db upgrade``, ``pool set``, ``experiments``, ``runs``,
``leaderboard`` and ``plot`` (``trials`` is in :mod:`~airflow_trials.cli.trials_cmd`)."""

from __future__ import annotations

import os
from typing import Annotated, Any

import typer

from airflow_trials.cli.boards import (
    LEADERBOARD_LIMIT,
    leaderboard_rows,
    print_pareto_leaderboard,
    ranked_leaderboard,
    say_cut,
)
from airflow_trials.cli.common import (
    MAX_COUNT,
    AsJson,
    CliError,
    DbUrl,
    Output,
    RunOption,
    app,
    db_app,
    guard,
    out,
    output_format,
    pool_app,
    recorded_metrics,
    resolve_run,
    several_metrics,
)
from airflow_trials.cli.output import (
    OutputFormat,
    emit,
    jsonable,
    leaderboard_cells,
    print_document,
)
from airflow_trials.cli.trials_db import checked_url, open_for_reading, resolve_db_url

_TIME = "%Y-%m-%d %H:%M"


def safe_url(url: str) -> str:
    """The URL with its password masked (SQLAlchemy imported here: `--help` need not load it)."""
    from airflow_trials.store.engine import safe_url as masked

    return masked(url)


# -- db and pool ---------------------------------------------------------------------------------
@db_app.command("upgrade")
def db_upgrade(ctx: typer.Context, db_url: DbUrl = None) -> None:
    """Create or upgrade the trials DB schema (idempotent); the only command that creates a DB."""

    def body() -> None:
        from airflow_trials.store import migrate

        url, source = resolve_db_url(ctx, db_url, create_dir=True)
        migrate(checked_url(url, source))
        out.print(
            f"Trials DB at {safe_url(url)} (from {source}) is up to date.",
            highlight=False,
            soft_wrap=True,
        )

    guard(body)


@pool_app.command("set")
def pool_set(
    gpus: Annotated[
        int, typer.Option("--gpus", min=0, max=MAX_COUNT, help="GPUs the pool stands for.")
    ],
    name: Annotated[str, typer.Option("--name")] = "gpu",
    slots_per_gpu: Annotated[int, typer.Option("--slots-per-gpu", min=1, max=MAX_COUNT)] = 4,
    output: Output = None,
    as_json: AsJson = False,
) -> None:
    """Create or update the GPU pool (GPUs x slots per GPU slots, include_deferred) in Airflow's DB,
    which must exist and be migrated (airflow db migrate)."""

    def body() -> None:
        fmt = output_format(output, as_json)
        from airflow_trials.pools import ensure_gpu_pool

        pool, slots = ensure_gpu_pool(gpus, name=name, slots_per_gpu=slots_per_gpu)
        if fmt is OutputFormat.TABLE:
            out.print(
                f"Pool {pool}: {slots} slots ({gpus} GPUs x {slots_per_gpu}), "
                "include_deferred=True",
                highlight=False,
            )
            return
        emit(
            out,
            fmt,
            {"pool": pool, "slots": slots, "include_deferred": True},
            ["pool", "slots", "include_deferred"],
            [[pool, str(slots), "True"]],
        )

    guard(body)


# -- listings ------------------------------------------------------------------------------------
@app.command("experiments")
def experiments(
    ctx: typer.Context, db_url: DbUrl = None, output: Output = None, as_json: AsJson = False
) -> None:
    """List experiments."""

    def body() -> None:
        fmt = output_format(output, as_json)
        store = open_for_reading(ctx, db_url)
        records = store.list_experiments()
        runs_per_experiment = _count_by(r.experiment_name for r in store.list_experiment_runs())
        # Several metrics as their lists (stored as one JSON string); one metric as it is.
        goals = {e.name: recorded_metrics(store, e.name) for e in records}
        rows = [
            [
                e.name,
                _listed(goals[e.name][0]),
                _listed(goals[e.name][1]),
                str(runs_per_experiment.get(e.name, 0)),
                e.created_at.strftime(_TIME),
            ]
            for e in records
        ]
        emit(
            out,
            fmt,
            [
                {**jsonable(e), "metric": goals[e.name][0], "mode": goals[e.name][1]}
                for e in records
            ],
            ["experiment", "metric", "mode", "runs", "created"],
            rows,
            empty=f"No experiments yet in the trials DB at {safe_url(store.url)}: no experiment "
            "DAG "
            "has run against it.",
        )

    guard(body)


@app.command("runs")
def runs(
    ctx: typer.Context,
    experiment: Annotated[str | None, typer.Argument(help="Only this experiment's runs.")] = None,
    db_url: DbUrl = None,
    output: Output = None,
    as_json: AsJson = False,
) -> None:
    """List experiment runs (one per DAG run)."""

    def body() -> None:
        fmt = output_format(output, as_json)
        store = open_for_reading(ctx, db_url)
        records = store.list_experiment_runs(experiment)
        if experiment and not records:
            resolve_run(store, experiment, "latest")  # raises: says which experiments there are
        trials_per_run = store.trial_counts()
        rows = [
            [
                str(r.id),
                r.experiment_name,
                r.run_key,
                r.status.value,
                str(trials_per_run.get(r.id, 0)),
                r.created_at.strftime(_TIME),
            ]
            for r in records
        ]
        emit(
            out,
            fmt,
            records,
            ["id", "experiment", "run key", "status", "trials", "created"],
            rows,
            empty=f"No experiment runs yet in the trials DB at {safe_url(store.url)}: no "
            "experiment "
            "DAG has run against it.",
        )

    guard(body)


def _listed(value: str | list[str] | None) -> str:
    if isinstance(value, list):
        return ", ".join(value)
    return value or "-"


def _count_by(keys: Any) -> dict[Any, int]:
    counts: dict[Any, int] = {}
    for key in keys:
        counts[key] = counts.get(key, 0) + 1
    return counts


@app.command("leaderboard")
def leaderboard(
    ctx: typer.Context,
    experiment: str,
    run: RunOption = "latest",
    metric: Annotated[str | None, typer.Option(help="Default: the experiment's metric.")] = None,
    mode: Annotated[str | None, typer.Option(help="min or max; default: the experiment's.")] = None,
    limit: Annotated[
        int,
        typer.Option(
            min=0,
            max=MAX_COUNT,
            help="At most this many rows (the best first); 0 for every trial of the run.",
        ),
    ] = LEADERBOARD_LIMIT,
    db_url: DbUrl = None,
    output: Output = None,
    as_json: AsJson = False,
) -> None:
    """Rank a run's trials by their best value of the metric. Of an experiment with several
    metrics (and no --metric), rank them by Pareto rank (0 = the front) over each trial's last
    result, then by the first metric in its mode, then by trial id. Of an experiment with
    constraints, the trials whose last result meets them come first (a feasible column)."""

    def body() -> None:
        fmt = output_format(output, as_json)
        store = open_for_reading(ctx, db_url)
        several = several_metrics(store, experiment, metric, mode)
        if several is not None:
            exp_run = resolve_run(store, experiment, run)
            print_pareto_leaderboard(store, fmt, experiment, exp_run, *several, limit)
            return
        # The rows shown, and the run's board: the best and front every screen names
        # (store/board.py), from one read.
        exp_run, metric_, mode_, board, ranked = ranked_leaderboard(
            store, experiment, run, metric, mode, limit
        )
        columns, rows = leaderboard_cells(board, metric_, mode_)
        emit(
            out,
            fmt,
            {
                "experiment": experiment,
                "run_key": exp_run.run_key,
                "metric": metric_,
                "mode": mode_,
                "constraints": store.get_experiment(experiment).constraint_spec,
                "best_trial_id": ranked.best_trial_id,
                "front_trial_ids": ranked.front_trial_ids,
                "rows": board,
            },
            columns,
            rows,
            title=f"{experiment} / {exp_run.run_key}",
            empty=f"Run {exp_run.run_key} of {experiment} has no trials yet.",
        )
        say_cut(fmt, len(board), ranked.num_trials if limit else len(board))

    guard(body)


# -- plot ----------------------------------------------------------------------------------------
def _png_path(output: str) -> str:
    """The absolute path ``--out`` names, once it can be a PNG file written there."""
    path = os.path.abspath(os.path.expanduser(output))
    if os.path.isdir(path):
        raise CliError(
            f"--out {output} is a directory; name a .png file in it, e.g. "
            f"--out {os.path.join(path, 'learning_curves.png')}."
        )
    if not path.lower().endswith(".png"):
        raise CliError(f"--out must name a .png file, got {output!r}.")
    folder = os.path.dirname(path)
    if not os.path.isdir(folder):
        raise CliError(
            f"--out {output}: the folder {folder} does not exist; create it (mkdir -p {folder}) "
            "or name a file in an existing folder."
        )
    return path


@app.command("plot")
def plot(
    ctx: typer.Context,
    experiment: str,
    out_path: Annotated[
        str, typer.Option("--out", help="PNG file to write.")
    ] = "learning_curves.png",
    run: RunOption = "latest",
    metric: Annotated[str | None, typer.Option(help="Default: the experiment's metric.")] = None,
    mode: Annotated[
        str | None,
        typer.Option(help="min or max, to pick the best trial; default: the experiment's."),
    ] = None,
    db_url: DbUrl = None,
    output: Output = None,
    as_json: AsJson = False,
) -> None:
    """Plot every trial's metric per iteration to a PNG, the best trial highlighted."""

    def body() -> None:
        fmt = output_format(output, as_json)
        target = _png_path(out_path)
        store = open_for_reading(ctx, db_url)
        exp_run, metric_, mode_, board = leaderboard_rows(
            store, experiment, run, metric, mode, None
        )
        best = board[0].trial_id if board and board[0].best_value is not None else None
        path, trials = _draw_run(
            store,
            exp_run,
            metric_,
            best,
            target,
            f"{experiment} / {exp_run.run_key}: {metric_} ({mode_})",
        )
        _print_written(fmt, {"path": path, "trials": trials, "best_trial_id": best})

    guard(body)


def _draw_run(
    store: Any, exp_run: Any, metric: str, best: str | None, target: str, title: str
) -> tuple[str, int]:
    """Draw every trial of the run's ``metric`` per iteration to the PNG ``target``: its path and
    the trials drawn."""
    from airflow_trials.plotting import curves_from_results, plot_learning_curves

    results = {
        t.trial_id: store.get_results(t.trial_id)
        for t in store.list_trials(experiment_run_id=exp_run.id)
    }
    try:
        path = plot_learning_curves(
            curves_from_results(results, metric),
            target,
            metric=metric,
            best_trial_id=best,
            title=title,
        )
    except OSError as e:
        raise CliError(
            f"Could not write {target}: {e.strerror or e}; name a file in a folder you "
            "may write to with --out."
        ) from e
    return path, len(results)


def _print_written(fmt: OutputFormat, document: dict[str, Any]) -> None:
    """Say which PNG was written, of how many trials and which best, in the format asked."""
    path, trials, best = document["path"], document["trials"], document["best_trial_id"]
    if fmt is OutputFormat.TABLE:
        out.print(
            f"Wrote {path} ({trials} trials, best {best}).",
            highlight=False,
            soft_wrap=True,
        )
    elif fmt is OutputFormat.PLAIN:
        emit(
            out,
            fmt,
            document,
            ["path", "trials", "best_trial_id"],
            [[path, str(trials), best or "-"]],
        )
    else:
        print_document(document, fmt)
