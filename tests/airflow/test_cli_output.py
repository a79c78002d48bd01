"""The airflow-trials CLI in pipes and scripts: --output formats and one-line errors. A seeded
store (no Ray) stands in for a run. That a read creates no DB, and which trials DB the CLI finds,
are in test_cli_reads.py."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest
import yaml
from typer.testing import CliRunner

from airflow_trials.cli import app
from airflow_trials.core.end import TrialEnd
from airflow_trials.core.fate import Transition
from airflow_trials.core.status import TrialStatus
from tests.contract.conftest import postgres_schema_url  # noqa: F401  (a fixture)
from tests.factories import add_checkpoint, add_results, update_trial

runner = CliRunner()
CLI = os.path.join(os.path.dirname(sys.executable), "airflow-trials")
EXPERIMENT = "pipes_experiment_with_a_name_longer_than_forty_characters"
RUN_KEY = "scheduled__2026-11-24T03:00:00.123456+00:00__a_run_key_no_narrow_terminal_may_cut"
TRIAL_IDS = [f"{EXPERIMENT}-0123456789abcdef-trial-{i:05d}" for i in range(3)]
REFUSED = "postgresql+psycopg://postgres@127.0.0.1:1/x"  # nothing listens on port 1


def _checkpoint(trial_id: str, iteration: int) -> str:
    return (
        f"/mnt/shared/airflow_trials/checkpoints/{EXPERIMENT}/{trial_id}/checkpoint_{iteration:06d}"
    )


def seed(url: str, experiment: str = EXPERIMENT) -> None:
    """One run of three finished trials, written through TrialStore as the operator writes them."""
    from airflow_trials.store import TrialStore

    store = TrialStore(url, create=True)
    try:
        store.ensure_experiment(experiment, metric="loss", mode="min")
        run = store.create_experiment_run(experiment, RUN_KEY, dag_id="pipes", run_id=RUN_KEY)
        for i, trial_id in enumerate(
            TRIAL_IDS if experiment == EXPERIMENT else [f"{experiment}-0"]
        ):
            store.upsert_trial(
                trial_id,
                trainable="pkg.train:fn",
                config={"lr": 0.1 / (i + 1)},
                resources={"cpu": 1},
                max_failures=0,
                experiment_run_id=run,
                dag_id="pipes",
                run_id=RUN_KEY,
                task_id="trial",
                map_index=i,
            )
            store.record_transition(trial_id, Transition.PLACED)
            add_results(
                store,
                trial_id,
                [{"training_iteration": it, "loss": 1.0 / it + i} for it in (1, 2, 3)],
            )
            for it in (2, 3):
                add_checkpoint(store, trial_id, _checkpoint(trial_id, it), it, score=1.0 / it + i)
            store.record_end(TrialEnd(trial_id, experiment, TrialStatus.TERMINATED))
    finally:
        store.dispose()


@pytest.fixture(scope="module")
def seeded(tmp_path_factory):
    url = f"sqlite:///{tmp_path_factory.mktemp('cli_output') / 'trials.db'}"
    seed(url)
    return url


def invoke(*args, **kwargs):
    return runner.invoke(app, [str(a) for a in args], **kwargs)


def one_error_line(result_or_done) -> str:
    """The single stderr line of a failed command (exit code 1), without a traceback (besides the
    notice naming the default trials DB file, when no other is configured)."""
    code = getattr(result_or_done, "exit_code", getattr(result_or_done, "returncode", None))
    lines = [
        line
        for line in result_or_done.stderr.strip().splitlines()
        if not line.startswith("airflow_trials: no trials DB is configured")
    ]
    assert code == 1, (code, result_or_done.stdout, result_or_done.stderr)
    assert len(lines) == 1 and lines[0].startswith("Error: "), result_or_done.stderr
    assert "Traceback" not in result_or_done.stderr + result_or_done.stdout
    return lines[0]


def run_cli(*args, env=None, timeout=120):
    """The installed console script, stdout a pipe (not a TTY); ``env`` entries of None are
    unset."""
    merged = {k: v for k, v in {**os.environ, **(env or {})}.items() if v is not None}
    return subprocess.run(
        [CLI, *map(str, args)], env=merged, capture_output=True, text=True, timeout=timeout
    )


# -- --output ------------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", ["plain", "table"])
def test_piped_plain_and_table_keep_full_trial_ids_run_keys_and_paths(seeded, fmt):
    shown = {}
    for command in ("leaderboard", "runs", "trials"):
        done = run_cli(command, EXPERIMENT, "--db-url", seeded, "-o", fmt, env={"COLUMNS": "40"})
        assert done.returncode == 0, done.stderr
        shown[command] = done.stdout
    assert RUN_KEY in shown["runs"] and EXPERIMENT in shown["runs"]
    for trial_id in TRIAL_IDS:
        assert trial_id in shown["leaderboard"] and trial_id in shown["trials"]
        assert (
            _checkpoint(trial_id, 3) in shown["leaderboard"]
            and _checkpoint(trial_id, 3) in shown["trials"]
        )
    everything = "".join(shown.values())
    assert "…" not in everything and "Context impl" not in everything  # no ellipsis, no Alembic log
    if fmt == "plain":
        for command, text in shown.items():
            header, *rows = text.splitlines()
            assert "│" not in text and "─" not in text, command  # no borders
            assert all(len(row.split("\t")) == len(header.split("\t")) for row in rows), command
            assert len(rows) == (1 if command == "runs" else 3), command


def test_plain_is_a_header_line_then_tab_separated_rows_in_rank_order(seeded):
    result = invoke("leaderboard", EXPERIMENT, "--db-url", seeded, "--output", "plain")
    assert result.exit_code == 0, result.output
    header, *rows = result.stdout.splitlines()
    assert header.split("\t") == [
        "rank",
        "trial",
        "lr",
        "status",
        "failures",
        "min loss",
        "iteration",
        "best checkpoint",
    ]
    assert [row.split("\t")[1] for row in rows] == TRIAL_IDS  # trial i's loss is 1/3 + i
    assert rows[0].split("\t")[5:] == ["0.333333", "3", _checkpoint(TRIAL_IDS[0], 3)]


ASHA_STOP = (
    "stopped by ASHA at training_iteration=3 (rung 1 of 4): loss 0.41 above the rung's cutoff 0.35"
)


def test_trials_say_why_each_trial_stopped_in_every_format(tmp_path):
    from airflow_trials.store import TrialStore

    url = f"sqlite:///{tmp_path / 'trials.db'}"
    seed(url)
    store = TrialStore(url)
    try:
        update_trial(store, TRIAL_IDS[1], stop_reason=ASHA_STOP)
    finally:
        store.dispose()
    result = invoke("trials", EXPERIMENT, "--db-url", url, "--json")
    assert result.exit_code == 0, result.output
    assert [row["stop_reason"] for row in json.loads(result.stdout)["trials"]] == [
        None,
        ASHA_STOP,
        None,
    ]
    header, *rows = invoke("trials", EXPERIMENT, "--db-url", url, "-o", "plain").stdout.splitlines()
    assert header.split("\t")[-1] == "stop reason"
    assert [row.split("\t")[-1] for row in rows] == ["-", ASHA_STOP, "-"]


@pytest.mark.parametrize(
    "command",
    [
        ["experiments"],
        ["runs"],
        ["runs", EXPERIMENT],
        ["trials", EXPERIMENT],
        ["leaderboard", EXPERIMENT],
    ],
    ids=lambda c: "-".join(c)[:20],
)
def test_yaml_and_json_parse_back_to_the_same_rows(seeded, command):
    as_json = invoke(*command, "--db-url", seeded, "-o", "json")
    as_yaml = invoke(*command, "--db-url", seeded, "-o", "yaml")
    alias = invoke(*command, "--db-url", seeded, "--json")
    assert as_json.exit_code == as_yaml.exit_code == alias.exit_code == 0, (
        as_json.output + as_yaml.output
    )
    document = json.loads(as_json.stdout)
    assert document and yaml.safe_load(as_yaml.stdout) == document
    assert alias.stdout == as_json.stdout


def test_plot_output_formats(seeded, tmp_path):
    path = tmp_path / "curves.png"
    result = invoke("plot", EXPERIMENT, "--db-url", seeded, "--out", path, "-o", "yaml")
    assert result.exit_code == 0, result.output
    assert yaml.safe_load(result.stdout) == {
        "path": str(path),
        "trials": 3,
        "best_trial_id": TRIAL_IDS[0],
    }
    result = invoke("plot", EXPERIMENT, "--db-url", seeded, "--out", path, "-o", "plain")
    assert result.stdout.splitlines() == [
        "path\ttrials\tbest_trial_id",
        f"{path}\t3\t{TRIAL_IDS[0]}",
    ]


def test_json_and_another_output_disagree(seeded):
    line = one_error_line(invoke("runs", "--db-url", seeded, "--json", "-o", "yaml"))
    assert "pass only one of them" in line


def test_an_unknown_output_is_a_usage_error(seeded):
    assert invoke("runs", "--db-url", seeded, "-o", "csv").exit_code == 2


# -- stdout is the records only ------------------------------------------------------------------
MASKER_WARNING = "Skipping masking for a secret as it's too short"


@pytest.mark.parametrize(
    "command",
    [["experiments"], ["leaderboard", EXPERIMENT], ["trials", EXPERIMENT], ["history", EXPERIMENT]],
    ids=lambda c: c[0],
)
def test_json_is_json_when_airflow_logs_about_the_connection(seeded, command):
    """The trials_default connection's password is shorter than Airflow's secrets masker masks
    (5 characters): Airflow logs a warning as it reads the connection, through the log handler
    it set up on its import, in the command. It goes to stderr; stdout is the records only."""
    connection = json.dumps({"conn_type": "trials_db", "password": "pw", "extra": {"url": seeded}})
    env = {"AIRFLOW_CONN_TRIALS_DEFAULT": connection, "AIRFLOW_TRIALS_DB_URL": None}
    done = run_cli(*command, "-o", "json", env=env)
    assert done.returncode == 0, done.stderr
    assert MASKER_WARNING in done.stderr  # Airflow did log it, and not on stdout
    document = json.loads(done.stdout)
    assert document
    plain = run_cli(*command, "-o", "plain", env=env)
    assert plain.returncode == 0 and MASKER_WARNING not in plain.stdout, plain.stdout
    assert "\t" in plain.stdout.splitlines()[0]  # the header line comes first


# -- hostile values ------------------------------------------------------------------------------
HOSTILE_CONFIG = {"path": "[/x]", "style": "[bold red]loud[/]", "screen": "\x1b[2Jcleared\x07"}


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    """A run whose config values are Rich markup and terminal escapes, and whose key is markup."""
    from airflow_trials.store import TrialStore

    url = f"sqlite:///{tmp_path_factory.mktemp('cli_hostile') / 'trials.db'}"
    store = TrialStore(url, create=True)
    try:
        store.ensure_experiment("hostile", metric="loss", mode="min")
        run = store.create_experiment_run("hostile", "[/run]\x1b]0;title\x07")
        store.upsert_trial(
            "hostile-0", trainable="m:f", config=HOSTILE_CONFIG, resources={}, max_failures=0,
            experiment_run_id=run,
        )  # fmt: skip
        add_results(store, "hostile-0", [{"training_iteration": 1, "loss": 0.5}])
    finally:
        store.dispose()
    return url


@pytest.mark.parametrize("command", ["leaderboard", "trials", "runs"])
@pytest.mark.parametrize("fmt", ["table", "plain"])
def test_markup_and_terminal_escapes_in_values_are_printed_as_text(hostile, command, fmt):
    result = invoke(command, "hostile", "--db-url", hostile, "-o", fmt)
    assert result.exit_code == 0, result.output
    text = result.stdout
    assert "\x1b" not in text and "\x07" not in text  # nothing reaches the terminal raw
    if command == "runs" or fmt == "table":  # the run key: a column, or the table's title
        assert "[/run]\\x1b]0;title\\x07" in text
    if command == "leaderboard":
        assert "[/x]" in text and "[bold red]loud[/]" in text
        assert "\\x1b[2Jcleared\\x07" in text


def test_an_error_line_shows_escapes_instead_of_sending_them(hostile):
    line = one_error_line(
        invoke("leaderboard", "hostile", "--run", "[/x]\x1b[2J", "--db-url", hostile)
    )
    assert "\x1b" not in line and "[/x]\\x1b[2J" in line


EXPORT = ["export", "mlflow", EXPERIMENT, "--tracking-uri", "http://x:1"]


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["history", EXPERIMENT, "--last", "1e20"], "--last"),
        (["history", EXPERIMENT, "--last", str(10**20)], "--last"),
        (["leaderboard", EXPERIMENT, "--limit", str(10**20)], "--limit"),
        ([*EXPORT, "--max-artifact-mb", "inf"], "--max-artifact-mb"),
        ([*EXPORT, "--max-artifact-mb", "nan"], "--max-artifact-mb"),
    ],
    ids=lambda v: v if isinstance(v, str) else " ".join(v[-2:]),
)  # fmt: skip
def test_a_number_out_of_range_is_a_usage_error_not_a_traceback(seeded, args, option):
    result = invoke(*args, "--db-url", seeded)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert f"Invalid value for '{option}'" in result.output, result.output


# -- one-line errors -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("url", "fix"),
    [
        ("/tmp/x.db", "give a SQLAlchemy URL such as sqlite:////tmp/x.db"),
        ("nonsense", "give a SQLAlchemy URL such as sqlite:////path/trials.db"),
        ("mysql+notadriver://u@h/db", "use sqlite:/// or postgresql+psycopg://"),
        ("postgresql+pg8000://u@h/db", "use sqlite:/// or postgresql+psycopg://"),
    ],
)
@pytest.mark.parametrize(
    "command", [["experiments"], ["leaderboard", "x"], ["db", "upgrade"]], ids=" ".join
)
def test_a_bad_db_url_is_one_line_that_says_the_fix(url, fix, command, tmp_path, monkeypatch):
    if "pg8000" in url and importlib.util.find_spec("pg8000") is not None:
        pytest.skip("pg8000 is installed here; the case needs a driver that is not")
    monkeypatch.chdir(tmp_path)
    line = one_error_line(invoke(*command, "--db-url", url))
    assert fix in line and "--db-url" in line
    assert os.listdir(tmp_path) == []  # no x.db, no nonsense file


def test_a_refused_postgresql_connection_is_one_line_that_keeps_the_hint():
    line = one_error_line(run_cli("--db-url", REFUSED, "runs", timeout=60))
    assert "Connection refused" in line
    assert line.endswith(
        "Check that the database server is up and that the URL (host, port, user, database) is "
        "right."
    )


def test_a_store_error_keeps_its_hint_on_the_first_line():
    """The CLI prints only the first line of an error: the store's own messages are one line."""
    from airflow_trials.exceptions import StoreError
    from airflow_trials.store import TrialStore

    store = TrialStore(REFUSED, retry_max_attempts=1)
    try:
        with pytest.raises(StoreError) as raised:
            store.reader.list_experiments()
    finally:
        store.dispose()
    message = str(raised.value)
    assert (
        "\n" not in message
        and "Connection refused" in message
        and "Check that the database is up" in message
    )


@pytest.mark.parametrize("target", ["directory", "missing folder"])
def test_plot_out_must_be_a_file_in_an_existing_folder(seeded, tmp_path, target):
    out = tmp_path if target == "directory" else tmp_path / "no" / "such" / "curves.png"
    line = one_error_line(invoke("plot", EXPERIMENT, "--db-url", seeded, "--out", out))
    if target == "directory":
        assert f"--out {tmp_path} is a directory; name a .png file in it" in line
    else:
        assert f"the folder {tmp_path / 'no' / 'such'} does not exist; create it" in line
    assert not (tmp_path / "learning_curves.png").exists() and not (tmp_path / "no").exists()


def test_pool_set_on_a_never_migrated_airflow_home_creates_nothing(tmp_path):
    home = tmp_path / "airflow_home"
    home.mkdir()
    done = run_cli("pool", "set", "--gpus", "2", env={"AIRFLOW_HOME": str(home)})
    line = one_error_line(done)
    assert "does not exist; run `airflow db migrate`" in line and str(home / "airflow.db") in line
    assert not (home / "airflow.db").exists()
    assert not [p for p in tmp_path.rglob("*.db")]
