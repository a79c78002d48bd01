"""NewDatasetVersionTrigger on a real directory: a version that lands fires one event carrying
it, the versions already there fire nothing, and its serialized kwargs build it again."""

from __future__ import annotations

import asyncio

from airflow_trials.triggers.dataset_version_trigger import NewDatasetVersionTrigger

WAIT_SECONDS = 30


async def test_a_new_version_fires_one_event_and_an_existing_one_none(tmp_path):
    (tmp_path / "v0001").mkdir()
    (tmp_path / "v0002.csv").write_text("x\n")
    (tmp_path / ".v0003.tmp").mkdir()  # a version being written: not one yet
    trigger = NewDatasetVersionTrigger(directory=str(tmp_path), poll_interval_seconds=0.01)
    existing = trigger.versions()  # what run() takes as there already, when it starts
    assert existing == {"v0001", "v0002.csv"}
    events = trigger.new_versions(existing)
    first = asyncio.ensure_future(anext(events))
    (tmp_path / ".v0003.tmp").rename(tmp_path / "v0003")  # written whole, then renamed
    event = await asyncio.wait_for(first, WAIT_SECONDS)
    assert event.payload == {"version": "v0003", "path": str(tmp_path / "v0003")}
    # The next event is the next new version: neither v0003 again nor an existing one.
    (tmp_path / "v0004").mkdir()
    event = await asyncio.wait_for(anext(events), WAIT_SECONDS)
    assert event.payload["version"] == "v0004"
    await events.aclose()


async def test_only_names_matching_the_pattern_are_versions(tmp_path):
    trigger = NewDatasetVersionTrigger(
        directory=str(tmp_path / "later"), pattern="v*", poll_interval_seconds=0.01
    )
    assert trigger.versions() == set()  # the directory does not exist yet
    events = trigger.new_versions(set())
    first = asyncio.ensure_future(anext(events))
    (tmp_path / "later").mkdir()
    (tmp_path / "later" / "README").write_text("not a version")
    (tmp_path / "later" / "v7").mkdir()
    event = await asyncio.wait_for(first, WAIT_SECONDS)
    assert event.payload["version"] == "v7"
    await events.aclose()


def test_it_serializes_its_init_arguments():
    trigger = NewDatasetVersionTrigger(directory="/data/x", pattern="v*", poll_interval_seconds=5)
    classpath, kwargs = trigger.serialize()
    assert classpath == "airflow_trials.triggers.dataset_version_trigger.NewDatasetVersionTrigger"
    assert kwargs == {"directory": "/data/x", "pattern": "v*", "poll_interval_seconds": 5}
    assert NewDatasetVersionTrigger(**kwargs).serialize() == (classpath, kwargs)


def test_an_asset_watcher_takes_it(tmp_path):
    from airflow.sdk import Asset, AssetWatcher

    trigger = NewDatasetVersionTrigger(directory=str(tmp_path))
    asset = Asset("data", watchers=[AssetWatcher(name="new_version", trigger=trigger)])
    assert asset.watchers[0].trigger is trigger
