"""The leaderboards the commands read: one metric's (``leaderboard``, ``trials``, ``plot``), with
the check that names the metrics a run's trials did report, and several metrics' (by Pareto
rank, ``TrialReader.pareto_leaderboard``)."""

from __future__ import annotations

from typing import Any

from airflow_trials.cli.common import CliError, err, metric_and_mode, out, resolve_run
from airflow_trials.cli.output import OutputFormat, emit, pareto_cells

#: The rows ``leaderboard`` prints unless ``--limit`` says otherwise (0: every trial). Printing
#: every trial grows with the run: 100,000 rows are 12.7 MB of table, about 130 s with Rich.
LEADERBOARD_LIMIT = 50


def say_cut(fmt: OutputFormat, shown: int, num_trials: int) -> None:
    """On stderr, under a table or plain lines cut by ``--limit``: how many of the run's trials
    were shown and how to see them all (a JSON or YAML document is left as it is)."""
    if shown < num_trials and fmt in (OutputFormat.TABLE, OutputFormat.PLAIN):
        err.print(
            f"The first {shown:,} of the run's {num_trials:,} trials; --limit N shows N, "
            "--limit 0 every trial.",
            highlight=False,
            soft_wrap=True,
        )


def leaderboard_rows(
    store: Any, experiment: str, run: str, metric: str | None, mode: str | None, limit: int | None
) -> tuple[Any, str, str, list[Any]]:
    """The run, the metric and mode (given, else the experiment's) and its leaderboard.

    :raises CliError: the run's trials have results, but none with the metric (a typo): the
        message lists the metrics they did report.
    :raises ModeNeeded: a metric that is not the experiment's, without ``mode``.
    """
    from airflow_trials.core.goal import ModeNeeded

    exp_run = resolve_run(store, experiment, run)
    try:
        metric, mode = metric_and_mode(store, experiment, metric, mode)
    except ModeNeeded:
        reported = reported_metrics(store, exp_run.id)
        if reported and metric not in reported:  # a typo: name the metrics, not --mode
            raise _not_reported(experiment, exp_run, metric, reported) from None
        raise
    board = store.leaderboard(exp_run.id, metric, mode, limit=limit)
    if board and all(r.best_value is None for r in board):
        reported = reported_metrics(store, exp_run.id)
        if reported:  # results exist, none with this metric: a typo, not a run that has not started
            raise _not_reported(experiment, exp_run, metric, reported)
    return exp_run, metric, mode, board


def ranked_leaderboard(
    store: Any, experiment: str, run: str, metric: str | None, mode: str | None, limit: int | None
) -> tuple[Any, str, str, list[Any], Any]:
    """:func:`leaderboard_rows`: the run, the metric and mode, the first ``limit`` rows (default
    all), and what names the run's best trial and front over every trial, whatever ``limit``
    shows (``best_trial_id``, ``front_trial_ids``).

    With ``limit``, only those rows are read, and the best and front come from the store's page
    of the ranking in SQL (``TrialReader.ranked_page(front=True)``), so the command does not
    grow with the run; without it, every row is read and the board (store/board.py) is made
    from them."""
    if limit:
        exp_run, metric_, mode_, rows = leaderboard_rows(
            store, experiment, run, metric, mode, limit
        )
        page = store.ranked_page(exp_run.id, metric_, mode_, limit=1, leaders=1, front=True)
        return exp_run, metric_, mode_, rows, page
    from airflow_trials.core.goal import Goal
    from airflow_trials.store.board import one_board

    exp_run, metric_, mode_, whole = leaderboard_rows(store, experiment, run, metric, mode, None)
    return exp_run, metric_, mode_, whole, one_board(Goal.of(metric_, mode_), whole)


def _not_reported(experiment: str, exp_run: Any, metric: str | None, reported: list[str]) -> Any:
    return CliError(
        f"No trial of {experiment} run {exp_run.run_key} reported metric {metric!r}; its trials "
        f"report {', '.join(reported)}. Pass --metric with one of them."
    )


def reported_metrics(store: Any, experiment_run_id: int) -> list[str]:
    """The numeric metrics in the run's trials' last results (engine fields aside)."""
    from airflow_trials.core.result import AUTO_FIELDS

    names = {
        key
        for trial in store.list_trials(experiment_run_id=experiment_run_id)
        for key, value in (trial.last_result or {}).items()
        if isinstance(value, (int, float))
        and not isinstance(value, bool)
        and key not in AUTO_FIELDS
    }
    return sorted(names)


def print_pareto_leaderboard(
    store: Any,
    fmt: OutputFormat,
    experiment: str,
    exp_run: Any,
    metrics: list[str],
    modes: list[str],
    limit: int | None,
) -> None:
    """The leaderboard of several metrics (``TrialReader.pareto_leaderboard``)."""
    from dataclasses import replace

    from airflow_trials.core.goal import Goal
    from airflow_trials.store.board import several_board

    # The whole board, for its best (the pick's default, select_best's); the rows cut after.
    board = store.pareto_leaderboard(exp_run.id, metrics, modes)
    best = several_board(Goal.of(metrics, modes), board).best_trial_id
    num_trials = len(board.rows)
    board = replace(board, rows=board.rows[:limit] if limit else board.rows)
    if board.rows and all(value is None for r in board.rows for value in r.values.values()):
        reported = reported_metrics(store, exp_run.id)
        if reported:  # results exist, none with these metrics: not a run that has not started
            raise CliError(
                f"No trial of {experiment} run {exp_run.run_key} reported any of the metrics "
                f"{', '.join(metrics)}; its trials report {', '.join(reported)}. Pass --metric "
                "with one of them."
            )
    columns, rows = pareto_cells(board)
    emit(
        out,
        fmt,
        {
            "experiment": experiment,
            "run_key": exp_run.run_key,
            "metrics": board.metrics,
            "modes": board.modes,
            "front_trial_ids": board.front_trial_ids,
            "best_trial_id": best,
            "constraints": board.constraints,
            "rows": board.rows,
        },
        columns,
        rows,
        title=f"{experiment} / {exp_run.run_key}: Pareto front of "
        + ", ".join(f"{mode} {m}" for m, mode in zip(metrics, modes, strict=True)),
        empty=f"Run {exp_run.run_key} of {experiment} has no trials yet.",
    )
    say_cut(fmt, len(board.rows), num_trials)
