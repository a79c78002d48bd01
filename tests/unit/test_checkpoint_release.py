"""A self-driving trial actor (in-process, as Ray hosts it) deletes a checkpoint that
``keep_checkpoints_num`` dropped only once the trials DB no longer names it; a checkpoint that is
gone ends a restore as infrastructure, not as a failure of the trial.

Each watch here is what the trigger does: poll the actor with the tracker's arguments, write the
progress to a real SQLite trials DB, and tell the tracker it was written.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from airflow_trials.core.fate import Outcome, after_failure
from airflow_trials.core.trial import Trial
from airflow_trials.core.update import TrialUpdate
from airflow_trials.execution.polls import TrialProgressTracker
from airflow_trials.execution.resume import adopt_recorded_checkpoints
from airflow_trials.execution.worker.actor import TrialActor
from airflow_trials.storage.trial_storage import TrialStorage
from airflow_trials.store import TrialStore
from tests.factories import add_checkpoint

# A failsafe only: each wait returns as soon as what it waits for happened.
WAIT_S = 60.0
TRAINABLE = "tests.trainables:counting"


@pytest.fixture
def store(tmp_path):
    trials_db = TrialStore(f"sqlite:///{tmp_path / 'trials.db'}", create=True)
    yield trials_db
    trials_db.dispose()


def _trial(trial_id: str, *, keep: int, until: int, score_attr: str | None = None) -> Trial:
    return Trial(
        TRAINABLE,
        {},
        trial_id=trial_id,
        experiment_name="unit",
        keep_checkpoints_num=keep,
        checkpoint_score_attr=score_attr,
        stopping_criterion={"training_iteration": until},
    )


def _start(
    storage: str, store: TrialStore, trial: Trial, config: dict, restore_from: str | None = None
) -> TrialActor:
    store.upsert_trial(
        trial.trial_id, trainable=TRAINABLE, config=config, resources={"cpu": 1}, max_failures=0
    )
    spec = {
        "trial_id": trial.trial_id,
        "experiment_name": "unit",
        "trainable": TRAINABLE,
        "config": config,
    }
    actor = TrialActor(spec, storage, storage, capture_output=False)
    actor.run(trial.to_json_state(), restore_from)
    return actor


def _watch_once(actor: TrialActor, tracker: TrialProgressTracker, store: TrialStore) -> TrialUpdate:
    """One poll and its write, as the trigger makes them."""
    snapshot = actor.poll(*tracker.poll_args(0.0))
    item = tracker.progress(snapshot)
    if item is not None:
        store.record_progress([item])
    tracker.written(item)
    return snapshot


def _until(actor: TrialActor, ready) -> TrialUpdate:
    """The first snapshot ``ready`` accepts, polled without writing anything (nobody watches)."""
    deadline = time.monotonic() + WAIT_S
    while True:
        snapshot = actor.poll(10**9, wait_s=0.2)
        if ready(snapshot):
            return snapshot
        assert time.monotonic() < deadline, snapshot


def _on_disk(storage: str, trial_id: str) -> list[str]:
    return sorted(p.name for p in (Path(storage) / "unit" / trial_id).glob("checkpoint_*"))


def _live_paths_exist(store: TrialStore, trial_id: str) -> bool:
    return all(os.path.isdir(c.path) for c in store.reader.live_checkpoints(trial_id))


def test_checkpoints_the_store_names_survive_while_the_trial_trains_on_unwatched(
    storage, store, tmp_path
):
    gate = tmp_path / "gate"
    config = {"hold_at": 4, "gate": str(gate)}
    actor = _start(storage, store, _trial("t1", keep=1, until=12), config)
    tracker = TrialProgressTracker("t1")
    _watch_once(actor, tracker, store)  # the trigger's first poll: RUNNING
    _until(
        actor, lambda s: s.kept_checkpoints and s.kept_checkpoints[-1].iteration == 3
    )  # held before 4
    _watch_once(actor, tracker, store)
    _watch_once(actor, tracker, store)  # acknowledges that write: what it marked deleted goes
    recorded = store.reader.latest_checkpoint("t1")
    assert recorded.iteration == 3 and _on_disk(storage, "t1") == ["checkpoint_000003"]

    gate.touch()  # the watcher dies here: the trial trains on to 12, checkpointing each iteration
    ended = _until(actor, lambda s: s.status != "RUNNING")
    assert ended.status == "TERMINATED"
    assert [c.iteration for c in ended.kept_checkpoints] == [12]
    # What keep_checkpoints_num=1 dropped is kept on the storage: the store still names iteration 3.
    assert os.path.isdir(recorded.path) and store.reader.latest_checkpoint("t1") == recorded
    assert _on_disk(storage, "t1") == [f"checkpoint_{i:06d}" for i in range(3, 13)]

    # A new watcher (a restarted triggerer) starts from what the store holds and records the end.
    tracker = TrialProgressTracker(
        "t1", recorded={c.path for c in store.reader.live_checkpoints("t1")}
    )
    _watch_once(actor, tracker, store)
    assert store.reader.latest_checkpoint("t1").iteration == 12
    assert [c.iteration for c in store.reader.live_checkpoints("t1")] == [12]
    assert _on_disk(storage, "t1") == [
        f"checkpoint_{i:06d}" for i in range(3, 13)
    ]  # not yet acknowledged
    deleted = actor.release_checkpoints(tracker.recorded_version)
    assert len(deleted) == 9 and _on_disk(storage, "t1") == ["checkpoint_000012"]
    assert _live_paths_exist(store, "t1")
    assert [r["training_iteration"] for r in store.reader.get_results("t1")] == list(range(1, 13))


def test_a_watched_trial_never_leaves_the_store_naming_a_deleted_checkpoint(storage, store):
    actor = _start(storage, store, _trial("t2", keep=2, until=15), {"sleep": 0.01})
    tracker = TrialProgressTracker("t2")
    while True:
        snapshot = _watch_once(actor, tracker, store)
        assert _live_paths_exist(store, "t2"), snapshot
        if snapshot.status != "RUNNING":
            break
    _watch_once(actor, tracker, store)  # the next poll acknowledges the last write
    assert snapshot.status == "TERMINATED"
    assert [c.iteration for c in store.reader.live_checkpoints("t2")] == [15, 14]
    assert _on_disk(storage, "t2") == ["checkpoint_000014", "checkpoint_000015"]


def test_a_resumed_trial_drops_the_checkpoint_it_resumed_from_only_once_the_store_moved_on(
    storage, store
):
    actor = _start(storage, store, _trial("t3", keep=1, until=4), {})
    tracker = TrialProgressTracker("t3")
    while _watch_once(actor, tracker, store).status == "RUNNING":
        pass
    _watch_once(
        actor, tracker, store
    )  # acknowledges the end's write, as the trigger does at the end
    assert _on_disk(storage, "t3") == ["checkpoint_000004"]
    trial = _trial("t3", keep=1, until=7)
    newest = adopt_recorded_checkpoints(trial, store, TrialStorage(storage))  # as the operator does
    assert newest is not None and newest.iteration == 4 and trial.restore_source() == newest.path
    actor = _start(storage, store, trial, {}, restore_from=trial.restore_source())
    tracker = TrialProgressTracker(
        "t3", recorded={c.path for c in store.reader.live_checkpoints("t3")}
    )
    while (snapshot := _watch_once(actor, tracker, store)).status == "RUNNING":
        assert _live_paths_exist(store, "t3")
    _watch_once(actor, tracker, store)
    assert snapshot.status == "TERMINATED"
    assert [c.iteration for c in store.reader.live_checkpoints("t3")] == [7]
    assert _on_disk(storage, "t3") == ["checkpoint_000007"]
    assert [r["training_iteration"] for r in store.reader.get_results("t3")] == list(range(1, 8))


def test_a_checkpoint_gone_from_the_storage_ends_the_restore_as_infrastructure(storage, store):
    missing = TrialStorage(storage).checkpoint_dir("unit", "t4", 9)
    actor = _start(storage, store, _trial("t4", keep=1, until=12), {}, restore_from=missing)
    ended = _until(actor, lambda s: s.status != "RUNNING")
    assert missing in ended.error and "Not a failure of the trial" in ended.error
    assert_resumed_without_a_failure(ended, "t4")


def assert_resumed_without_a_failure(ended: TrialUpdate, trial_id: str) -> None:
    """The actor's end is an infrastructure loss, which the task's retry resumes uncounted."""
    assert ended.status == "ERROR" and ended.infrastructure is True
    end = ended.end("unit", released=False)
    decision = after_failure(trial_id, 0, 0, infrastructure=end.infrastructure, retries_left=True)
    assert decision.outcome is Outcome.RESUME and decision.num_failures == 0


def test_a_failing_trainable_is_still_a_failure_of_the_trial(storage, store, tmp_path):
    config = {"crash_at": 2, "marker": str(tmp_path / "crashed")}
    actor = _start(storage, store, _trial("t5", keep=1, until=5), config)
    ended = _until(actor, lambda s: s.status != "RUNNING")
    assert ended.status == "ERROR" and ended.infrastructure is False


def test_a_resumed_trial_keeps_its_best_scoring_checkpoint_and_drops_what_the_dead_one_left(
    storage, store
):
    """keep_checkpoints_num=2 by the lowest score: the trials DB names the best (iteration 1), the
    newest (5) and one the lost incarnation dropped without the DB hearing of it (3). The resumed
    trial keeps 1 and 5 as its own, drops 3 at once, and deletes it once the DB recorded that."""
    actor = _start(storage, store, _trial("t6", keep=2, until=5, score_attr="min-score"), {})
    tracker = TrialProgressTracker("t6")
    while _watch_once(actor, tracker, store).status == "RUNNING":
        pass
    _watch_once(actor, tracker, store)
    assert [c.iteration for c in store.reader.live_checkpoints("t6")] == [5, 1]
    storage_ = TrialStorage(storage)
    stale = storage_.persist_checkpoint("unit", "t6", 3, {"i": 3}, {})
    add_checkpoint(store, "t6", stale, 3, score=3.0)

    trial = _trial("t6", keep=2, until=8, score_attr="min-score")
    newest = adopt_recorded_checkpoints(trial, store, storage_)
    assert newest.iteration == 5 and [c.iteration for c in trial.checkpoint_manager.kept] == [1, 5]
    assert [c.iteration for c in trial.checkpoint_manager.retired] == [3]
    actor = _start(storage, store, trial, {}, restore_from=trial.restore_source())
    tracker = TrialProgressTracker(
        "t6", recorded={c.path for c in store.reader.live_checkpoints("t6")}
    )
    while (snapshot := _watch_once(actor, tracker, store)).status == "RUNNING":
        assert _live_paths_exist(store, "t6")
    _watch_once(actor, tracker, store)
    assert snapshot.status == "TERMINATED"
    assert [c.iteration for c in store.reader.live_checkpoints("t6")] == [
        8,
        1,
    ]  # the best scoring is still named
    assert _on_disk(storage, "t6") == ["checkpoint_000001", "checkpoint_000008"]
    assert [r["training_iteration"] for r in store.reader.get_results("t6")] == list(range(1, 9))
