"""The ``airflow-trials`` command: the trials DB, GPU pool, experiments, leaderboards and plots.

``app`` is the console script (``airflow_trials.cli:app``); ``python -m airflow_trials.cli`` runs it
too. The commands live in :mod:`~airflow_trials.cli.commands` (the trials DB and the GPU pool),
:mod:`~airflow_trials.cli.trials_cmd` (``trials``), :mod:`~airflow_trials.cli.mainjob_cmd` (``run``)
and :mod:`~airflow_trials.cli.shape_cmd` (``shape``), among others;
:mod:`~airflow_trials.cli.output` prints rows as ``--output table|plain|json|yaml``.
"""

from __future__ import annotations

# Importing the command modules registers their commands on app.
from airflow_trials.cli import (  # noqa: F401
    approvals_cmd,
    commands,
    delete_run_cmd,
    end_run_cmd,
    export_cmd,
    extend_cmd,
    history_cmd,
    importances_cmd,
    mainjob_cmd,
    shape_cmd,
    trials_cmd,
)
from airflow_trials.cli.common import PIPED_WIDTH, CliError, app, db_app, err, out, pool_app
from airflow_trials.cli.output import OutputFormat, render_leaderboard


def main() -> None:
    app()


__all__ = [
    "PIPED_WIDTH",
    "CliError",
    "OutputFormat",
    "app",
    "db_app",
    "err",
    "main",
    "out",
    "pool_app",
    "render_leaderboard",
]
