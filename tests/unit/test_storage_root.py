"""The one check made before a path a record or a trainable named is read, served, deleted or
staged: inside the storage root (realpath, common path), a regular file, no symlink followed."""

from __future__ import annotations

import os

import pytest

from airflow_trials.exceptions import OutsideStorageRootError
from airflow_trials.storage.storage_root import is_inside, open_regular_file, resolve_inside


@pytest.fixture
def root(tmp_path):
    (tmp_path / "root" / "exp" / "t1").mkdir(parents=True)
    (tmp_path / "root" / "exp" / "t1" / "stdout.log").write_text("mine\n")
    (tmp_path / "secret").write_text("not yours\n")
    return tmp_path / "root"


def test_a_path_is_inside_only_when_its_realpath_lies_below_the_roots(root, tmp_path):
    assert is_inside(str(root / "exp" / "t1"), str(root))
    assert not is_inside(str(root), str(root))  # the root itself is never a target
    assert not is_inside(str(root / ".." / "secret"), str(root))
    assert not is_inside(str(tmp_path / "root-sibling" / "x"), str(root))
    os.symlink(tmp_path, root / "exp" / "escape")
    assert not is_inside(str(root / "exp" / "escape" / "secret"), str(root))
    with pytest.raises(OutsideStorageRootError, match=r"is not inside the storage root"):
        resolve_inside(str(root / "exp" / "escape"), str(root))


def test_a_url_is_inside_only_below_the_roots_scheme_and_key_with_no_climbing_out():
    assert is_inside("s3://b/trials/exp/t1/checkpoint_000001", "s3://b/trials")
    assert not is_inside("s3://b/trials/../other/x", "s3://b/trials")
    assert not is_inside("s3://b/trialsx/exp", "s3://b/trials")
    assert not is_inside("gs://b/trials/exp", "s3://b/trials")
    assert not is_inside("/local/exp", "s3://b/trials")
    assert not is_inside("s3://b/trials/exp", "/local")


def test_only_a_regular_file_below_the_root_is_opened(root, tmp_path):
    with open_regular_file(str(root / "exp" / "t1" / "stdout.log"), str(root)) as f:
        assert f.read() == b"mine\n"
    os.symlink(tmp_path / "secret", root / "exp" / "t1" / "stderr.log")
    with pytest.raises(OutsideStorageRootError):
        open_regular_file(str(root / "exp" / "t1" / "stderr.log"), str(root))
    os.mkfifo(root / "exp" / "t1" / "fifo.log")  # opened without waiting for a writer
    with pytest.raises(OutsideStorageRootError, match=r"not a regular file"):
        open_regular_file(str(root / "exp" / "t1" / "fifo.log"), str(root))
    with pytest.raises(OutsideStorageRootError, match=r"not a regular file"):
        open_regular_file(str(root / "exp" / "t1"), str(root))
    with pytest.raises(FileNotFoundError):
        open_regular_file(str(root / "exp" / "t1" / "gone.log"), str(root))


def test_a_link_below_the_root_to_another_file_below_it_is_not_opened(root):
    """A trainable that links its log to another trial's (or a checkpoint, trial.json) would have
    the dashboard serve that file under this trial's DAG's permissions."""
    other = root / "exp" / "t2"
    other.mkdir()
    (other / "stdout.log").write_text("another DAG's log\n")
    mine = root / "exp" / "t1"
    os.symlink(other / "stdout.log", mine / "stderr.log")
    with pytest.raises(OutsideStorageRootError, match=r"goes through a symlink"):
        open_regular_file(str(mine / "stderr.log"), str(root))
    os.symlink(other, root / "exp" / "t3")  # a linked folder on the way
    with pytest.raises(OutsideStorageRootError, match=r"goes through a symlink"):
        open_regular_file(str(root / "exp" / "t3" / "stdout.log"), str(root))
    os.link(other / "stdout.log", mine / "hard.log")
    with pytest.raises(OutsideStorageRootError, match=r"hard link"):
        open_regular_file(str(mine / "hard.log"), str(root))
    with open_regular_file(str(mine / "stdout.log"), str(root)) as f:  # the plain file still is
        assert f.read() == b"mine\n"
