"""One trials DB everywhere: however the ``trials_default`` connection is given, the CLI,
``python -m airflow_trials.store upgrade``, ``ResultGrid.from_db``, ``TrialsDbCallback``, and
``TrialStore()`` and ``TrialReader()`` given no URL all use the database it names, each in a
process of its own started as a user starts it; and a fallback to the default SQLite file is
said.

The connection is given as ``AIRFLOW_CONN_TRIALS_DEFAULT`` (a SQLite URI, and a PostgreSQL URI),
or made with ``airflow connections add`` in Airflow's metadata DB (a copy of the session's, so no
other test sees it)."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from contextlib import closing
from pathlib import Path

import pytest

from airflow_trials.store import TrialStore
from tests.conftest import REPO

BIN = Path(sys.executable).parent

# Writes an experiment run and a trial through TrialsDbCallback (its default DB), then reads them
# back through ResultGrid.from_db (its default DB): what a notebook does; and where TrialStore()
# and TrialReader() without a URL are.
WRITE_AND_READ = """
import json
from airflow_trials import ResultGrid, Trial, TrialsDbCallback
from airflow_trials.store import TrialReader, TrialStore
recorder = TrialsDbCallback(metric="loss", mode="min", run_key="resolver-run")
recorder.on_trial_start(Trial("tests.trainables:quadratic", {"x": 1}, trial_id="resolver-t1",
                              experiment_name="resolver_exp"))
grid = ResultGrid.from_db("resolver_exp")
print(json.dumps({"callback": recorder.store.url, "grid": [r.trial_id for r in grid],
                  "run": grid.run_key, "store": TrialStore().url, "reader": TrialReader().url}))
"""


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW_CONN_")}
    env.pop("AIRFLOW_TRIALS_DB_URL", None)
    env["AIRFLOW_TRIALS_HOME"] = str(tmp_path / "default_home")  # where the default file would go
    env.update(extra)
    return env


def _run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(args, env=env, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, (args, done.stdout, done.stderr)
    return done


def _every_entry_point_uses(url: str, env: dict[str, str], tmp_path: Path) -> None:
    upgraded = _run([str(BIN / "python"), "-m", "airflow_trials.store", "upgrade"], env)
    assert "from connection trials_default" in upgraded.stdout, upgraded.stdout
    written = json.loads(
        _run([str(BIN / "python"), "-c", WRITE_AND_READ], env).stdout.strip().splitlines()[-1]
    )
    assert written == {
        "callback": url,
        "grid": ["resolver-t1"],
        "run": "resolver-run",
        "store": url,
        "reader": url,
    }
    listed = _run([str(BIN / "airflow-trials"), "experiments", "--json"], env)
    assert [e["name"] for e in json.loads(listed.stdout)] == ["resolver_exp"]
    store = TrialStore(url)
    try:  # the rows are in the database the connection names
        assert [t.trial_id for t in store.reader.list_trials()] == ["resolver-t1"]
    finally:
        store.dispose()
    assert not (tmp_path / "default_home").exists(), (
        "something fell back to the default SQLite file"
    )


def test_a_sqlite_uri_in_the_environment_names_its_file(tmp_path):
    path = tmp_path / "named" / "trials.db"
    path.parent.mkdir()
    env = _env(tmp_path, AIRFLOW_CONN_TRIALS_DEFAULT=f"sqlite:///{path}")  # sqlite:////abs/path
    _every_entry_point_uses(f"sqlite:///{path}", env, tmp_path)


@pytest.mark.postgres
def test_a_postgresql_uri_in_the_environment(tmp_path):
    from sqlalchemy import make_url

    from tests.contract.conftest import new_postgres_database

    with new_postgres_database("at_resolver") as database:
        url = make_url(database.url)
        env = _env(
            tmp_path,
            AIRFLOW_CONN_TRIALS_DEFAULT=url.set(drivername="postgresql").render_as_string(
                hide_password=False
            ),
        )
        _every_entry_point_uses(
            url.set(drivername="postgresql+psycopg").render_as_string(hide_password=False),
            env,
            tmp_path,
        )


def test_a_connection_made_with_airflow_connections_add(airflow_home, tmp_path):
    home = tmp_path / "airflow_home"
    home.mkdir()
    # Through SQLite's backup API, never a plain file copy: opening and closing the live file in
    # this process would drop the POSIX locks SQLite holds on it here, and a process that then
    # writes it (a trigger test's, say) would corrupt it ("file is not a database").
    with (
        closing(sqlite3.connect(Path(airflow_home) / "airflow.db")) as live,
        closing(sqlite3.connect(home / "airflow.db")) as copy,
    ):
        live.backup(copy)
    env = _env(
        tmp_path,
        AIRFLOW_HOME=str(home),
        AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=f"sqlite:///{home / 'airflow.db'}",
    )
    path = tmp_path / "added.db"
    _run(
        [
            str(BIN / "airflow"),
            "connections",
            "add",
            "trials_default",
            "--conn-type",
            "sqlite",
            "--conn-host",
            str(path),
        ],
        env,
    )
    _every_entry_point_uses(f"sqlite:///{path}", env, tmp_path)


def test_with_nothing_configured_the_default_file_is_named_once(tmp_path):
    env = _env(tmp_path)
    done = _run(
        [
            str(BIN / "python"),
            "-c",
            "from airflow_trials.trials_db_url import trials_db_url\n"
            "print(trials_db_url()); print(trials_db_url())",
        ],
        env,
    )
    default = tmp_path / "default_home" / "trials.db"
    assert done.stdout.splitlines() == [f"('sqlite:///{default}', 'the default SQLite file')"] * 2
    said = done.stderr  # not stdout, where a command's JSON goes
    assert said.count("no trials DB is configured") == 1, said
    assert "AIRFLOW_TRIALS_DB_URL" in said and str(default) in said


def test_a_store_given_no_url_takes_the_environments(tmp_path, monkeypatch):
    """Without a connection, ``AIRFLOW_TRIALS_DB_URL``, as the resolver orders it; not the
    default file."""
    from airflow_trials.store import TrialReader

    url = f"sqlite:///{tmp_path / 'from_env.db'}"
    monkeypatch.setenv("AIRFLOW_TRIALS_DB_URL", url)
    monkeypatch.setenv("AIRFLOW_TRIALS_HOME", str(tmp_path / "default_home"))
    monkeypatch.delenv("AIRFLOW_CONN_TRIALS_DEFAULT", raising=False)
    store = TrialStore(create=True)
    try:
        store.ensure_experiment("found")
        assert store.url == url and TrialReader().url == url
    finally:
        store.dispose()
    assert not (tmp_path / "default_home").exists()
