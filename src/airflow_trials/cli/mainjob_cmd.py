"""``airflow-trials run``: the main job, which starts Airflow and Ray, runs an experiment and
reports it."""

from __future__ import annotations

import os
import time
from typing import Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from airflow_trials.cli.boards import print_pareto_leaderboard
from airflow_trials.cli.common import (
    app,
    err,
    fail,
    metric_and_mode,
    out,
    resolve_run,
    several_metrics,
)
from airflow_trials.cli.output import OutputFormat, render_leaderboard

DagsFolder = Annotated[
    str, typer.Option(help="The DAGs folder Airflow runs (this repository's dags/).")
]
StateDir = Annotated[
    str | None,
    typer.Option(
        help="Embedded deployment state: Airflow home, trials DB, checkpoints, logs "
        "(default: $AIRFLOW_TRIALS_STATE, else ./.state)."
    ),
]


@app.command("run")
def run(
    dag_id: Annotated[
        str, typer.Option(help="The experiment DAG to trigger.")
    ] = "example_regression_tuning",
    dags_folder: DagsFolder = "dags",
    state_dir: StateDir = None,
    num_cpus: Annotated[
        int | None, typer.Option(help="CPUs of the local Ray head (default: all).")
    ] = None,
    plot_path: Annotated[
        str, typer.Option("--plot", help="Learning-curve PNG to write.")
    ] = "learning_curves.png",
    keep_running: Annotated[
        bool, typer.Option(help="Keep the stack and the UI up until Ctrl-C.")
    ] = False,
    api_port: Annotated[
        int, typer.Option(help="Port of the Airflow UI and API on 127.0.0.1.")
    ] = 8080,
    timeout_s: Annotated[float, typer.Option(help="Give up after this many seconds.")] = 1800,
) -> None:
    """The main job: start Airflow and Ray on embedded defaults, run the example experiment, show
    its progress and leaderboard, plot its learning curves, and stop everything again."""
    from pathlib import Path

    from airflow_trials import mainjob

    stack = mainjob.Stack(
        home=Path(state_dir) if state_dir else mainjob.default_home(),
        dags_folder=Path(dags_folder).resolve(),
        experiment_name=dag_id,
    )
    if not (stack.dags_folder / f"{dag_id}.py").exists() and not stack.dags_folder.is_dir():
        fail(
            f"DAGs folder {stack.dags_folder} does not exist; run from the repository or pass "
            "--dags-folder."
        )
    code = 1
    # `kill` (or a service manager stopping the job) stops everything this job started, as Ctrl-C
    # does; neither interrupts a database call (mainjob.Interrupts).
    mainjob.INTERRUPTS.install()
    try:
        code = _run_job(stack, dag_id, num_cpus, plot_path, keep_running, api_port, timeout_s)
    except KeyboardInterrupt:
        err.print("Interrupted: stopping everything this job started.")
        code = 130
    except (RuntimeError, TimeoutError) as e:
        err.print(Text.assemble(("Error:", "red"), f" {e}"), highlight=False, soft_wrap=True)
    finally:
        mainjob.INTERRUPTS.ignore()
        drained = mainjob.stop(stack)
        if drained is not None and drained.states:
            err.print(drained.summary(), highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def _run_job(
    stack: Any,
    dag_id: str,
    num_cpus: int | None,
    plot_path: str,
    keep_running: bool,
    api_port: int,
    timeout_s: float,
) -> int:
    """Prepare, start, trigger (or resume), watch and report; the caller stops the stack."""
    from airflow_trials import mainjob

    out.print(f"Preparing the embedded deployment in {stack.home} ...")
    with mainjob.INTERRUPTS.deferred():
        mainjob.prepare(stack, api_port=api_port)
    address = mainjob.start_ray(stack, num_cpus)
    out.print(
        f"Ray at {address}{' (started here)' if stack.started_ray else ''}; starting Airflow ..."
    )
    resumed = mainjob.interrupted_run(stack, dag_id)
    mainjob.start_airflow(stack)
    if resumed:
        run_id = resumed
        out.print(
            f"Resuming {dag_id} run {run_id}, which an earlier job left unfinished: its trials "
            "continue from their latest checkpoints."
        )
    else:
        run_id = mainjob.trigger(stack, dag_id)
        out.print(
            f"Triggered {dag_id} run {run_id}; trials run on Ray while their tasks are deferred."
        )
    state = _watch(stack, dag_id, run_id, timeout_s)
    with mainjob.INTERRUPTS.deferred():
        code = _report(stack, dag_id, run_id, state, plot_path)
    if keep_running:
        out.print(
            f"Airflow UI: http://127.0.0.1:{api_port} (user admin, password in "
            f"{stack.airflow_home / 'simple_auth_manager_passwords.json.generated'}); its "
            f"Experiments entry shows this run's leaderboard and learning curves. Ctrl-C stops it."
        )
        while stack.airflow is not None and stack.airflow.poll() is None:
            time.sleep(1)
    return code


def _watch(stack: Any, dag_id: str, run_id: str, timeout_s: float) -> str:
    from rich.live import Live

    from airflow_trials import mainjob
    from airflow_trials.store import TrialReader

    store = TrialReader(stack.trials_db_url)
    deadline = time.monotonic() + timeout_s
    state = None
    with Live(
        Table(title="waiting for the first trials"), console=out, refresh_per_second=2
    ) as live:
        while time.monotonic() < deadline:
            state = mainjob.dag_run_state(stack, dag_id, run_id)
            with mainjob.INTERRUPTS.deferred():
                live.update(_progress_table(store, dag_id, run_id, state))
            if state in mainjob.TERMINAL_RUN_STATES:
                return str(state)
            if stack.airflow is not None and stack.airflow.poll() is not None:
                raise RuntimeError(f"Airflow exited early; see {stack.log_path}.")
            time.sleep(2)
    raise TimeoutError(
        f"DAG run {run_id} of {dag_id} did not finish within {timeout_s:.0f} s (state {state})."
    )


def _progress_table(store: Any, experiment: str, run_id: str, state: str | None) -> Table:
    """The live table: each trial, its best value of the experiment's (first) metric so far, and
    the mark on the run's best on its board, the trial ``select_best`` would name (one that
    ended TERMINATED, feasible first: docs/store.md "Which trials count"); the caption gives that
    trial's value, the run's best value (never one of a trial that does not count)."""
    runs = [r for r in store.list_experiment_runs(experiment) if r.run_key == run_id]
    title = f"{experiment}: DAG run {state or '...'}"
    if not runs:  # its first task has not recorded the experiment and the run yet
        return Table("trial", "status", "iterations", "best", "failures", "", title=title)
    goal = store.get_experiment(experiment).goal
    columns = ("trial", "status", "iterations", goal.metric or "best", "failures", "")
    table = Table(*columns, title=title)
    if not goal.metrics:
        return table
    # Of an experiment with several metrics, the value column is the first metric's, and the
    # best is the board of them all's.
    board = store.board(runs[0].id, goal.first())
    whole = board if goal.first() == goal else store.board(runs[0].id, goal)
    records = {t.trial_id: t for t in store.list_trials(experiment_run_id=runs[0].id)}
    for row in sorted(board.rows, key=lambda r: r.trial_id):
        last = records[row.trial_id].last_result or {}
        table.add_row(
            row.trial_id,
            row.status.value,
            str(last.get("training_iteration", 0)),
            "-" if row.value is None else f"{row.value:.4g}",
            str(row.num_failures),
            "best" if row.trial_id == whole.best_trial_id else "",
        )
    table.caption = _best_caption(whole)
    return table


def _best_caption(board: Any) -> str:
    """The run's best value: its board's best trial's values; none while no trial counts."""
    best = board.row(board.best_trial_id)
    if best is None:
        return "best: none yet (no trial has ended TERMINATED with a value)"
    values = ", ".join(f"{m} {v:.4g}" for m, v in best.values.items() if v is not None)
    return f"best: {best.trial_id}, {values}"


def report_best(store: Any, experiment: str, experiment_run_id: int) -> str | None:
    """The trial the report's curves highlight: the run's best on its board, the one
    ``select_best`` names (a trial that ended TERMINATED, feasible first; with several metrics,
    the pick's default); None when none counts."""
    goal = store.get_experiment(experiment).goal
    return store.board(experiment_run_id, goal).best_trial_id if goal.metrics else None


def _report(stack: Any, experiment: str, run_id: str, state: str, plot_path: str) -> int:
    from airflow_trials import mainjob
    from airflow_trials.exceptions import ExperimentNotFoundError
    from airflow_trials.plotting import curves_from_results, plot_learning_curves
    from airflow_trials.store import TrialReader

    store = TrialReader(stack.trials_db_url)
    try:
        exp_run = resolve_run(store, experiment, run_id)
    except ExperimentNotFoundError:  # its first task failed before any trial was written
        err.print(
            f"Run {run_id} of {experiment} ended {state} before it recorded any trial in the "
            f"trials DB ({stack.trials_db_url}). Its tasks' logs are in "
            f"{stack.airflow_home / 'logs' / f'dag_id={experiment}' / f'run_id={run_id}'} "
            "and in the Airflow UI.",
            highlight=False,
            soft_wrap=True,
        )
        return 1
    several = several_metrics(store, experiment, None, None)
    out.print()  # apart from the live table's last line
    if several:
        # The Pareto leaderboard, as `airflow-trials leaderboard` prints it; the learning curves
        # are the first metric's.
        print_pareto_leaderboard(store, OutputFormat.TABLE, experiment, exp_run, *several, None)
        metric, mode = several[0][0], several[1][0]
    else:
        metric, mode = metric_and_mode(store, experiment, None, None)
    board = store.leaderboard(exp_run.id, metric, mode)
    if not several:
        out.print(
            render_leaderboard(board, metric, mode, title=f"Leaderboard: {experiment} / {run_id}")
        )
    results = {
        t.trial_id: store.get_results(t.trial_id)
        for t in store.list_trials(experiment_run_id=exp_run.id)
    }
    best = report_best(store, experiment, exp_run.id)
    if any(results.values()):
        path = plot_learning_curves(
            curves_from_results(results, metric),
            os.path.abspath(plot_path),
            metric=metric,
            best_trial_id=best,
            title=f"{experiment}: {metric} ({mode})",
        )
        out.print(f"Learning curves: {path}", highlight=False)
    out.print(f"DAG run {run_id}: {state}.", highlight=False, soft_wrap=True)
    # Its trials DB is this job's, in its state directory, which `airflow-trials` does not find
    # by itself: the line that reads it, with its --db-url, ready to paste.
    out.print(
        f"Its results, from this job's trials DB in {stack.home}:", highlight=False, soft_wrap=True
    )
    out.print(
        mainjob.results_command(stack.trials_db_url, experiment, exp_run.run_key),
        highlight=False,
        soft_wrap=True,
    )
    return 0 if state == "success" else 1
