"""The airflow-trials CLI's reads: a read creates no trials DB and changes none (one error line
that says to upgrade instead), and the trials DB is found as the DAGs find it (--db-url, then the
trials_default connection, then AIRFLOW_TRIALS_DB_URL, then the default file)."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys

import pytest

from airflow_trials import trials_db_url
from tests.airflow.test_cli_output import (
    EXPERIMENT,
    TRIAL_IDS,
    invoke,
    one_error_line,
    run_cli,
    seed,
)
from tests.contract.conftest import postgres_schema_url  # noqa: F401  (a fixture)


@pytest.fixture
def migrated_empty(tmp_path):
    from airflow_trials.store import migrate

    url = f"sqlite:///{tmp_path / 'empty.db'}"
    migrate(url)
    return url


# -- reads create nothing ------------------------------------------------------------------------
READS = [
    ["experiments"],
    ["runs"],
    ["trials", "x"],
    ["leaderboard", "x"],
    ["plot", "x", "--out", "{tmp}/c.png"],
]


@pytest.mark.parametrize("command", READS, ids=lambda c: c[0])
def test_a_read_of_a_missing_sqlite_file_is_one_line_and_creates_nothing(command, tmp_path):
    missing = tmp_path / "nowhere" / "trials.db"
    args = [a.format(tmp=tmp_path) for a in command]
    line = one_error_line(invoke(*args, "--db-url", f"sqlite:///{missing}"))
    assert f"No trials DB at sqlite:///{missing} (from --db-url)" in line
    assert "pass its URL with --db-url" in line
    assert line.endswith(
        f"to start a new, empty trials DB there: airflow-trials --db-url sqlite:///{missing} db "
        "upgrade."
    )
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("command", READS, ids=lambda c: c[0])
def test_a_read_of_a_db_without_the_schema_says_to_upgrade_and_changes_nothing(command, tmp_path):
    path = tmp_path / "other.db"
    with sqlite3.connect(path) as connection:
        connection.execute("CREATE TABLE unrelated (x INTEGER)")
    before = path.read_bytes()
    args = [a.format(tmp=tmp_path) for a in command]
    line = one_error_line(invoke(*args, "--db-url", f"sqlite:///{path}"))
    assert "has no trials schema (never migrated)." in line
    assert line.endswith(
        f"to create the trials schema in it (a new, empty trials DB): airflow-trials --db-url "
        f"sqlite:///{path} db upgrade."
    )
    assert path.read_bytes() == before and sorted(os.listdir(tmp_path)) == ["other.db"]


def test_the_default_file_is_not_created_by_a_read(tmp_path, monkeypatch):
    home = tmp_path / "trials_home"
    monkeypatch.setenv("AIRFLOW_TRIALS_HOME", str(home))
    monkeypatch.delenv("AIRFLOW_TRIALS_DB_URL", raising=False)
    monkeypatch.delenv("AIRFLOW_CONN_TRIALS_DEFAULT", raising=False)
    # The default's warning is said once per process: an earlier test in this worker may have.
    monkeypatch.setattr(trials_db_url, "_said_default", False)
    result = invoke("experiments")
    line = one_error_line(result)
    assert (
        f"No trials DB at sqlite:///{home / 'trials.db'} (from the default SQLite file in " in line
    )
    assert line.endswith("to start a new, empty trials DB there: airflow-trials db upgrade.")
    assert "no trials DB is configured (no connection trials_default" in result.stderr
    assert not home.exists()
    result = invoke("db", "upgrade")  # the one command that creates it
    assert result.exit_code == 0 and (home / "trials.db").exists(), result.output


def test_an_empty_migrated_db_says_there_are_no_experiments_yet(migrated_empty):
    result = invoke("experiments", "--db-url", migrated_empty)
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("No experiments yet in the trials DB at ")
    assert "Nothing of it was written" not in result.output
    assert json.loads(invoke("experiments", "--db-url", migrated_empty, "-o", "json").stdout) == []
    assert (
        invoke("runs", "--db-url", migrated_empty, "-o", "plain").stdout
        == "id\texperiment\trun key\tstatus\ttrials\tcreated\n"
    )


@pytest.mark.postgres
def test_postgresql_without_the_schema_says_to_upgrade(postgres_schema_url):  # noqa: F811
    line = one_error_line(invoke("leaderboard", "x", "--db-url", postgres_schema_url))
    assert "has no trials schema (never migrated)." in line
    assert line.endswith(" db upgrade.") and "(a new, empty trials DB): airflow-trials " in line
    assert invoke("db", "upgrade", "--db-url", postgres_schema_url).exit_code == 0
    seed(postgres_schema_url)
    result = invoke("leaderboard", EXPERIMENT, "--db-url", postgres_schema_url, "-o", "plain")
    assert result.exit_code == 0 and TRIAL_IDS[2] in result.stdout, result.output


@pytest.mark.postgres
def test_a_refused_postgresql_connection_names_the_test_server_s_user_and_database():
    from sqlalchemy.engine import make_url

    from tests.contract.conftest import postgres_url

    refused = make_url(postgres_url()).set(port=1).render_as_string(hide_password=False)
    line = one_error_line(invoke("experiments", "--db-url", refused))
    assert (
        "port 1 failed: Connection refused" in line
        and "Check that the database server is up" in line
    )


@pytest.mark.postgres
def test_a_password_in_the_url_s_query_string_is_never_printed():
    from sqlalchemy.engine import make_url

    from tests.contract.conftest import postgres_url

    refused = make_url(postgres_url()).set(port=1, password=None)
    url = refused.update_query_dict({"password": "s3cret"}).render_as_string(hide_password=False)
    line = one_error_line(invoke("experiments", "--db-url", url))
    assert "port 1 failed" in line and "s3cret" not in line and "password=***" in line, line


# -- which trials DB -----------------------------------------------------------------------------
@pytest.fixture
def three_dbs(tmp_path, monkeypatch):
    """Three stores, each with one experiment named after where the CLI should find it."""
    urls = {}
    for name in ("from_env", "from_connection", "from_flag"):
        urls[name] = f"sqlite:///{tmp_path / name}.db"
        seed(urls[name], experiment=name)
    monkeypatch.setenv("AIRFLOW_TRIALS_HOME", str(tmp_path / "default_home"))
    monkeypatch.delenv("AIRFLOW_TRIALS_DB_URL", raising=False)
    monkeypatch.delenv("AIRFLOW_CONN_TRIALS_DEFAULT", raising=False)
    return urls


def _names(*args) -> list[str]:
    result = invoke(*args, "-o", "json")
    assert result.exit_code == 0, result.output
    return [e["name"] for e in json.loads(result.stdout)]


def test_db_resolution_is_the_dags_flag_then_connection_then_env_then_default(
    three_dbs, monkeypatch
):
    from airflow_trials.hooks.trials import TrialsDbHook

    connection = json.dumps(
        {"conn_type": "trials_db", "extra": {"url": three_dbs["from_connection"]}}
    )
    monkeypatch.setenv("AIRFLOW_TRIALS_DB_URL", three_dbs["from_env"])
    assert _names("experiments") == ["from_env"]
    monkeypatch.setenv("AIRFLOW_CONN_TRIALS_DEFAULT", connection)
    assert (
        _names("experiments") == ["from_connection"]
        and TrialsDbHook().get_url() == three_dbs["from_connection"]
    )
    assert _names("experiments", "--db-url", three_dbs["from_flag"]) == ["from_flag"]
    assert _names("--db-url", three_dbs["from_flag"], "experiments") == ["from_flag"]
    monkeypatch.delenv("AIRFLOW_TRIALS_DB_URL")
    assert _names("experiments") == ["from_connection"]
    monkeypatch.delenv("AIRFLOW_CONN_TRIALS_DEFAULT")
    line = one_error_line(invoke("experiments"))
    assert "(from the default SQLite file in " in line and TrialsDbHook().get_url().endswith(
        "/trials.db"
    )


def test_the_connection_is_found_without_an_airflow_metadata_db(three_dbs, tmp_path):
    """A fresh AIRFLOW_HOME (no airflow.db): the connection comes from its environment variable,
    and nothing is created in Airflow's home."""
    home = tmp_path / "airflow_home"
    home.mkdir()
    connection = json.dumps(
        {"conn_type": "trials_db", "extra": {"url": three_dbs["from_connection"]}}
    )
    env = {
        "AIRFLOW_HOME": str(home),
        "AIRFLOW_CONN_TRIALS_DEFAULT": connection,
        "AIRFLOW_TRIALS_DB_URL": three_dbs["from_env"],
    }
    done = run_cli("experiments", "-o", "json", env=env)
    assert done.returncode == 0, done.stderr
    assert [e["name"] for e in json.loads(done.stdout)] == ["from_connection"]
    done = run_cli("experiments", "-o", "json", env={**env, "AIRFLOW_CONN_TRIALS_DEFAULT": None})
    assert [e["name"] for e in json.loads(done.stdout)] == ["from_env"], done.stderr
    assert not list(home.rglob("*.db"))


def test_a_db_behind_this_version_says_to_upgrade_without_importing_alembic(tmp_path):
    # The revision is read with SQLAlchemy alone and compared with HEAD_REVISION (known when
    # airflow_trials is built): a read pays no Alembic import, and says the same as before.
    from airflow_trials.store import migrate
    from airflow_trials.store.engine import WRITE_OPTION, create_store_engine
    from airflow_trials.store.migration import HEAD_REVISION, alembic_config

    url = f"sqlite:///{tmp_path / 'behind.db'}"
    migrate(url)
    engine = create_store_engine(url)
    try:
        with engine.execution_options(**{WRITE_OPTION: True}).begin() as connection:
            from alembic import command

            command.downgrade(alembic_config(connection), "0019")
    finally:
        engine.dispose()
    done = run_cli("leaderboard", "x", "--db-url", url)
    line = one_error_line(done)
    assert (
        f"has schema revision 0019, not this airflow_trials' {HEAD_REVISION}; run "
        "'airflow-trials db upgrade'" in line
    )
    probe = (
        "import sys; from airflow_trials.cli import app\n"
        "try: app(['leaderboard', 'x', '--db-url', sys.argv[1]])\n"
        "except SystemExit: pass\n"
        "print('alembic' in sys.modules)"
    )
    imported = subprocess.run(
        [sys.executable, "-c", probe, url], capture_output=True, text=True, timeout=120
    )
    assert imported.stdout.split()[-1] == "False", imported.stderr
