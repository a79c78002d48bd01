"""The storage is the record of a trial's progress; the trials DB catches up (issue 50).

A self-driving trial actor (in-process, as Ray hosts it) trains on while nobody records it, as
it does while Airflow is stopped. Each checkpoint's metadata carries the results since the
previous checkpoint, so a resume (``adopt_checkpoints``, what a task's next try and a sweep's
next driver call) records what the storage holds past the trials DB, once, without a gap or a
duplicate, and restores from the newest checkpoint instead of the last one recorded.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from airflow_trials.core.trial import Trial
from airflow_trials.execution.polls import TrialProgressTracker
from airflow_trials.execution.resume import adopt_checkpoints
from airflow_trials.execution.worker.actor import TrialActor
from airflow_trials.storage.trial_storage import RESULTS_KEY, TrialStorage
from tests.contract.conftest import POSTGRESQL, SQLITE_FILE
from tests.unit.test_checkpoint_release import _on_disk, _start, _trial, _until, _watch_once

META = ".airflow_trials_checkpoint.json"


def _iterations(store, trial_id: str) -> list[int]:
    return [r["training_iteration"] for r in store.reader.get_results(trial_id)]


def _trained_unwatched_after(storage, store, trial_id: str, recorded_to: int, until: int):
    """The trial's first ``recorded_to`` results and checkpoints are recorded as its trigger
    records them; then it trains to ``until`` with nobody recording, and ends."""
    gate = Path(storage) / f"gate-{trial_id}"
    config = {"hold_at": recorded_to + 1, "gate": str(gate)}
    actor = _start(storage, store, _trial(trial_id, keep=2, until=until), config)
    tracker = TrialProgressTracker(trial_id)
    _until(
        actor,
        lambda s: s.kept_checkpoints and s.kept_checkpoints[-1].iteration == recorded_to,
    )  # it holds before iteration recorded_to + 1
    _watch_once(actor, tracker, store)
    assert _iterations(store, trial_id) == list(range(1, recorded_to + 1))
    gate.touch()
    _until(actor, lambda s: s.status != "RUNNING")  # ended; only its storage knows how far
    assert _iterations(store, trial_id)[-1] == recorded_to
    return actor


class SavedProgressContract:
    def test_a_resume_records_what_the_storage_holds_and_restores_the_newest_checkpoint(
        self, storage, store
    ):
        _trained_unwatched_after(storage, store, "s1", recorded_to=3, until=9)
        recorded = _iterations(store, "s1")
        # keep=2, but nothing was released while nobody recorded: every checkpoint is still there.
        assert _on_disk(storage, "s1")[-1] == "checkpoint_000009"

        trial = _trial("s1", keep=2, until=12, score_attr="score")
        newest = adopt_checkpoints(trial, store, TrialStorage(storage))

        assert (
            newest is not None and newest.iteration == 9 and trial.restore_source() == newest.path
        )
        assert _iterations(store, "s1") == list(range(1, 10)), recorded  # no gap, no duplicate
        assert [c.iteration for c in trial.checkpoint_manager.kept] == [8, 9]
        # Each backfilled checkpoint is ranked by its own result's score, as its actor ranked it.
        backfilled = [c for c in store.reader.live_checkpoints("s1") if c.iteration > 3]
        assert {c.iteration: c.score for c in backfilled} == {i: float(i) for i in range(4, 10)}
        assert store.reader.get_trial("s1").last_result["training_iteration"] == 9
        # Each backfilled result is the one the actor made, its reported checkpoint named.
        ninth = store.reader.get_results("s1")[-1]
        assert ninth["score"] == 9.0 and ninth["checkpoint"] == newest.path
        # A second resume finds nothing new: nothing is written twice.
        adopt_checkpoints(_trial("s1", keep=2, until=12), store, TrialStorage(storage))
        assert _iterations(store, "s1") == list(range(1, 10))

    def test_the_resumed_trial_goes_on_from_there_and_its_keep_rule_deletes_the_extra_ones(
        self, storage, store
    ):
        _trained_unwatched_after(storage, store, "s2", recorded_to=2, until=7)
        trial = _trial("s2", keep=2, until=10)
        newest = adopt_checkpoints(trial, store, TrialStorage(storage))
        assert newest is not None and newest.iteration == 7

        actor = _start(storage, store, trial, {}, restore_from=trial.restore_source())
        tracker = TrialProgressTracker(
            "s2", recorded={c.path for c in store.reader.live_checkpoints("s2")}
        )
        while _watch_once(actor, tracker, store).status == "RUNNING":
            pass
        _watch_once(actor, tracker, store)  # acknowledges the end's write, as the trigger does

        assert _iterations(store, "s2") == list(range(1, 11))
        assert [c.iteration for c in store.reader.live_checkpoints("s2")] == [10, 9]
        assert _on_disk(storage, "s2") == ["checkpoint_000009", "checkpoint_000010"]

    @pytest.mark.parametrize(
        ("watched_at", "left", "kept_from"),
        [((4,), (1, 2), 3), ((4, 6), (3, 4), 5)],
        ids=["drops-never-recorded", "drops-recorded"],
    )
    def test_a_resume_deletes_the_checkpoints_its_lost_actor_dropped_and_left(
        self, storage, store, watched_at, left, kept_from
    ):
        """keep=2. The trigger recorded the trial at iteration 4 (checkpoints 3 and 4 kept; 1 and
        2 dropped before any record), and on the second case at 6 too (5 and 6 kept, 3 and 4
        recorded dropped, 1 and 2 deleted, since that poll told the actor the first write was
        done). Then the actor trained on to 8 unwatched and was lost before a poll told it its
        last drops were recorded (it deletes a dropped checkpoint only then): nothing else would
        ever delete those. The resume does; the recorded ones and the newer ones stay, for the
        resumed trial's keep rule."""
        gates = Path(storage) / "gate-s6", Path(storage) / "gate-again-s6"
        config = {"hold_at": 5, "gate": str(gates[0]), "hold_again_at": 7}
        config["gate_again"] = str(gates[1])
        actor = _start(storage, store, _trial("s6", keep=2, until=8), config)
        tracker = TrialProgressTracker("s6")
        for recorded_to, gate in zip((4, 6), gates, strict=True):
            if recorded_to in watched_at:
                _until(actor, lambda s, n=recorded_to: s.kept_checkpoints[-1:][0].iteration == n)
                _watch_once(actor, tracker, store)
            gate.touch()
        _until(actor, lambda s: s.status != "RUNNING")  # trained on to 8 unwatched: lost
        on_disk = _on_disk(storage, "s6")
        assert {f"checkpoint_{i:06d}" for i in (*left, 5, 6, 7, 8)} <= set(on_disk), on_disk

        trial = _trial("s6", keep=2, until=10)
        newest = adopt_checkpoints(trial, store, TrialStorage(storage))

        assert newest is not None and newest.iteration == 8
        kept = [f"checkpoint_{i:06d}" for i in range(kept_from, 9)]
        assert _on_disk(storage, "s6") == kept
        live = store.reader.live_checkpoints("s6")
        assert [c.iteration for c in live] == list(range(8, kept_from - 1, -1))
        # A second resume finds nothing more to delete.
        adopt_checkpoints(_trial("s6", keep=2, until=10), store, TrialStorage(storage))
        assert _on_disk(storage, "s6") == kept

    def test_no_checkpoint_past_a_gap_in_the_saved_results_is_resumed_from(self, storage, store):
        """A checkpoint whose metadata lacks results the DB does not hold (its actor kept no more
        than UNSAVED_RESULTS_MAX) ends the chain: it and every later one stay unrecorded."""
        _trained_unwatched_after(storage, store, "s3", recorded_to=3, until=8)
        recorded = 3
        broken = Path(storage) / "unit" / "s3" / f"checkpoint_{recorded + 3:06d}" / META
        meta = json.loads(broken.read_text())
        meta[RESULTS_KEY] = []
        broken.write_text(json.dumps(meta))

        trial = _trial("s3", keep=2, until=12)
        newest = adopt_checkpoints(trial, store, TrialStorage(storage))

        assert newest is not None and newest.iteration == recorded + 2
        assert _iterations(store, "s3") == list(range(1, recorded + 3))

    def test_a_checkpoint_cut_short_is_not_resumed_from(self, storage, store):
        """Its metadata, written last, is missing: the one before it is the newest complete."""
        _trained_unwatched_after(storage, store, "s4", recorded_to=2, until=6)
        (Path(storage) / "unit" / "s4" / "checkpoint_000006" / META).unlink()

        trial = _trial("s4", keep=2, until=9)
        newest = adopt_checkpoints(trial, store, TrialStorage(storage))

        assert newest is not None and newest.iteration == 5
        assert _iterations(store, "s4") == [1, 2, 3, 4, 5]

    def test_a_class_trainable_saved_by_checkpoint_freq_and_never_recorded_resumes_too(
        self, storage, store
    ):
        """The save path (checkpoint_freq=3 of a class trainable), and a trial the DB recorded
        nothing of but its registration: results 1..9 from checkpoints 3, 6 and 9."""
        trainable = "tests.trainables:FakeTrainable"

        def trial(until: int) -> Trial:
            return Trial(
                trainable,
                {},
                trial_id="s5",
                experiment_name="unit",
                checkpoint_freq=3,
                stopping_criterion={"training_iteration": until},
            )

        store.upsert_trial(
            "s5", trainable=trainable, config={}, resources={"cpu": 1}, max_failures=0
        )
        spec = {"trial_id": "s5", "experiment_name": "unit", "trainable": trainable, "config": {}}
        actor = TrialActor(spec, storage, storage, capture_output=False)
        actor.run(trial(10).to_json_state(), None)
        _until(actor, lambda s: s.status != "RUNNING")
        assert _iterations(store, "s5") == []

        resumed = trial(12)
        newest = adopt_checkpoints(resumed, store, TrialStorage(storage))

        assert newest is not None and newest.iteration == 9
        assert _iterations(store, "s5") == list(range(1, 10))
        rewards = [r["episode_reward_mean"] for r in store.reader.get_results("s5")]
        assert rewards == [float(i) for i in range(1, 10)]


class TestSQLiteFile(SavedProgressContract):
    backend = SQLITE_FILE


@pytest.mark.postgres
class TestPostgreSQL(SavedProgressContract):
    backend = POSTGRESQL
