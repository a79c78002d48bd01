"""Page rendering for the dashboard: the Jinja environment, the URLs of its pages, and HTML responses."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote, urlencode

import jinja2
from airflow.api_fastapi.app import API_ROOT_PATH
from fastapi import Request
from fastapi.responses import HTMLResponse

from airflow_trials.store import ExperimentRunRecord, TrialRecord

_TEMPLATES = jinja2.Environment(
    loader=jinja2.PackageLoader("airflow_trials.plugins", "templates"),
    autoescape=True,  # every config value, trial id and traceback is escaped
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)


def _short(value: Any) -> str:
    """A config or metric value for a table cell (the template escapes it)."""
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True)
    return str(value)


_TEMPLATES.filters["short"] = _short


class Links:
    """URLs of the dashboard's pages (under its mount point) and of Airflow's UI."""

    def __init__(self, request: Request) -> None:
        self.base = str(request.scope.get("root_path", "")).rstrip("/")

    def home(self) -> str:
        return f"{self.base}/"

    def static(self, name: str) -> str:
        return f"{self.base}/static/{quote(name)}"

    def experiment(self, name: str) -> str:
        return f"{self.base}/experiments/{quote(name, safe='')}"

    def run(self, run_pk: int, **query: Any) -> str:
        return f"{self.base}/runs/{run_pk}" + _query(query)

    def curves(self, run_pk: int, **query: Any) -> str:
        return f"{self.base}/runs/{run_pk}/curves" + _query(query)

    def trial(self, trial_id: str) -> str:
        return f"{self.base}/trials/{quote(trial_id, safe='')}"

    @staticmethod
    def task_instance(trial: TrialRecord) -> str | None:
        """The Airflow UI page of the trial's task instance; it opens on the logs."""
        if not (trial.dag_id and trial.run_id and trial.task_id):
            return None
        url = (f"{API_ROOT_PATH}dags/{quote(trial.dag_id, safe='')}/runs/{quote(trial.run_id, safe='')}"
               f"/tasks/{quote(trial.task_id, safe='')}")
        if trial.map_index >= 0:
            url += f"/mapped/{trial.map_index}"
        return url + (f"?try_number={trial.try_number}" if trial.try_number else "")

    @staticmethod
    def dag_run(run: ExperimentRunRecord) -> str | None:
        if not (run.dag_id and run.run_id):
            return None
        return f"{API_ROOT_PATH}dags/{quote(run.dag_id, safe='')}/runs/{quote(run.run_id, safe='')}"


def _query(values: dict[str, Any]) -> str:
    kept = {k: v for k, v in values.items() if v is not None}
    return f"?{urlencode(kept)}" if kept else ""


def render_page(request: Request, template: str, *, status_code: int = 200, **context: Any) -> HTMLResponse:
    """The template rendered with ``context`` (no auto-refresh and no breadcrumbs unless given)."""
    context.setdefault("refresh", None)
    context.setdefault("crumbs", [])
    html = _TEMPLATES.get_template(template).render(links=Links(request), **context)
    return HTMLResponse(html, status_code=status_code)
