"""The provider as Airflow knows it: get_provider_info() against Airflow's own schema and the
package's modules, `airflow providers get` and `airflow config list` (one subprocess), the
"Trial dashboard" extra links, and the [airflow_trials] settings' precedence."""

from __future__ import annotations

import configparser
import importlib
import inspect
import json
import os
import pkgutil
import re
import subprocess
import sys
from importlib.resources import files
from pathlib import Path

import jsonschema
import pytest

import airflow_trials
from airflow_trials import get_provider_info
from airflow_trials.provider_config import SECTION, SETTINGS, setting, setting_float
from tests.conftest import REPO
from tests.unit.test_layering import loaded_after

LEGACY_ENV = {s.option: s.env for s in SETTINGS if s.env}


def extra_link(run, task_id: str, map_index: int = -1, name: str = "Trial dashboard") -> str | None:
    """The extra link's URL as the api-server finds it (its extra-links route): the serialized
    DAG's task, whose links are XCom links there, asked for one task instance of the DAG run."""
    from airflow.models.serialized_dag import SerializedDagModel
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        dag = SerializedDagModel.get_dag(run.dag_id, session=session)
        ti = session.scalar(
            select(TaskInstance).where(
                TaskInstance.dag_id == run.dag_id,
                TaskInstance.run_id == run.run_id,
                TaskInstance.task_id == task_id,
                TaskInstance.map_index == map_index,
            )
        )
        return dag.get_task(task_id).get_extra_links(ti, name)


@pytest.fixture
def no_settings(monkeypatch):
    """No [airflow_trials] setting from the environment, the older variables' or Airflow's."""
    for setting_ in SETTINGS:
        monkeypatch.delenv(f"AIRFLOW__{SECTION.upper()}__{setting_.option.upper()}", raising=False)
        if setting_.env:
            monkeypatch.delenv(setting_.env, raising=False)


# -- get_provider_info ---------------------------------------------------------------------------


def test_provider_info_follows_airflows_own_schema():
    schema = json.loads((files("airflow") / "provider_info.schema.json").read_text())
    info = get_provider_info()
    jsonschema.validate(info, schema)  # raises on the first mismatch
    options = info["config"][SECTION]["options"]
    option_schema = schema["definitions"]["option"]
    for name, option in options.items():
        # The schema spells "additional_properties", which jsonschema ignores: check it here.
        assert set(option) <= set(option_schema["properties"]), name
        assert option["type"] in ("string", "boolean", "integer", "float"), name
    assert set(options) == {s.option for s in SETTINGS}


def _defined_in(package: str, base: type) -> set[str]:
    """The modules of ``package`` that define a subclass of ``base`` themselves."""
    found = set()
    path = importlib.import_module(package).__path__
    for module_info in pkgutil.iter_modules(path, prefix=f"{package}."):
        module = importlib.import_module(module_info.name)
        for _, value in inspect.getmembers(module, inspect.isclass):
            if value.__module__ == module.__name__ and issubclass(value, base):
                found.add(module.__name__)
    return found


def test_every_module_that_defines_an_operator_sensor_or_trigger_is_listed():
    from airflow.sdk import BaseOperator, BaseOperatorLink, BaseSensorOperator
    from airflow.triggers.base import BaseTrigger

    info = get_provider_info()

    def listed(kind: str) -> set[str]:
        return {m for entry in info[kind] for m in entry["python-modules"]}

    operators = _defined_in("airflow_trials.operators", BaseOperator)
    assert operators == {
        "airflow_trials.operators.trial_operator",
        "airflow_trials.operators.sweep_operator",
    }
    assert listed("operators") == operators
    assert listed("sensors") == _defined_in("airflow_trials.sensors", BaseSensorOperator)
    assert listed("triggers") == _defined_in("airflow_trials.triggers", BaseTrigger)
    assert listed("triggers") == {
        "airflow_trials.triggers.trial_trigger",
        "airflow_trials.triggers.sweep_trigger",
        "airflow_trials.triggers.dataset_version_trigger",
    }
    links = set()
    for path in info["extra-links"]:
        module, name = path.rsplit(".", 1)
        links.add(getattr(importlib.import_module(module), name))
    assert all(issubclass(link, BaseOperatorLink) for link in links)
    from airflow_trials.operators.sweep_operator import RunSweepOperator
    from airflow_trials.operators.trial_operator import RunTrialOperator

    on_operators = {
        type(link)
        for op in (RunTrialOperator, RunSweepOperator)
        for link in op.operator_extra_links
    }
    assert on_operators == links and {link.name for link in links} == {"Trial dashboard"}


def test_getting_the_provider_info_loads_neither_airflow_nor_ray():
    statements = "import airflow_trials; airflow_trials.get_provider_info()"
    assert loaded_after(statements, "airflow", "ray") == [False, False]


# -- Airflow's own commands -----------------------------------------------------------------------

# Both commands in one process: Airflow's CLI parser, as the `airflow` command runs it.
_CLI = """
import sys
from airflow.cli import cli_parser
parser = cli_parser.get_parser()
for argv in (
    ["providers", "get", "airflow-trials", "--full", "--output", "json"],
    ["config", "list", "--section", "airflow_trials", "--show-values", "--include-descriptions"],
):
    args = parser.parse_args(argv)
    args.func(args)
    print("\\n=== end of command ===", flush=True)
"""


def test_airflow_providers_get_and_config_list_show_the_provider(airflow_home, tmp_path):
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("AIRFLOW_TRIALS_", "AIRFLOW__AIRFLOW_TRIALS__"))
    }
    env["AIRFLOW__AIRFLOW_TRIALS__STORAGE_PATH"] = "s3://bucket/from-airflow-config"
    out = subprocess.run(
        [sys.executable, "-c", _CLI],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=True,
    ).stdout
    provider_out, config_out, _ = out.split("=== end of command ===")
    (provider,) = json.loads(provider_out[provider_out.index("[") :])
    assert provider["package-name"] == "airflow-trials"
    assert provider["versions"] == [airflow_trials.__version__]
    assert provider["triggers"] == get_provider_info()["triggers"]
    assert provider["extra-links"] == get_provider_info()["extra-links"]
    assert set(provider["config"][SECTION]["options"]) == {s.option for s in SETTINGS}

    assert "[airflow_trials]" in config_out
    assert "storage_path = s3://bucket/from-airflow-config" in config_out
    assert "poll_interval_seconds = 2.0" in config_out
    assert "# db_url = " in config_out  # unset: the connection, else the default file
    assert "Also ``AIRFLOW_TRIALS_DB_URL``, which wins when both are set." in config_out


# -- the settings: the older variables win, then Airflow's configuration, then the default ---------


def test_an_older_variable_wins_over_airflows_configuration(no_settings, monkeypatch):
    assert setting("storage_path") is None and setting("poll_interval_seconds") == "2.0"
    monkeypatch.setenv("AIRFLOW__AIRFLOW_TRIALS__STORAGE_PATH", "s3://b/config")
    assert setting("storage_path") == "s3://b/config"
    monkeypatch.setenv("AIRFLOW_TRIALS_STORAGE", "/shared/results")
    assert setting("storage_path") == "/shared/results"
    monkeypatch.setenv("AIRFLOW_TRIALS_STORAGE", "")  # empty is unset, as it always was
    assert setting("storage_path") == "s3://b/config"
    monkeypatch.setenv("AIRFLOW__AIRFLOW_TRIALS__POLL_INTERVAL_SECONDS", "0.5")
    assert setting_float("poll_interval_seconds") == 0.5


def test_a_bad_setting_names_its_source_and_the_fix(no_settings, monkeypatch):
    monkeypatch.setenv("AIRFLOW__AIRFLOW_TRIALS__POLL_INTERVAL_SECONDS", "soon")
    with pytest.raises(ValueError, match=r"\[airflow_trials\] poll_interval_seconds.* a number"):
        setting_float("poll_interval_seconds")
    with pytest.raises(KeyError, match="has no option 'storage'; the options are"):
        setting("storage")


def test_the_trials_db_storage_and_poll_interval_follow_the_settings(
    airflow_home, no_settings, monkeypatch, tmp_path
):
    from airflow_trials.hooks.trials import RayHook, TrialsDbHook
    from airflow_trials.operators.trial_operator import RunTrialOperator
    from airflow_trials.pools import default_gpu_queue
    from airflow_trials.trials_db_url import resolve_trials_db_url

    monkeypatch.setenv("AIRFLOW__AIRFLOW_TRIALS__HOME", str(tmp_path / "home"))
    assert resolve_trials_db_url("missing") == (
        f"sqlite:///{tmp_path / 'home' / 'trials.db'}",
        "the default SQLite file",
    )
    monkeypatch.setenv("AIRFLOW__AIRFLOW_TRIALS__DB_URL", "sqlite:////config/trials.db")
    assert resolve_trials_db_url("missing") == (
        "sqlite:////config/trials.db",
        "[airflow_trials] db_url",
    )
    monkeypatch.setenv("AIRFLOW_TRIALS_DB_URL", "sqlite:////env/trials.db")
    assert TrialsDbHook("missing").get_url() == "sqlite:////env/trials.db"

    monkeypatch.setenv("AIRFLOW__AIRFLOW_TRIALS__STORAGE_PATH", "s3://b/config")
    assert RayHook("missing").settings()["storage_path"] == "s3://b/config"
    monkeypatch.setenv("AIRFLOW__AIRFLOW_TRIALS__GPU_QUEUE", "gpu")
    assert default_gpu_queue() == "gpu"

    monkeypatch.setenv("AIRFLOW__AIRFLOW_TRIALS__POLL_INTERVAL_SECONDS", "7.5")
    op = RunTrialOperator(task_id="t", trainable="tests.trainables:counting")
    assert op.poll_interval_seconds == 7.5
    given = RunTrialOperator(
        task_id="u", trainable="tests.trainables:counting", poll_interval_seconds=0.1
    )
    assert given.poll_interval_seconds == 0.1


def test_airflow_md_s_settings_are_the_declared_ones_read_back_as_written(no_settings, monkeypatch):
    text = Path(REPO, "docs", "airflow.md").read_text(encoding="utf-8")
    section = text[text.index("## Settings, the") :]
    section = section[: section.index("\n## ")]
    (block,) = re.findall(
        r"<!-- checked: tests/airflow/test_provider_info.py -->\n```ini\n(.*?)```", section, re.S
    )
    parser = configparser.ConfigParser()
    parser.read_string(block)
    for option, value in parser[SECTION].items():
        monkeypatch.setenv(f"AIRFLOW__{SECTION.upper()}__{option.upper()}", value)
        assert setting(option) == value
    assert setting_float("poll_interval_seconds") == 5.0
    rows = re.findall(r"^\| `(\w+)` \| (?:`(\w+)` )?\| (?:`([^`]+)`|none)", section, re.M)
    assert {(option, env or None) for option, env, _ in rows} == {
        (s.option, s.env) for s in SETTINGS
    }
    defaults = {option: default for option, _, default in rows}
    assert all(defaults[s.option] == s.default for s in SETTINGS if s.default is not None)


# -- the extra links, built in the task's process ----------------------------------------------


class _Key:
    def __init__(self, map_index=-1, dag_id="nightly", run_id="manual__1", task_id="tune.trial"):
        self.dag_id, self.run_id, self.task_id, self.map_index = dag_id, run_id, task_id, map_index


@pytest.mark.parametrize(
    ("base_url", "expected_prefix"),
    [
        (None, "/trials/"),
        ("https://airflow.example.com/team-a", "https://airflow.example.com/team-a/trials/"),
    ],
)
def test_a_trial_tasks_link_is_its_own_trials_page(monkeypatch, base_url, expected_prefix):
    from airflow_trials.operators.links import TrialDashboardLink
    from airflow_trials.operators.trial_operator import RunTrialOperator, default_trial_id

    if base_url is None:
        monkeypatch.delenv("AIRFLOW__API__BASE_URL", raising=False)
    else:
        monkeypatch.setenv("AIRFLOW__API__BASE_URL", base_url)
    link = TrialDashboardLink()
    named = RunTrialOperator(task_id="t", trainable="tests.trainables:counting", trial_id="a b/c")
    assert link.get_link(named, ti_key=_Key()) == f"{expected_prefix}trials/a%20b%2Fc"
    derived = RunTrialOperator(task_id="tune.trial", trainable="tests.trainables:counting")
    urls = [link.get_link(derived, ti_key=_Key(map_index=i)) for i in (0, 1)]
    assert urls == [
        f"{expected_prefix}trials/{default_trial_id('nightly', 'manual__1', 'tune.trial', i)}"
        for i in (0, 1)
    ]


def test_a_sweep_tasks_link_is_its_runs_page_else_its_dag_runs(monkeypatch):
    from airflow_trials.operators.links import SweepDashboardLink, sweep_run_pk
    from airflow_trials.operators.sweep_operator import RunSweepOperator

    monkeypatch.delenv("AIRFLOW__API__BASE_URL", raising=False)
    trials = [{"trial_id": f"t{i}", "config": {}, "experiment_run_id": 7} for i in range(3)]
    sweep = RunSweepOperator(
        task_id="sweep", trainable="tests.trainables:counting", trials=trials, metric="score"
    )
    key = _Key(task_id="tune.sweep", run_id="manual__2026-01-01T00:00:00+00:00")
    assert SweepDashboardLink().get_link(sweep, ti_key=key) == "/trials/runs/7"
    sweep.trials = "{{ ti.xcom_pull('suggest_configs') }}"  # not rendered: the task failed first
    assert SweepDashboardLink().get_link(sweep, ti_key=key) == (
        "/trials/dag-run?dag_id=nightly&run_id=manual__2026-01-01T00%3A00%3A00%2B00%3A00"
    )
    assert sweep_run_pk([{"experiment_run_id": "12"}]) == 12
    assert sweep_run_pk([{"experiment_run_id": 1}, {"experiment_run_id": 2}]) is None
    assert sweep_run_pk([{"experiment_run_id": True}]) is None


def test_the_links_name_the_dashboards_own_routes():
    from airflow_trials.operators import links
    from airflow_trials.plugins.dashboard import URL_PREFIX
    from airflow_trials.plugins.routes import pages

    assert URL_PREFIX == f"/{links.DASHBOARD_PREFIX}"
    paths = {route.path for route in pages.routes}
    for page in (links.TRIAL_PAGE, links.RUN_PAGE, links.DAG_RUN_PAGE):
        assert "/" + page in paths
