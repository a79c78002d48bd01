from __future__ import annotations

import os
import uuid

import pytest

from airflow_trials import CheckpointError
from airflow_trials.exceptions import TrialError
from airflow_trials.storage.trial_storage import TrialStorage


@pytest.fixture(params=["local", "memory"])
def store(request, storage):
    if request.param == "local":
        return TrialStorage(storage)
    return TrialStorage(f"memory://bucket-{uuid.uuid4().hex[:8]}")


def test_dict_checkpoint_round_trip(store):
    path = store.persist_checkpoint("exp", "t1", 3, {"w": [1, 2, 3]}, {"time_total_s": 1.5})
    payload, meta = store.load_checkpoint(path)
    assert payload == {"w": [1, 2, 3]}
    assert meta["iteration"] == 3 and meta["time_total_s"] == 1.5 and meta["kind"] == "dict"


def test_directory_checkpoint_round_trip_and_copy_and_delete(store, tmp_path):
    src = tmp_path / "mine"
    src.mkdir()
    (src / "weights.bin").write_bytes(b"\x00\x01")
    path = store.persist_checkpoint("exp", "t1", 1, str(src), {})
    assert src.exists()
    copied = store.copy_checkpoint(path, "exp", "t2", 1)
    local_dir, meta = store.load_checkpoint(copied)
    assert meta["kind"] == "dir"
    assert open(os.path.join(local_dir, "weights.bin"), "rb").read() == b"\x00\x01"
    store.delete(path)
    assert not store.exists(path)
    assert store.exists(copied)


def test_json_files(store):
    target = f"{store.experiment_dir('exp')}/state.json"
    store.write_json(target, {"a": 1})
    assert store.read_json(target) == {"a": 1}


def test_bad_payload_is_refused(store):
    with pytest.raises(
        CheckpointError, match="Trial t1: a checkpoint must be a dict or an existing directory"
    ):
        store.persist_checkpoint("exp", "t1", 1, "/does/not/exist", {})


def test_names_are_validated(store):
    with pytest.raises(ValueError, match="not a valid name"):
        store.trial_dir("exp", "../../etc")


def test_public_load_checkpoint_gives_what_the_trainable_saved(store, tmp_path):
    from airflow_trials import load_checkpoint

    assert load_checkpoint(store.persist_checkpoint("exp", "t1", 3, {"w": [1, 2]}, {})) == {
        "w": [1, 2]
    }
    src = tmp_path / "mine"
    src.mkdir()
    (src / "model.txt").write_text("weights")
    local_dir = load_checkpoint(store.persist_checkpoint("exp", "t1", 4, str(src), {}))
    assert open(os.path.join(local_dir, "model.txt")).read() == "weights"
    with pytest.raises(
        CheckpointError,
        match=r"no_such: no such directory\. Take the path from a trial's best_checkpoint",
    ):
        load_checkpoint(str(tmp_path / "no_such"))


def test_an_object_store_client_is_made_on_first_use_or_in_the_background():
    """A trial task only passes an s3:// storage on to its actor: it never imports s3fs (about
    1.4 s of CPU). The actor makes the client in a background thread while its trial trains."""
    import subprocess
    import sys

    script = (
        "import sys, threading\n"
        "from airflow_trials.storage.trial_storage import TrialStorage\n"
        "storage = TrialStorage('s3://bucket/prefix')\n"
        "assert 's3fs' not in sys.modules, 'imported when made'\n"
        "assert storage.root == 's3://bucket/prefix'\n"
        "storage.prepare_in_background()\n"
        "[t.join(60) for t in threading.enumerate() if t.name == 'storage-client']\n"
        "assert 's3fs' in sys.modules and storage._fs is not None, 'not made in the background'\n"
        "print('ok')\n"
    )
    env = {**os.environ, "AWS_ENDPOINT_URL": "http://127.0.0.1:9"}
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env
    )
    assert done.stdout.strip() == "ok", done.stderr


def _local_copies(tmp: str) -> list[str]:
    return sorted(
        name for name in os.listdir(tmp) if name.startswith(("airflow_trials_", ".scratch-"))
    )


def test_saving_and_reading_a_dict_checkpoint_in_object_storage_leaves_no_local_copy(
    monkeypatch, tmp_path
):
    """A dict saved to, or read from, object storage goes through a local directory: it is
    removed once the dict is uploaded or unpickled, or a worker's disk fills with one per
    checkpoint and restore."""
    import tempfile

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    store = TrialStorage(f"memory://bucket-{uuid.uuid4().hex[:8]}")
    path = store.persist_checkpoint("exp", "t1", 2, {"w": 7}, {})
    assert _local_copies(str(tmp)) == []
    payload, meta = store.load_checkpoint(path)
    assert payload == {"w": 7} and meta["kind"] == "dict"
    assert _local_copies(str(tmp)) == []


def test_a_directory_checkpoint_restored_from_object_storage_is_removed_once_read(
    monkeypatch, tmp_path
):
    """A trial actor restoring a directory checkpoint from object storage downloads it for the
    trainable to read; the download is removed when the trainable restores another checkpoint or
    stops, or a worker's disk keeps one copy per restore."""
    import tempfile

    from airflow_trials.execution.worker.actor import TrialActor

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    root = f"memory://bucket-{uuid.uuid4().hex[:8]}"
    storage = TrialStorage(root)  # the memory filesystem is the process's: the actor's, too
    paths = {}
    for iteration in (3, 5):
        written = tmp_path / f"written-{iteration}"
        written.mkdir()
        (written / "state.txt").write_text(str(iteration))
        paths[iteration] = storage.persist_checkpoint("exp", "t1", iteration, str(written), {})
    spec = {
        "trial_id": "t1",
        "experiment_name": "exp",
        "trainable": "tests.trainables:DirCheckpointTrainable",
        "config": {},
    }
    logs = tmp_path / "logs"
    actor = TrialActor(spec, root, str(logs), capture_output=False)

    assert actor.restore(paths[3]) == 3
    assert actor.execute(lambda trainable: trainable.iteration) == 3
    first = _local_copies(str(tmp))
    assert len(first) == 1 and first[0].startswith("airflow_trials_restore_")
    assert actor.restore(paths[5]) == 5
    assert actor.execute(lambda trainable: trainable.iteration) == 5
    second = _local_copies(str(tmp))
    assert len(second) == 1 and second != first
    actor.stop()
    assert _local_copies(str(tmp)) == []
    assert storage.has_checkpoint(paths[3]) and storage.has_checkpoint(paths[5])  # only copies

    # A checkpoint the trainable cannot load (no state.txt): the trial errs, and its download goes.
    unreadable = tmp_path / "unreadable"
    unreadable.mkdir()
    (unreadable / "other.txt").write_text("?")
    path = storage.persist_checkpoint("exp", "t1", 7, str(unreadable), {})
    actor = TrialActor(spec, root, str(logs), capture_output=False)
    with pytest.raises(TrialError, match="load_checkpoint|state.txt"):
        actor.restore(path)
    assert _local_copies(str(tmp)) == []
    actor.stop()


def test_a_checkpoint_outside_the_storage_root_is_never_deleted(storage, tmp_path, caplog):
    """The workers' keep-N deletes (delete_released) go through TrialStorage.delete, which deletes
    only below its root: a record that names another place leaves that place alone."""
    local = TrialStorage(storage)
    kept = local.persist_checkpoint("exp", "t1", 1, {"w": 1}, {})
    precious = tmp_path / "precious"
    (precious / "sub").mkdir(parents=True)
    (precious / "sub" / "data").write_text("keep me")
    link = os.path.join(local.trial_dir("exp", "t1"), "checkpoint_000002")
    os.symlink(precious, link)  # inside the root, pointing out of it
    escaping = [str(precious), f"{local.root}/../precious", os.path.join(link, "sub")]
    for path in escaping:
        with pytest.raises(CheckpointError, match=r"is not inside the storage root"):
            local.delete(path)
    assert local.delete_released("t1", [*escaping, kept]) == [kept]
    assert (precious / "sub" / "data").read_text() == "keep me" and not local.exists(kept)
    assert "it stays on the storage" in caplog.text
    bucket = f"memory://bucket-{uuid.uuid4().hex[:8]}"
    remote = TrialStorage(f"{bucket}/trials")
    remote.fs.pipe_file(f"{bucket}/other/x", b"theirs")
    for path in (f"{bucket}/other", f"{bucket}/trials/../other", f"{bucket}/trials"):
        with pytest.raises(CheckpointError, match=r"is not inside the storage root"):
            remote.delete(path)
    assert remote.fs.cat_file(f"{bucket}/other/x") == b"theirs"
