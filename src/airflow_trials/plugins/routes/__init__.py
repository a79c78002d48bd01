"""The dashboard's routes, one module per resource, each with its pages and its JSON side by side.

As Airflow's own ``api_fastapi/core_api/routes``: :mod:`.experiments`, :mod:`.runs` (the run page,
its leaderboard and Pareto front, the Airflow UI's DAG-run link), :mod:`.curves`,
:mod:`.coordinates`, :mod:`.decisions`, :mod:`.importances` and :mod:`.trials` (a trial, its logs
and results, the Airflow UI's task-instance link). Every module has an ``api`` router (under
``/api``, in the OpenAPI schema) and a ``pages`` router (HTML, left out of the schema); :data:`api`
and :data:`pages` gather them for the app.
"""

from __future__ import annotations

from fastapi import APIRouter

from airflow_trials.plugins.routes import (
    coordinates,
    curves,
    decisions,
    experiments,
    importances,
    runs,
    trials,
)

_RESOURCES = (experiments, runs, curves, coordinates, trials, decisions, importances)

api = APIRouter()
pages = APIRouter()
for _resource in _RESOURCES:
    api.include_router(_resource.api)
    pages.include_router(_resource.pages)
