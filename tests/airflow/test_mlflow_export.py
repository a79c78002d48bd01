"""``airflow-trials export mlflow`` and ``tuning_experiment(mlflow_export=...)`` against a real
``mlflow server`` (SQLite backend store, served artifacts in a temporary folder, a free port),
started once for the module: a seeded run from SQLite and PostgreSQL trials DBs, then a real
short run through dag.test(). Every export is repeated, and the repeat changes nothing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

import pytest
from typer.testing import CliRunner

from airflow_trials.cli import app
from airflow_trials.ports import free_port
from tests.contract.conftest import new_postgres_schema
from tests.factories import add_checkpoint, add_results
from tests.plugins.history_seed import EARLY, EXPERIMENT, seed_nightly

runner = CliRunner()
SERVER_START_SECONDS = 600  # a readiness wait, not a timing: a loaded CI machine is slow


@pytest.fixture(scope="module")
def tracking_uri(tmp_path_factory):
    root = tmp_path_factory.mktemp("mlflow_server")
    port = free_port()
    log_path = root / "server.log"
    command = [
        os.path.join(os.path.dirname(sys.executable), "mlflow"),
        "server",
        "--backend-store-uri",
        f"sqlite:///{root / 'mlflow.db'}",
        "--artifacts-destination",
        str(root / "artifacts"),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        "1",
    ]
    with open(log_path, "w") as log:
        server = subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            # Its job runner (GenAI scoring) is of no use here, and costs a process.
            env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
        )
    uri = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + SERVER_START_SECONDS
        while not _answers(f"{uri}/health"):
            if server.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"mlflow server did not start:\n{log_path.read_text()[-3000:]}")
            time.sleep(0.5)
        yield uri
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def _client(uri):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


def _export(url, uri, *args):
    result = runner.invoke(
        app,
        ["export", "mlflow", *args, "--db-url", url, "--tracking-uri", uri, "--output", "json"],
    )
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def _history(client, run_id, key):
    return [(m.step, m.value) for m in client.get_metric_history(run_id, key)]


def _everything(client, experiment_id):
    """Every run's params, tags, status and metric histories: what a repeated export must keep."""
    runs = client.search_runs([experiment_id], max_results=1000)
    return {
        run.info.run_id: (
            run.data.params,
            run.data.tags,
            run.info.status,
            run.info.end_time,
            {key: _history(client, run.info.run_id, key) for key in run.data.metrics},
            [a.path for a in client.list_artifacts(run.info.run_id, "checkpoints")],
        )
        for run in runs
    }


@pytest.fixture(params=["sqlite", "postgresql"])
def seeded(request, tmp_path):
    """One nightly run (6 trials: best, early-stopped, at max_t, criterion met, errored,
    running) whose best trial has a small checkpoint and whose max_t trial a larger one."""
    if request.param == "sqlite":
        yield from _seed(f"sqlite:///{tmp_path / 'trials.db'}", tmp_path, request.param)
    else:
        with new_postgres_schema() as url:
            yield from _seed(url, tmp_path, request.param)


def _seed(url, tmp_path, backend):
    from airflow_trials.store import TrialStore

    store = TrialStore(url, create=True)
    try:
        night = seed_nightly(store, nights=1).nights[0]
        small = tmp_path / "n0-best" / "checkpoint_000002"
        small.mkdir(parents=True)
        (small / "model.bin").write_bytes(b"m" * 200)
        (small / "state.json").write_text('{"i": 2}')
        large = tmp_path / "n0-maxt" / "checkpoint_000001"
        large.mkdir(parents=True)
        (large / "model.bin").write_bytes(b"m" * 4000)
        add_checkpoint(store, "n0-best", str(small), 2, 0.5)
        add_checkpoint(store, "n0-maxt", str(large), 1, 0.8)
        yield url, store, night, backend, small, large
    finally:
        store.dispose()


def test_a_run_becomes_a_parent_run_with_a_child_run_per_trial(tracking_uri, seeded, tmp_path):
    from mlflow.artifacts import download_artifacts

    from airflow_trials.core.fate import CRITERION_MET

    url, store, night, backend, small, large = seeded
    target = f"nightly-{backend}"
    # Every trial's checkpoint is asked for; 3000 bytes lets the small one in, not the large.
    options = ["--mlflow-experiment", target, "--checkpoints", "all"]
    options += ["--max-artifact-mb", str(3000 / 1024 / 1024), "--storage-path", str(tmp_path)]
    first = _export(url, tracking_uri, EXPERIMENT, "--run", night.run_key, *options)
    assert (first["trials"], first["runs_created"], first["runs_updated"]) == (6, 7, 0)
    assert (first["artifacts_logged"], first["checkpoints_referenced"]) == (1, 1)
    assert first["metrics_logged"] == 5  # the best's 2 losses, one each for three others
    assert first["notes"] == [
        f"trial n0-maxt: best checkpoint {large} is 4000 bytes, more than max_artifact_bytes "
        "3000; referenced by its URI (tag airflow_trials.best_checkpoint), not logged."
    ]

    client = _client(tracking_uri)
    experiment = client.get_experiment_by_name(target)
    parent = client.get_run(first["parent_run_id"])
    assert parent.info.run_name == night.run_key and parent.info.status == "FINISHED"
    assert parent.data.params == {"metric": "loss", "mode": "min"}
    tags = parent.data.tags
    assert tags["airflow_trials.kind"] == "experiment_run"
    assert tags["airflow_trials.run_key"] == night.run_key
    assert tags["airflow_trials.experiment_run_id"] == str(night.run)
    assert tags["airflow_trials.best_trial_id"] == "n0-best"
    assert tags["airflow_trials.status"] == "SUCCESS"

    children = {
        run.data.tags["airflow_trials.trial_id"]: run
        for run in client.search_runs(
            [experiment.experiment_id], f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'"
        )
    }
    assert set(children) == {f"n0-{name}" for name in ("best", "early", "maxt", "criterion")} | {
        "n0-failed",
        "n0-running",
    }
    best = children["n0-best"]
    assert best.info.run_name == "n0-best"
    assert best.data.params == {"lr": "0.01", "layers": "2"}
    assert _history(client, best.info.run_id, "loss") == [(1, 0.6), (2, 0.5)]
    assert best.info.status == "FINISHED"
    assert best.data.tags["airflow_trials.status"] == "TERMINATED"
    assert best.data.tags["airflow_trials.exported_iteration"] == "2"
    assert best.data.tags["airflow_trials.best_checkpoint"] == str(small)
    artifact = best.data.tags["airflow_trials.best_checkpoint_artifact"]
    assert artifact == "checkpoints/checkpoint_000002"
    local = download_artifacts(
        run_id=best.info.run_id,
        artifact_path=artifact,
        dst_path=str(tmp_path / "downloaded"),
        tracking_uri=tracking_uri,
    )
    assert sorted(os.listdir(local)) == ["model.bin", "state.json"]
    assert open(os.path.join(local, "model.bin"), "rb").read() == b"m" * 200

    early = children["n0-early"].data.tags
    assert early["airflow_trials.stop_reason"] == EARLY.format(loss=0.9, cut=0.7)
    assert children["n0-criterion"].data.tags["airflow_trials.stop_reason"] == CRITERION_MET
    maxt = children["n0-maxt"].data.tags
    assert maxt["airflow_trials.best_checkpoint"] == str(large)
    assert "airflow_trials.best_checkpoint_artifact" not in maxt
    failed = children["n0-failed"]
    assert failed.info.status == "FAILED"
    assert failed.data.tags["airflow_trials.error"] == "RuntimeError: diverged"
    assert children["n0-running"].info.status == "RUNNING"

    # Exported again: nothing is created, logged or changed.
    before = _everything(client, experiment.experiment_id)
    again = _export(url, tracking_uri, EXPERIMENT, "--run", night.run_key, *options)
    assert {k: again[k] for k in _COUNTED} == dict.fromkeys(_COUNTED, 0)
    assert again["parent_run_id"] == first["parent_run_id"]
    assert _everything(client, experiment.experiment_id) == before

    # The running trial reports and ends: only what is new is logged, into the same runs.
    from airflow_trials.core.end import TrialEnd
    from airflow_trials.core.fate import TRAINABLE_FINISHED
    from airflow_trials.core.status import TrialStatus

    # Losses above the best's 0.5: the parent's best trial stays, and so does the parent.
    add_results(
        store, "n0-running", [{"training_iteration": i, "loss": 1 + i / 10} for i in (1, 2)]
    )
    store.record_end(
        TrialEnd("n0-running", EXPERIMENT, TrialStatus.TERMINATED, stop_reason=TRAINABLE_FINISHED)
    )
    later = _export(url, tracking_uri, EXPERIMENT, "--run", night.run_key, *options)
    assert (later["runs_created"], later["runs_updated"], later["metrics_logged"]) == (0, 1, 2)
    running = client.get_run(children["n0-running"].info.run_id)
    assert running.info.status == "FINISHED"
    assert running.data.tags["airflow_trials.stop_reason"] == TRAINABLE_FINISHED
    assert _history(client, running.info.run_id, "loss") == [(1, 1.1), (2, 1.2)]
    assert len(client.search_runs([experiment.experiment_id])) == 7


_COUNTED = [
    "runs_created",
    "runs_updated",
    "params_logged",
    "metrics_logged",
    "artifacts_logged",
]


def test_a_checkpoint_outside_the_storage_root_is_referenced_never_read(tracking_uri, seeded):
    """A row that names a folder outside the storage root (``/etc``, another team's) is not
    read or uploaded: the export references it and says why."""
    url, store, night, backend, small, large = seeded
    elsewhere = str(small.parent.parent / "another-root")
    options = ["--mlflow-experiment", f"outside-{backend}", "--checkpoints", "all"]
    summary = _export(
        url, tracking_uri, EXPERIMENT, "--run", night.run_key, *options, "--storage-path", elsewhere
    )
    assert (summary["artifacts_logged"], summary["checkpoints_referenced"]) == (0, 2)
    assert sorted(summary["notes"]) == [
        f"trial {trial}: best checkpoint {path} is outside the storage root {elsewhere}; "
        "referenced by its URI (tag airflow_trials.best_checkpoint), not logged."
        for trial, path in (("n0-best", small), ("n0-maxt", large))
    ]


def test_without_mlflow_the_error_names_the_extra(tmp_path, monkeypatch):
    from airflow_trials.store import TrialStore

    url = f"sqlite:///{tmp_path / 'trials.db'}"
    store = TrialStore(url, create=True)
    try:
        seed_nightly(store, nights=1)
    finally:
        store.dispose()
    monkeypatch.setitem(sys.modules, "mlflow.tracking", None)  # import mlflow.tracking fails
    result = runner.invoke(
        app, ["export", "mlflow", EXPERIMENT, "--db-url", url, "--tracking-uri", "http://x:1"]
    )
    assert result.exit_code == 1
    from airflow_trials.export.mlflow import INSTALL_HINT

    assert f"install it with {INSTALL_HINT}" in result.output
    assert "'.[mlflow]'" in INSTALL_HINT


def _seeded_sqlite(tmp_path) -> tuple[str, str]:
    from airflow_trials.store import TrialStore

    url = f"sqlite:///{tmp_path / 'trials.db'}"
    store = TrialStore(url, create=True)
    try:
        return url, seed_nightly(store, nights=1).nights[0].run_key
    finally:
        store.dispose()


def test_the_tracking_uri_s_password_is_never_printed(tracking_uri, tmp_path, monkeypatch):
    url, run_key = _seeded_sqlite(tmp_path)
    # The server takes no login, so it answers a URI with credentials in it all the same.
    with_password = tracking_uri.replace("http://", "http://alice:s3cret@")
    args = ["export", "mlflow", EXPERIMENT, "--run", run_key, "--db-url", url]
    args += ["--tracking-uri", with_password, "--mlflow-experiment", "masked"]
    for output in ("json", "table"):
        result = runner.invoke(app, [*args, "--output", output])
        assert result.exit_code == 0, result.output
        assert "s3cret" not in result.output and "alice:***@127.0.0.1" in result.output
    # A server that does not answer: the error names the URI, masked.
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    refused = f"http://alice:s3cret@127.0.0.1:{free_port()}"
    args[args.index(with_password)] = refused
    result = runner.invoke(app, args)
    assert result.exit_code == 1 and "Error:" in result.output, result.output
    assert "s3cret" not in result.output and "alice:***@127.0.0.1" in result.output


def test_the_task_follows_select_best_and_exports_a_real_run(trials_env, tracking_uri):
    from airflow_trials.core.search import grid_search
    from tests.airflow.test_experiment_dag import experiment_dag, task_states, xcom

    dag = experiment_dag(
        "exported",
        search_space={"scale": grid_search([1.0, 2.0])},
        mlflow_export=tracking_uri,
    )
    assert dag.get_task("tune.export_mlflow").upstream_task_ids == {"tune.select_best"}
    run = dag.test()
    assert run.state == "success", task_states(run)
    summary = xcom(run, "tune.export_mlflow")
    best = xcom(run, "tune.select_best")
    assert (summary["trials"], summary["runs_created"], summary["artifacts_logged"]) == (2, 3, 1)

    client = _client(tracking_uri)
    experiment = client.get_experiment_by_name("exported")
    children = {
        r.data.tags["airflow_trials.trial_id"]: r
        for r in client.search_runs(
            [experiment.experiment_id],
            f"tags.`mlflow.parentRunId` = '{summary['parent_run_id']}'",
        )
    }
    logged_points = sum(
        len(client.get_metric_history(r.info.run_id, key))
        for r in children.values()
        for key in r.data.metrics
    )
    assert summary["metrics_logged"] == logged_points > 6  # score, and more, at steps 1 to 3
    top = children[best["trial_id"]]
    assert top.data.params == {"scale": "2.0"}
    assert _history(client, top.info.run_id, "score") == [(1, 2.0), (2, 4.0), (3, 6.0)]
    assert top.data.tags["airflow_trials.best_checkpoint"] == best["best_checkpoint"]
    logged = client.list_artifacts(
        top.info.run_id, top.data.tags["airflow_trials.best_checkpoint_artifact"]
    )
    assert logged  # the checkpoint's files

    # The CLI, run after the task, finds the same runs and logs nothing.
    again = _export(trials_env.url, tracking_uri, "exported")
    assert again["parent_run_id"] == summary["parent_run_id"]
    assert {k: again[k] for k in _COUNTED} == dict.fromkeys(_COUNTED, 0)


def _declared(**kwargs):
    """A DAG with the experiment ``tune`` (exported to MLflow) and a task ``deploy`` after its
    group; ``deploy``'s upstream task ids."""
    import datetime as dt

    from airflow.sdk import DAG, task

    from airflow_trials.core.search import uniform
    from airflow_trials.experiment import tuning_experiment

    with DAG("declared", schedule=None, start_date=dt.datetime(2026, 1, 1, tzinfo=dt.UTC)):
        group = tuning_experiment(
            experiment_name="declared",
            trainable="tests.trainables:counting",
            search_space={"x": uniform(0.0, 1.0)},
            metric="loss",
            group_id="tune",
            mlflow_export="http://mlflow:5000",
            **kwargs,
        )

        @task(task_id="deploy")
        def deploy():
            return None

        deployed = deploy()
        group >> deployed
    return deployed.operator.upstream_task_ids


@pytest.mark.parametrize(
    ("kwargs", "waits_for"),
    [
        ({}, {"tune.select_best"}),
        ({"regression_tolerance": {"relative": 0.05}}, {"tune.check_regression"}),
        ({"approval": True, "approvers": ["alice"]}, {"tune.publish_best"}),
    ],
)
def test_a_task_after_the_group_does_not_wait_for_the_export(kwargs, waits_for):
    assert _declared(**kwargs) == waits_for


def test_a_failed_export_does_not_hold_back_the_task_after_the_group(trials_env, monkeypatch):
    """MLflow does not answer: export_mlflow fails (and with it the DAG run), and the task after
    the group runs all the same, once select_best has."""
    from airflow_trials.core.search import grid_search
    from tests.airflow.conftest import load_dag_source
    from tests.airflow.test_experiment_dag import task_states

    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    source = (
        "import datetime\n"
        "from airflow.sdk import DAG, task\n"
        "from airflow_trials.experiment import tuning_experiment\n\n"
        "with DAG('export_down', schedule=None, start_date=datetime.datetime(2026, 1, 1)) as dag:\n"
        "    group = tuning_experiment(\n"
        "        experiment_name='export_down', group_id='tune',\n"
        "        trainable='tests.trainables:counting', metric='score', mode='max',\n"
        f"        search_space={{'scale': {grid_search([1.0, 2.0])!r}}},\n"
        "        stop={'training_iteration': 2}, resources_per_trial={'cpu': 0.5},\n"
        "        poll_interval_seconds=0.05,\n"
        f"        mlflow_export='http://127.0.0.1:{free_port()}',\n"
        "    )\n\n"
        "    @task(task_id='deploy')\n"
        "    def deploy():\n"
        "        return 'deployed'\n\n"
        "    group >> deploy()\n"
    )
    run = load_dag_source("export_down", source).test()
    states = task_states(run)
    assert states[("tune.select_best", -1)] == "success", states
    assert states[("tune.export_mlflow", -1)] == "failed", states
    assert states[("deploy", -1)] == "success", states
    assert run.state == "failed"  # the failed export shows, as a red box of its own
