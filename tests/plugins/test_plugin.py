"""The plugin is declared by the provider, found by Airflow's plugins manager, and cheap to
import."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from airflow_trials import get_provider_info

PLUGIN_CLASS = "airflow_trials.plugins.dashboard.TrialsDashboardPlugin"

_PLUGIN_INFO = """
import json
from airflow import plugins_manager
info = [p for p in plugins_manager.get_plugin_info() if p["name"] == "airflow_trials_dashboard"]
print(json.dumps({"info": info, "errors": plugins_manager.get_import_errors()}, default=str))
"""


def _plugin_info(**env: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", _PLUGIN_INFO],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **env},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_provider_info_declares_the_plugin():
    assert get_provider_info()["plugins"] == [
        {"name": "airflow_trials_dashboard", "plugin-class": PLUGIN_CLASS}
    ]


def test_airflow_loads_the_plugin_once_with_its_app_and_ui_links():
    found = _plugin_info()
    assert found["errors"] == {}
    [plugin] = found["info"]
    assert [(a["url_prefix"], a["name"]) for a in plugin["fastapi_apps"]] == [
        ("/trials", "Airflow Trials dashboard")
    ]
    views = {v["destination"]: v for v in plugin["external_views"]}
    assert views["nav"]["name"] == "Experiments" and views["nav"]["href"] == "/trials/"
    assert views["dag_run"]["href"] == "/trials/dag-run?dag_id={DAG_ID}&run_id={RUN_ID}"
    assert views["task_instance"]["href"].endswith("task_id={TASK_ID}&map_index={MAP_INDEX}")
    assert all(
        v["url_route"] for v in views.values()
    )  # the UI shows a view in a tab only with a route


def test_with_eager_provider_discovery_the_plugin_is_still_registered_once():
    found = _plugin_info(AIRFLOW__CORE__LAZY_DISCOVER_PROVIDERS="False")
    assert len(found["info"]) == 1
    # The OpenLineage provider (the dev extra's) reports its own plugin as "already registered,
    # skipping" under eager discovery; any other error, ours above all, fails.
    errors = dict(found["errors"])
    openlineage = errors.pop("OpenLineageProviderPlugin", None)
    assert openlineage in (None, "Plugin 'OpenLineageProviderPlugin' already registered, skipping")
    assert errors == {}


def test_links_follow_the_base_url_of_the_ui():
    from airflow_trials.plugins.dashboard import external_views

    assert external_views("/airflow/")[0]["href"] == "/airflow/trials/"


def test_importing_the_plugin_does_not_build_the_dashboard():
    code = (
        "import sys, airflow_trials.plugins.dashboard; "
        "print('airflow_trials.plugins.app' in sys.modules, 'airflow_trials.store' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=300
    )
    assert out.stdout.split()[-2:] == ["False", "False"]
