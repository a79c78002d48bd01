"""The ``airflow-trials`` command: the trials DB, GPU pool, experiments, leaderboards and plots."""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import asdict, is_dataclass
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(
    name="airflow-trials",
    help="Inspect and manage airflow_trials experiments (the trials DB, GPU pool, leaderboards, plots).",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
db_app = typer.Typer(help="The trials metadata database.", no_args_is_help=True)
pool_app = typer.Typer(help="The Airflow GPU pool.", no_args_is_help=True)
app.add_typer(db_app, name="db")
app.add_typer(pool_app, name="pool")

out = Console()
err = Console(stderr=True)
# Piped or redirected, a table is as wide as its content: ids, run keys and paths are never cut.
PIPED_WIDTH = 10_000

GlobalDbUrl = Annotated[
    str | None,
    typer.Option("--db-url", envvar="AIRFLOW_TRIALS_DB_URL",
                 help="Trials DB URL for every command (default: the SQLite file)."),
]
# No envvar here: a command's --db-url must win over the global one, and the environment must not.
DbUrl = Annotated[
    str | None,
    typer.Option("--db-url", help="Trials DB URL; wins over one given before the command."),
]
AsJson = Annotated[bool, typer.Option("--json", help="Machine-readable JSON on stdout.")]
RunOption = Annotated[
    str, typer.Option("--run", help="Experiment run: its id, its run key (Airflow run_id), or 'latest'.")
]


class CliError(Exception):
    """A user mistake or an unavailable resource: printed as one line, exit code 1."""


def _fail(message: str) -> None:
    err.print(f"[red]Error:[/red] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(1)


@app.callback()
def options(ctx: typer.Context, db_url: GlobalDbUrl = None) -> None:
    """Inspect and manage airflow_trials experiments (the trials DB, GPU pool, leaderboards, plots)."""
    ctx.obj = {"db_url": db_url}  # subcommands' contexts inherit obj
    out.width = None if out.is_terminal else PIPED_WIDTH  # type: ignore[assignment]  # None: the terminal's


def _db_url(ctx: typer.Context, db_url: str | None) -> str | None:
    """The command's own --db-url, else the one before the command (or AIRFLOW_TRIALS_DB_URL)."""
    return db_url or (ctx.obj or {}).get("db_url")


def _store(db_url: str | None) -> Any:
    from airflow_trials.store import TrialStore

    return TrialStore(db_url)


def _jsonable(value: Any) -> Any:
    if is_dataclass(value) and not isinstance(value, type):
        return {k: _jsonable(v) for k, v in asdict(value).items()}
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if hasattr(value, "isoformat"):
        return value.isoformat()
    if hasattr(value, "value") and not isinstance(value, (int, float, str)):
        return value.value
    return value


def _print_json(value: Any) -> None:
    sys.stdout.write(json.dumps(_jsonable(value), indent=2, sort_keys=True) + "\n")


def _guard(fn: Any) -> Any:
    """Run a command body; expected errors become one readable line and exit code 1."""
    from airflow_trials.exceptions import AirflowTrialsError

    try:
        return fn()
    except (CliError, AirflowTrialsError, ValueError, KeyError) as e:
        message = e.args[0] if isinstance(e, KeyError) and e.args else str(e)
        _fail(str(message).splitlines()[0])


def _resolve_run(store: Any, experiment: str, run: str) -> Any:
    runs = store.list_experiment_runs(experiment)
    if not runs:
        known = ", ".join(e.name for e in store.list_experiments()) or "none yet"
        raise CliError(f"Experiment {experiment!r} has no runs in {store!r} (experiments: {known}).")
    if run == "latest":
        return max(runs, key=lambda r: (r.created_at, r.id))
    for candidate in runs:
        if run in (str(candidate.id), candidate.run_key):
            return candidate
    raise CliError(
        f"Experiment {experiment!r} has no run {run!r}; pass --run with an id or run key from "
        f"'airflow-trials runs {experiment}', or 'latest'."
    )


def _metric_and_mode(store: Any, experiment: str, metric: str | None, mode: str | None) -> tuple[str, str]:
    record = next((e for e in store.list_experiments() if e.name == experiment), None)
    metric = metric or (record.metric if record else None)
    mode = mode or (record.mode if record else None) or "min"
    if not metric:
        raise CliError(f"Experiment {experiment!r} has no metric recorded; pass --metric.")
    if mode not in ("min", "max"):
        raise CliError(f"--mode must be 'min' or 'max', got {mode!r}.")
    return metric, mode


# -- db and pool ---------------------------------------------------------------------------------
@db_app.command("upgrade")
def db_upgrade(ctx: typer.Context, db_url: DbUrl = None) -> None:
    """Create or upgrade the trials DB schema (idempotent)."""

    def body() -> None:
        from airflow_trials.store import default_store_url, migrate

        url = _db_url(ctx, db_url) or default_store_url()
        migrate(url)
        out.print(f"Trials DB at {_store(url)!r} is up to date.", highlight=False)

    _guard(body)


@pool_app.command("set")
def pool_set(
    gpus: Annotated[int, typer.Option("--gpus", min=0, help="GPUs the pool stands for.")],
    name: Annotated[str, typer.Option("--name")] = "gpu",
    slots_per_gpu: Annotated[int, typer.Option("--slots-per-gpu", min=1)] = 4,
    as_json: AsJson = False,
) -> None:
    """Create or update the GPU pool (GPUs x slots per GPU slots, include_deferred) in Airflow's DB."""

    def body() -> None:
        from airflow_trials.pools import ensure_gpu_pool

        pool, slots = ensure_gpu_pool(gpus, name=name, slots_per_gpu=slots_per_gpu)
        if as_json:
            _print_json({"pool": pool, "slots": slots, "include_deferred": True})
        else:
            out.print(f"Pool {pool}: {slots} slots ({gpus} GPUs x {slots_per_gpu}), include_deferred=True")

    _guard(body)


# -- experiments ---------------------------------------------------------------------------------
@app.command("experiments")
def experiments(ctx: typer.Context, db_url: DbUrl = None, as_json: AsJson = False) -> None:
    """List experiments."""

    def body() -> None:
        store = _store(_db_url(ctx, db_url))
        rows = store.list_experiments()
        if as_json:
            return _print_json(rows)
        table = Table("experiment", "metric", "mode", "runs", "created")
        for e in rows:
            table.add_row(e.name, e.metric or "-", e.mode or "-", str(len(store.list_experiment_runs(e.name))),
                          e.created_at.strftime("%Y-%m-%d %H:%M"))
        out.print(table)

    _guard(body)


@app.command("runs")
def runs(
    ctx: typer.Context,
    experiment: Annotated[str | None, typer.Argument(help="Only this experiment's runs.")] = None,
    db_url: DbUrl = None,
    as_json: AsJson = False,
) -> None:
    """List experiment runs (one per DAG run)."""

    def body() -> None:
        store = _store(_db_url(ctx, db_url))
        rows = store.list_experiment_runs(experiment)
        if experiment and not rows:
            raise CliError(f"Experiment {experiment!r} has no runs in {store!r}.")
        if as_json:
            return _print_json(rows)
        table = Table("id", "experiment", "run key", "status", "trials", "created")
        for r in rows:
            table.add_row(str(r.id), r.experiment_name, r.run_key, r.status.value,
                          str(len(store.list_trials(experiment_run_id=r.id))), r.created_at.strftime("%Y-%m-%d %H:%M"))
        out.print(table)

    _guard(body)


def _leaderboard_rows(store: Any, experiment: str, run: str, metric: str | None, mode: str | None,
                      limit: int | None) -> tuple[Any, str, str, list[Any]]:
    exp_run = _resolve_run(store, experiment, run)
    metric, mode = _metric_and_mode(store, experiment, metric, mode)
    board = store.leaderboard(exp_run.id, metric, mode, limit=limit)
    if board and all(r.best_value is None for r in board):
        reported = _reported_metrics(store, exp_run.id)
        if reported:  # results exist, none with this metric: a typo, not a run that has not started
            raise CliError(
                f"No trial of {experiment} run {exp_run.run_key} reported metric {metric!r}; its trials "
                f"report {', '.join(reported)}. Pass --metric with one of them."
            )
    return exp_run, metric, mode, board


def _reported_metrics(store: Any, experiment_run_id: int) -> list[str]:
    """The numeric metrics in the run's trials' last results (engine fields aside)."""
    from airflow_trials.core.result import AUTO_FIELDS

    names = {
        key
        for trial in store.list_trials(experiment_run_id=experiment_run_id)
        for key, value in (trial.last_result or {}).items()
        if isinstance(value, (int, float)) and not isinstance(value, bool) and key not in AUTO_FIELDS
    }
    return sorted(names)


@app.command("trials")
def trials(
    ctx: typer.Context,
    experiment: str,
    run: RunOption = "latest",
    db_url: DbUrl = None,
    as_json: AsJson = False,
) -> None:
    """Show one run's trials: status, failures, best metric, best and latest checkpoints."""

    def body() -> None:
        store = _store(_db_url(ctx, db_url))
        exp_run, metric, mode, board = _leaderboard_rows(store, experiment, run, None, None, None)
        records = {t.trial_id: t for t in store.list_trials(experiment_run_id=exp_run.id)}
        rows = [
            {
                "trial_id": r.trial_id,
                "status": r.status.value,
                "num_failures": r.num_failures,
                "iterations": (records[r.trial_id].last_result or {}).get("training_iteration", 0),
                f"best_{metric}": r.best_value,
                "best_checkpoint": r.best_checkpoint,
                "latest_checkpoint": r.latest_checkpoint,
                "config": r.config,
                "error": (records[r.trial_id].error_msg or "").strip().splitlines()[-1:] or None,
            }
            for r in sorted(board, key=lambda r: r.trial_id)
        ]
        if as_json:
            return _print_json({"experiment": experiment, "run": exp_run, "trials": rows})
        table = Table("trial", "status", "failures", "iterations", f"best {metric}", "best checkpoint",
                      "latest checkpoint", title=f"{experiment} / {exp_run.run_key}")
        for row in rows:
            best = row[f"best_{metric}"]
            table.add_row(row["trial_id"], row["status"], str(row["num_failures"]), str(row["iterations"]),
                          "-" if best is None else f"{best:.6g}", row["best_checkpoint"] or "-",
                          row["latest_checkpoint"] or "-")
        out.print(table)

    _guard(body)


@app.command("leaderboard")
def leaderboard(
    ctx: typer.Context,
    experiment: str,
    run: RunOption = "latest",
    metric: Annotated[str | None, typer.Option(help="Default: the experiment's metric.")] = None,
    mode: Annotated[str | None, typer.Option(help="min or max; default: the experiment's.")] = None,
    limit: Annotated[int | None, typer.Option(min=1)] = None,
    db_url: DbUrl = None,
    as_json: AsJson = False,
) -> None:
    """Rank a run's trials by their best value of the metric."""

    def body() -> None:
        store = _store(_db_url(ctx, db_url))
        exp_run, metric_, mode_, board = _leaderboard_rows(store, experiment, run, metric, mode, limit)
        if as_json:
            return _print_json({"experiment": experiment, "run_key": exp_run.run_key, "metric": metric_,
                                "mode": mode_, "rows": board})
        out.print(render_leaderboard(board, metric_, mode_, title=f"{experiment} / {exp_run.run_key}"))

    _guard(body)


def render_leaderboard(board: list[Any], metric: str, mode: str, title: str | None = None) -> Table:
    """A Rich table of leaderboard rows, configs flattened into columns."""
    keys = sorted({k for r in board for k in (r.config or {})})
    table = Table("rank", "trial", *keys, "status", "failures", f"{mode} {metric}", "iteration",
                  "best checkpoint", title=title)
    for rank, r in enumerate(board, start=1):
        table.add_row(
            str(rank), r.trial_id, *(_short(r.config.get(k)) for k in keys), r.status.value, str(r.num_failures),
            "-" if r.best_value is None else f"{r.best_value:.6g}",
            "-" if r.best_iteration is None else str(r.best_iteration), r.best_checkpoint or "-",
        )
    return table


def _short(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


@app.command("plot")
def plot(
    ctx: typer.Context,
    experiment: str,
    output: Annotated[str, typer.Option("--out", help="PNG file to write.")] = "learning_curves.png",
    run: RunOption = "latest",
    metric: Annotated[str | None, typer.Option(help="Default: the experiment's metric.")] = None,
    db_url: DbUrl = None,
    as_json: AsJson = False,
) -> None:
    """Plot every trial's metric per iteration to a PNG, the best trial highlighted."""

    def body() -> None:
        from airflow_trials.plotting import curves_from_results, plot_learning_curves

        if not output.lower().endswith(".png"):
            raise CliError(f"--out must name a .png file, got {output!r}.")
        store = _store(_db_url(ctx, db_url))
        exp_run, metric_, mode_, board = _leaderboard_rows(store, experiment, run, metric, None, None)
        results = {t.trial_id: store.get_results(t.trial_id) for t in store.list_trials(experiment_run_id=exp_run.id)}
        best = board[0].trial_id if board and board[0].best_value is not None else None
        path = plot_learning_curves(curves_from_results(results, metric_), os.path.abspath(output),
                                    metric=metric_, best_trial_id=best,
                                    title=f"{experiment} / {exp_run.run_key}: {metric_} ({mode_})")
        if as_json:
            return _print_json({"path": path, "trials": len(results), "best_trial_id": best})
        out.print(f"Wrote {path} ({len(results)} trials, best {best}).", highlight=False)

    _guard(body)


# -- the main job --------------------------------------------------------------------------------
@app.command("run")
def run(
    dag_id: Annotated[str, typer.Option(help="The experiment DAG to trigger.")] = "example_regression_tuning",
    dags_folder: Annotated[str, typer.Option(help="DAGs folder (default: ./dags).")] = "dags",
    state_dir: Annotated[str | None, typer.Option(help="Embedded deployment state (default: ./.state).")] = None,
    num_cpus: Annotated[int | None, typer.Option(help="CPUs of the local Ray head (default: all).")] = None,
    plot_path: Annotated[str, typer.Option("--plot", help="Learning-curve PNG to write.")] = "learning_curves.png",
    keep_running: Annotated[bool, typer.Option(help="Keep the stack and the UI up until Ctrl-C.")] = False,
    api_port: Annotated[int, typer.Option(help="Port of the Airflow UI and API on 127.0.0.1.")] = 8080,
    timeout_s: Annotated[float, typer.Option(help="Give up after this many seconds.")] = 1800,
) -> None:
    """The main job: start Airflow and Ray on embedded defaults, run the example experiment, show
    its progress and leaderboard, plot its learning curves, and stop everything again."""
    from pathlib import Path

    from airflow_trials import mainjob

    stack = mainjob.Stack(home=Path(state_dir) if state_dir else mainjob.default_home(),
                          dags_folder=Path(dags_folder).resolve())
    if not (stack.dags_folder / f"{dag_id}.py").exists() and not stack.dags_folder.is_dir():
        _fail(f"DAGs folder {stack.dags_folder} does not exist; run from the repository or pass --dags-folder.")
    code = 1
    # `kill` (or a service manager stopping the job) stops everything this job started, as Ctrl-C
    # does; neither interrupts a database call (mainjob.Interrupts).
    mainjob.INTERRUPTS.install()
    try:
        out.print(f"Preparing the embedded deployment in {stack.home} ...")
        with mainjob.INTERRUPTS.deferred():
            mainjob.prepare(stack, api_port=api_port)
        address = mainjob.start_ray(stack, num_cpus)
        out.print(f"Ray at {address}{' (started here)' if stack.started_ray else ''}; starting Airflow ...")
        resumed = mainjob.interrupted_run(stack, dag_id)
        mainjob.start_airflow(stack)
        if resumed:
            run_id = resumed
            out.print(f"Resuming {dag_id} run {run_id}, which an earlier job left unfinished: its trials "
                      "continue from their latest checkpoints.")
        else:
            run_id = mainjob.trigger(stack, dag_id)
            out.print(f"Triggered {dag_id} run {run_id}; trials run on Ray while their tasks are deferred.")
        state = _watch(stack, dag_id, run_id, timeout_s)
        with mainjob.INTERRUPTS.deferred():
            code = _report(stack, dag_id, run_id, state, plot_path)
        if keep_running:
            out.print(f"Airflow UI: http://127.0.0.1:{api_port} (user admin, password in "
                      f"{stack.airflow_home / 'simple_auth_manager_passwords.json.generated'}); its "
                      f"Experiments entry shows this run's leaderboard and learning curves. Ctrl-C stops it.")
            while stack.airflow is not None and stack.airflow.poll() is None:
                time.sleep(1)
    except KeyboardInterrupt:
        err.print("Interrupted: stopping everything this job started.")
        code = 130
    except (RuntimeError, TimeoutError) as e:
        err.print(f"[red]Error:[/red] {e}", highlight=False, soft_wrap=True)
    finally:
        mainjob.INTERRUPTS.ignore()
        mainjob.stop(stack)
    raise typer.Exit(code)


def _watch(stack: Any, dag_id: str, run_id: str, timeout_s: float) -> str:
    from rich.live import Live

    from airflow_trials import mainjob
    from airflow_trials.store import TrialStore

    store = TrialStore(stack.trials_db_url)
    deadline = time.monotonic() + timeout_s
    state = None
    with Live(Table(title="waiting for the first trials"), console=out, refresh_per_second=2) as live:
        while time.monotonic() < deadline:
            state = mainjob.dag_run_state(stack, dag_id, run_id)
            with mainjob.INTERRUPTS.deferred():
                live.update(_progress_table(store, dag_id, run_id, state))
            if state in mainjob.TERMINAL_RUN_STATES:
                return str(state)
            if stack.airflow is not None and stack.airflow.poll() is not None:
                raise RuntimeError(f"Airflow exited early; see {stack.log_path}.")
            time.sleep(2)
    raise TimeoutError(f"DAG run {run_id} of {dag_id} did not finish within {timeout_s:.0f} s (state {state}).")


def _progress_table(store: Any, experiment: str, run_id: str, state: str | None) -> Table:
    runs = [r for r in store.list_experiment_runs(experiment) if r.run_key == run_id]
    table = Table("trial", "status", "iterations", "best", "failures", title=f"{experiment}: DAG run {state or '...'}")
    if not runs:
        return table
    exp = next(e for e in store.list_experiments() if e.name == experiment)
    board = store.leaderboard(runs[0].id, exp.metric, exp.mode)
    records = {t.trial_id: t for t in store.list_trials(experiment_run_id=runs[0].id)}
    for row in sorted(board, key=lambda r: r.trial_id):
        last = records[row.trial_id].last_result or {}
        table.add_row(row.trial_id, row.status.value, str(last.get("training_iteration", 0)),
                      "-" if row.best_value is None else f"{row.best_value:.4g}", str(row.num_failures))
    return table


def _report(stack: Any, experiment: str, run_id: str, state: str, plot_path: str) -> int:
    from airflow_trials.plotting import curves_from_results, plot_learning_curves
    from airflow_trials.store import TrialStore

    store = TrialStore(stack.trials_db_url)
    exp_run = _resolve_run(store, experiment, run_id)
    metric, mode = _metric_and_mode(store, experiment, None, None)
    board = store.leaderboard(exp_run.id, metric, mode)
    out.print()  # apart from the live table's last line
    out.print(render_leaderboard(board, metric, mode, title=f"Leaderboard: {experiment} / {run_id}"))
    results = {t.trial_id: store.get_results(t.trial_id) for t in store.list_trials(experiment_run_id=exp_run.id)}
    best = board[0].trial_id if board and board[0].best_value is not None else None
    if any(results.values()):
        path = plot_learning_curves(curves_from_results(results, metric), os.path.abspath(plot_path),
                                    metric=metric, best_trial_id=best, title=f"{experiment}: {metric} ({mode})")
        out.print(f"Learning curves: {path}", highlight=False)
    out.print(f"DAG run {run_id}: {state}.")
    return 0 if state == "success" else 1


def main() -> None:
    app()


if __name__ == "__main__":
    main()
