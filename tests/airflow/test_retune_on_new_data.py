"""Re-tuning when new data lands (dags/retune_on_new_data.py): the DAG is scheduled on the
dataset's Asset, watched by NewDatasetVersionTrigger; each run records the data version it tuned
on (from its triggering Asset event, or the trigger form's field), is warm-started from the last
run's best, and its best-trial Asset event carries the version. Real Airflow (dag.test), real Ray
and a real trials DB."""

from __future__ import annotations

import datetime as dt

import pytest
from airflow.sdk import Asset
from airflow.sdk.execution_time.comms import AssetEventDagRunReferenceResult
from airflow.sdk.execution_time.context import TriggeringAssetEventsAccessor

from airflow_trials.experiment.data_version import (
    DATA_VERSION_PARAM,
    checked_data_version,
    run_data_version,
)
from airflow_trials.triggers.dataset_version_trigger import NewDatasetVersionTrigger
from tests.airflow.test_approval_answered import asset_events
from tests.airflow.test_example_dags import load

DATASET = Asset("regression_dataset", uri="file:///data/regression")


def triggered_by(asset: Asset, *extras: dict) -> dict:
    """A task context whose DAG run was triggered by events of ``asset`` with these extras."""
    events = [
        AssetEventDagRunReferenceResult(
            asset={"name": asset.name, "uri": asset.uri, "extra": {}},
            extra=extra,
            source_task_id=None,
            source_dag_id=None,
            source_run_id=None,
            source_map_index=None,
            source_aliases=[],
            timestamp=dt.datetime(2026, 1, 1, tzinfo=dt.UTC),
        )
        for extra in extras
    ]
    return {"triggering_asset_events": TriggeringAssetEventsAccessor.build(events), "params": {}}


def test_the_version_is_the_one_the_last_triggering_event_carries():
    # An AssetWatcher's event: Airflow wraps the trigger's payload.
    watcher = {"from_trigger": True, "payload": {"version": "v0008", "path": "/data/v0008"}}
    assert run_data_version("exp", DATASET, None, triggered_by(DATASET, watcher)) == "v0008"
    # Events queued together: the last one's; a task's event names it in its extra.
    context = triggered_by(DATASET, watcher, {"version": "v0009"})
    assert run_data_version("exp", DATASET, None, context) == "v0009"
    # Another Asset's event, or none: the param, else no version.
    other = triggered_by(Asset("other"), {"version": "x"})
    assert run_data_version("exp", DATASET, None, other) is None
    other["params"] = {DATA_VERSION_PARAM: "v-manual"}
    assert run_data_version("exp", DATASET, None, other) == "v-manual"
    # A template, as Airflow rendered it; empty: the param.
    assert run_data_version("exp", "{{ x }}", "2026-05", {"params": {}}) == "2026-05"
    assert run_data_version("exp", "{{ x }}", "", {"params": {DATA_VERSION_PARAM: "p"}}) == "p"
    assert run_data_version("exp", None, "ignored", other) is None


def test_a_version_too_long_or_a_bad_argument_is_refused_in_one_line():
    with pytest.raises(ValueError, match=r"is 251 characters, over 250; name the version"):
        run_data_version("exp", DATASET, None, triggered_by(DATASET, {"version": "v" * 251}))
    with pytest.raises(ValueError, match=r"Experiment exp: data_version must be the dataset's"):
        checked_data_version("exp", 7)


def test_the_example_is_scheduled_on_the_watched_dataset(airflow_home, tmp_path, monkeypatch):
    monkeypatch.setenv("RETUNE_DATA_DIR", str(tmp_path / "data"))
    module = load("retune_on_new_data.py")
    [watcher] = module.DATASET.watchers
    assert isinstance(watcher.trigger, NewDatasetVersionTrigger)
    assert watcher.trigger.directory == str(tmp_path / "data")
    assert module.DATASET in module.dag.timetable.asset_condition.objects
    # The trigger form's field, for a run triggered by hand.
    assert module.dag.params.get_param(DATA_VERSION_PARAM).schema["type"] == ["null", "string"]


def test_each_run_records_its_version_is_warm_started_and_publishes_it(
    trials_env, tmp_path, monkeypatch
):
    monkeypatch.setenv("RETUNE_DATA_DIR", str(tmp_path / "data"))
    module = load("retune_on_new_data.py")
    first = module.dag.test(run_conf={DATA_VERSION_PARAM: "v0001"})
    second = module.dag.test(run_conf={DATA_VERSION_PARAM: "v0002"})
    assert (first.state, second.state) == ("success", "success")
    reader = trials_env.store.reader
    runs = {r.run_key: r for r in reader.list_experiment_runs("retune_on_new_data")}
    assert runs[first.run_id].data_version == "v0001"
    assert runs[second.run_id].data_version == "v0002"
    # The second run started from the first run's best trials.
    seeded = [
        t.warm_start
        for t in reader.list_trials(experiment_run_id=runs[second.run_id].id)
        if t.warm_start
    ]
    assert len(seeded) == 3 and {s["run_key"] for s in seeded} == {first.run_id}
    # Each run's best-trial Asset event carries the version it tuned on.
    [event] = asset_events(second)
    assert event["data_version"] == "v0002"
    assert event["experiment_run_id"] == runs[second.run_id].id
