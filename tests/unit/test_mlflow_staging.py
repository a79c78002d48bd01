"""The MLflow export stages a checkpoint's files for upload: only its regular files, in a temporary
directory that nothing escapes, following no symlink; on a real local directory and a real fsspec
(memory) object store."""

from __future__ import annotations

import os

import fsspec
import pytest

from airflow_trials.export.checkpoint_staging import checkpoint_bytes, local_checkpoint


def files_in(folder):
    return sorted(
        os.path.relpath(os.path.join(d, name), folder)
        for d, _, names in os.walk(folder)
        for name in names
    )


@pytest.fixture
def secret(tmp_path):
    (tmp_path / "secrets").mkdir()
    path = tmp_path / "secrets" / "airflow.cfg"
    path.write_text("jwt_secret = the-secret\n" * 50)
    return path


def test_a_local_checkpoints_symlinks_are_not_followed_sized_or_uploaded(tmp_path, secret):
    checkpoint = tmp_path / "storage" / "exp" / "t1" / "checkpoint_000001"
    (checkpoint / "sub").mkdir(parents=True)
    (checkpoint / "model.bin").write_bytes(b"x" * 10)
    (checkpoint / "sub" / "meta.json").write_bytes(b"{}")
    os.symlink(secret, checkpoint / "leak.cfg")  # what a trainable may leave in its checkpoint
    os.symlink(secret.parent, checkpoint / "sub" / "leaks")
    assert checkpoint_bytes(str(checkpoint)) == 12
    skipped: list[str] = []
    with local_checkpoint(str(checkpoint), skipped) as local:
        assert files_in(local) == ["model.bin", os.path.join("sub", "meta.json")]
        assert not os.path.samefile(local, checkpoint)  # a copy: the upload reads no link
    assert sorted(skipped) == [str(checkpoint / "leak.cfg"), str(checkpoint / "sub" / "leaks")]
    assert secret.exists()


def test_object_keys_that_climb_out_stay_out_of_the_staging_directory(tmp_path):
    fs = fsspec.filesystem("memory")
    fs.pipe("/ck2/t1/checkpoint_000003/model.bin", b"x" * 3)
    fs.pipe("/ck2/t1/checkpoint_000003/../../../../../../../../tmp/h-escaped", b"evil")
    fs.pipe("/ck2/t1/checkpoint_000003/a/../../../escaped-too", b"evil")
    url = "memory://ck2/t1/checkpoint_000003"
    skipped: list[str] = []
    with local_checkpoint(url, skipped) as local:
        assert files_in(local) == ["model.bin"]
        assert not os.path.exists(os.path.join(os.path.dirname(local), "escaped-too"))
    # Only the two names the keys climb out to: other processes write to /tmp meanwhile.
    assert not os.path.exists("/tmp/h-escaped") and not os.path.exists("/tmp/escaped-too")
    assert len(skipped) == 2 and all(".." in key for key in skipped)
