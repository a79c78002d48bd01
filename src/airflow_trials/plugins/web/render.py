"""Page rendering for the dashboard: the Jinja environment, the URLs of its pages, and HTML
responses."""

from __future__ import annotations

import base64
import hashlib
import json
import math
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote, urlencode

import jinja2
from airflow.api_fastapi.app import API_ROOT_PATH
from fastapi import Request
from fastapi.responses import HTMLResponse
from markupsafe import Markup

from airflow_trials.core.result import TIME_SINCE_RESTORE, TIME_THIS_ITER_S, TIME_TOTAL_S, TIMESTAMP
from airflow_trials.plugins.data.queries import early_stopped
from airflow_trials.plugins.datamodels.scheduler_steps import rung_verdict
from airflow_trials.store import ExperimentRunRecord, TrialRecord

# Result fields the engine fills in with seconds since the epoch, and with durations in seconds.
EPOCH_FIELDS = frozenset({TIMESTAMP})
DURATION_FIELDS = frozenset({TIME_THIS_ITER_S, TIME_TOTAL_S, TIME_SINCE_RESTORE})
UTC_FORMAT = "%Y-%m-%d %H:%M:%S"
# Pages of a run that is still going re-load themselves (a <meta> refresh: no script needed).
REFRESH_SECONDS = 10
# The epoch seconds a date-time can show (a value outside them stays a number).
_MIN_EPOCH, _MAX_EPOCH = 0, datetime(9999, 12, 31, tzinfo=UTC).timestamp()

# The Airflow UI (next-themes) keeps the user's color mode in localStorage["theme"]: "light",
# "dark" or "system". The pages share its origin, so this script, run in <head> before the first
# paint, copies an explicit choice to <html data-theme>, and follows it when the user switches
# while the page is open; "system" (or no choice) leaves the CSS to prefers-color-scheme. It is
# the pages' only script: the Content-Security-Policy admits it by its hash and nothing else.
THEME_SCRIPT = (
    "(function(){function apply(){var t=null;try{t=localStorage.getItem('theme')}catch(e){}"
    "var root=document.documentElement;"
    "if(t==='dark'||t==='light'){root.setAttribute('data-theme',t)}else{root.removeAttribute('data-theme')}}"
    "apply();window.addEventListener('storage',function(e){if(e.key===null||e.key==='theme'){apply()}})})();"
)
THEME_SCRIPT_HASH = (
    "sha256-" + base64.b64encode(hashlib.sha256(THEME_SCRIPT.encode()).digest()).decode()
)

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


def is_number(value: Any) -> bool:
    """Whether a cell holds a number (right-aligned, never wrapped); True and False are not
    numbers."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def utc(value: datetime | float) -> str:
    """A datetime, or seconds since the epoch, as a UTC date-time to the second."""
    if isinstance(value, datetime):
        moment = value.astimezone(UTC) if value.tzinfo else value
    else:
        moment = datetime.fromtimestamp(value, tz=UTC)
    return moment.strftime(UTC_FORMAT)


def result_value(value: Any, key: str) -> str:
    """One field of a reported result for the results table: epoch seconds as a UTC date-time,
    durations to the millisecond, other values as :func:`_short` shows them."""
    if value is None:
        return ""
    if is_number(value) and math.isfinite(value):
        if key in EPOCH_FIELDS and _MIN_EPOCH <= value <= _MAX_EPOCH:
            return utc(value)
        if key in DURATION_FIELDS:
            return f"{value:.3f}"
    return _short(value)


_TEMPLATES.filters["short"] = _short
_TEMPLATES.filters["utc"] = utc
_TEMPLATES.filters["result_value"] = result_value
_TEMPLATES.filters["verdict"] = (
    rung_verdict  # {{ rung | verdict }}: CONTINUE, STOP or "recorded at end"
)
_TEMPLATES.tests["numeric"] = is_number  # Jinja's "number" test counts True and False as numbers
_TEMPLATES.tests["early_stopped"] = early_stopped  # {% if trial.stop_kind is early_stopped %}
_TEMPLATES.globals.update(
    EPOCH_FIELDS=EPOCH_FIELDS, DURATION_FIELDS=DURATION_FIELDS, THEME_SCRIPT=Markup(THEME_SCRIPT)
)


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
        url = (
            f"{API_ROOT_PATH}dags/{quote(trial.dag_id, safe='')}"
            f"/runs/{quote(trial.run_id, safe='')}"
            f"/tasks/{quote(trial.task_id, safe='')}"
        )
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


def render_page(
    request: Request, template: str, *, status_code: int = 200, **context: Any
) -> HTMLResponse:
    """The template rendered with ``context`` (no auto-refresh and no breadcrumbs unless given)."""
    context.setdefault("refresh", None)
    context.setdefault("crumbs", [])
    html = _TEMPLATES.get_template(template).render(links=Links(request), **context)
    return HTMLResponse(html, status_code=status_code)
