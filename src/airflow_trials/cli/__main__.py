"""``python -m airflow_trials.cli``: the ``airflow-trials`` command."""

from __future__ import annotations

from airflow_trials.cli import main

main()
