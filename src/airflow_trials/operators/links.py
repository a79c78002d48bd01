"""The "Trial dashboard" button of trial and sweep task instances: the trial's, or the run's,
page of the trials dashboard.

Airflow 3 calls ``get_link`` in the task's own process, when a try ends or defers (the task
runner's ``finalize``), and stores the URL in XCom under the link's ``xcom_key``; the api-server
shows the button from that XCom (``XComOperatorLink``), never running this code. So ``get_link``
reads nothing: it builds the URL from the operator as rendered for this task instance (a mapped
trial task's own ``trial_id``) and the task instance's key. No store, no XCom, no metadata DB.

Example, for a task that ran trial ``t3`` with ``[api] base_url = https://airflow.example.com``::

    TrialDashboardLink().get_link(operator, ti_key=ti)
    # "https://airflow.example.com/trials/trials/t3"
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlencode, urljoin

from airflow.sdk import BaseOperatorLink, conf

if TYPE_CHECKING:
    from airflow.sdk import BaseOperator
    from airflow.sdk.types import TaskInstanceKey

# Where the dashboard is mounted in the api-server (plugins/dashboard.py URL_PREFIX), and its
# routes for a trial and for an experiment run (plugins/routes/trials.py, runs.py).
DASHBOARD_PREFIX = "trials"
TRIAL_PAGE = "trials/{trial_id}"
RUN_PAGE = "runs/{run_pk}"
# A DAG run's experiment runs: it redirects to the run when the DAG run started exactly one.
DAG_RUN_PAGE = "dag-run"


def dashboard_url(page: str) -> str:
    """The absolute (or, without ``[api] base_url``, root-relative) URL of a dashboard page, as
    Airflow builds its own links to the UI (``build_airflow_dagrun_url``)."""
    base = conf.get("api", "base_url", fallback="/") or "/"
    return urljoin(base.rstrip("/") + "/", f"{DASHBOARD_PREFIX}/{page}")


class TrialDashboardLink(BaseOperatorLink):
    """On a :class:`~airflow_trials.operators.trial_operator.RunTrialOperator` task instance: the
    page of the trial it runs (each mapped task instance its own trial)."""

    name = "Trial dashboard"

    def get_link(self, operator: BaseOperator, *, ti_key: TaskInstanceKey) -> str:
        trial_id = operator.trial_id_for(ti_key)  # type: ignore[attr-defined]
        return dashboard_url(TRIAL_PAGE.format(trial_id=quote(trial_id, safe="")))


class SweepDashboardLink(BaseOperatorLink):
    """On a :class:`~airflow_trials.operators.sweep_operator.RunSweepOperator` task instance: the
    page of the experiment run it sweeps; the DAG run's experiment runs while its ``trials`` name
    none (the task failed before they were rendered)."""

    name = "Trial dashboard"

    def get_link(self, operator: BaseOperator, *, ti_key: TaskInstanceKey) -> str:
        run_pk = sweep_run_pk(getattr(operator, "trials", None))
        if run_pk is not None:
            return dashboard_url(RUN_PAGE.format(run_pk=run_pk))
        query = urlencode({"dag_id": ti_key.dag_id, "run_id": ti_key.run_id})
        return dashboard_url(f"{DAG_RUN_PAGE}?{query}")


def sweep_run_pk(trials: Any) -> int | None:
    """The experiment run that a sweep's rendered ``trials`` all name; None when they name none or
    several, or are not rendered yet (an ``XComArg``). A sweep's reference to its registered
    trials names its run once."""
    if isinstance(trials, Mapping):
        trials = [trials]
    if not isinstance(trials, list):
        return None
    run_pks = {t.get("experiment_run_id") for t in trials if isinstance(t, Mapping)}
    if len(run_pks) != 1:
        return None
    (run_pk,) = run_pks
    if isinstance(run_pk, str) and run_pk.isdigit():
        return int(run_pk)
    return run_pk if isinstance(run_pk, int) and not isinstance(run_pk, bool) else None
