"""Re-tuning when new data lands, on the real stack (scheduler, triggerer): the DAG of
dags/retune_on_new_data.py, small. A version that lands in the watched directory makes the
triggerer's AssetWatcher (NewDatasetVersionTrigger) fire, the scheduler starts a run on the Asset
event, and the run records the version it tuned on; a second version starts a second run,
warm-started from the first's best, which records the second version.

dag.test() cannot take a triggering Asset event; this is where the event's real shape, as the
watcher hands it to the run, is tested.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from airflow_trials.experiment import trial_ids
from tests.faults.conftest import RUN_TIMEOUT_S, ExperimentRun, experiment_dag_source
from tests.faults.stack import FaultStack, log_tail

pytestmark = pytest.mark.timeout(900)

DAG_ID = "faults_retune_on_new_data"
TRIALS, ITERATIONS = 2, 3


def retune_dag_source(journal: Path, data_dir: Path) -> str:
    """The fault tests' experiment, scheduled on a dataset Asset watched in ``data_dir``, warm-
    started from the previous run's best trial and recording the version it tunes on."""
    source = experiment_dag_source(
        DAG_ID,
        journal,
        trials=TRIALS,
        iterations=ITERATIONS,
        hold_at=0,
        warm_start="WarmStart(top_k=1)",
        extra="data_version=DATASET,",
    )
    watched = (
        "from airflow.sdk import Asset, AssetWatcher\n"
        "from airflow_trials.triggers.dataset_version_trigger import NewDatasetVersionTrigger\n"
        "\n"
        f"DATASET = Asset('faults_dataset', uri='file://{data_dir}', watchers=[AssetWatcher(\n"
        "    name='faults_new_version',\n"
        f"    trigger=NewDatasetVersionTrigger(directory={str(data_dir)!r},\n"
        "                                     poll_interval_seconds=1.0))])\n"
        "\n"
        "with DAG("
    )
    for old, new in (("with DAG(", watched), ("schedule=None", "schedule=[DATASET]")):
        assert source.count(old) == 1, (old, source)
        source = source.replace(old, new)
    return source


def asset_triggered_runs(stack: FaultStack) -> list[dict[str, Any]]:
    body = stack.api("GET", f"/dags/{DAG_ID}/dagRuns", params={"order_by": "run_after"})
    return [r for r in body["dag_runs"] if r["run_type"] == "asset_triggered"]


def wait_telling_the_triggerer_log(stack: FaultStack, predicate: Any, what: str) -> Any:
    """``stack.wait_for(predicate)``; on a timeout, say which runs there are and what the
    triggerer (where the watcher runs) logged last."""
    try:
        return stack.wait_for(predicate, 300, what)
    except AssertionError as e:
        raise AssertionError(
            f"{e} Asset-triggered runs: {asset_triggered_runs(stack)}; the triggerer's log "
            f"ends:\n{log_tail(stack.log_path('triggerer'))}"
        ) from e


def land_and_run(stack: FaultStack, journal: Path, data_dir: Path, version: str) -> ExperimentRun:
    """Write ``version`` into the watched directory (whole, then renamed, as a writer should), wait
    for the run it starts to end, and return it."""
    before = len(asset_triggered_runs(stack))
    (data_dir / f".{version}.tmp").write_text(f"the rows of {version}\n")
    (data_dir / f".{version}.tmp").rename(data_dir / version)

    def started() -> dict[str, Any] | None:
        runs = asset_triggered_runs(stack)
        assert len(runs) <= before + 1, f"{version} started more than one run: {runs}"
        return runs[-1] if len(runs) == before + 1 else None

    run_id = wait_telling_the_triggerer_log(
        stack, started, f"a run of {DAG_ID} on version {version}"
    )["dag_run_id"]
    run = ExperimentRun(stack, DAG_ID, journal, TRIALS, ITERATIONS, run_id=run_id)
    run.trial_ids = trial_ids(DAG_ID, DAG_ID, run_id, TRIALS)
    assert run.finish(RUN_TIMEOUT_S) == "success", stack.task_instances(DAG_ID, run_id)
    return run


def triggering_payloads(stack: FaultStack, run_id: str) -> list[Any]:
    """What the watcher's events that triggered the run carry, as Airflow recorded them."""
    body = stack.api("GET", f"/dags/{DAG_ID}/dagRuns/{quote(run_id, safe='')}/upstreamAssetEvents")
    return [event["extra"] for event in body["asset_events"]]


def published_versions(stack: FaultStack, run_id: str) -> list[Any]:
    """The data versions the run's best-trial Asset events carry."""
    body = stack.api(
        "GET", "/assets/events", params={"source_dag_id": DAG_ID, "source_run_id": run_id}
    )
    return [event["extra"].get("data_version") for event in body["asset_events"]]


def recorded_version(run: ExperimentRun) -> Any:
    store = run.store()
    try:
        (record,) = [
            r for r in store.reader.list_experiment_runs(DAG_ID) if r.run_key == run.run_id
        ]
        return record.data_version
    finally:
        store.dispose()


def test_each_new_version_starts_a_run_that_records_it_warm_started_from_the_last(stack):
    journal = stack.home / "journal" / DAG_ID
    journal.mkdir(parents=True, exist_ok=True)
    data_dir = stack.home / "data" / DAG_ID
    data_dir.mkdir(parents=True)
    (data_dir / "v0000").write_text("there before the watcher: no run\n")
    stack.write_dag(f"{DAG_ID}.py", retune_dag_source(journal, data_dir))
    stack.wait_for_dag(DAG_ID)
    # The versions there when the trigger starts fire nothing: land one only once it watches.
    watching = f"Watching {data_dir} for new dataset versions (1 there already)"
    wait_telling_the_triggerer_log(
        stack,
        lambda: watching in stack.log_path("triggerer").read_text(),
        f"the triggerer to log {watching!r}",
    )

    first = land_and_run(stack, journal, data_dir, "v0001")
    assert triggering_payloads(stack, first.run_id) == [
        {"from_trigger": True, "payload": {"version": "v0001", "path": str(data_dir / "v0001")}}
    ]
    assert recorded_version(first) == "v0001"
    assert published_versions(stack, first.run_id) == ["v0001"]
    first.assert_trials_end("TERMINATED")
    first.assert_experiment_run("SUCCESS")

    second = land_and_run(stack, journal, data_dir, "v0002")
    assert recorded_version(second) == "v0002"
    assert published_versions(stack, second.run_id) == ["v0002"]
    records = second.assert_trials_end("TERMINATED")
    second.assert_experiment_run("SUCCESS")
    # The first run's best trial (x=2: score 2 * iteration) runs first, from that run.
    seeded = records[second.trial_ids[0]]
    assert seeded.warm_start["run_key"] == first.run_id and seeded.config["x"] == 2, seeded
    assert all(records[t].warm_start is None for t in second.trial_ids[1:])
    # v0000 started no run, and each version one.
    assert [r["dag_run_id"] for r in asset_triggered_runs(stack)] == [
        first.run_id,
        second.run_id,
    ]
