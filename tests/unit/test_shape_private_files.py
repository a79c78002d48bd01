"""The local shape's ``shape.json`` (it holds the JWT secret) and ``passwords.json`` (the UI's admin
password) are readable by their owner only: created 0600, and an older, looser file is replaced by
a 0600 one on the next write."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from airflow_trials.shape.local import STATE_FILE, LocalShape

PRIVATE_FILES = (STATE_FILE, "passwords.json")


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _write_both(shape: LocalShape) -> None:
    shape._write_state()
    shape._write_passwords()


@pytest.fixture
def loose_umask():
    """A umask that lets every file be world-readable, as on many desktops."""
    old = os.umask(0o022)
    yield
    os.umask(old)


def test_the_shape_writes_its_secrets_readable_by_the_owner_only(tmp_path, loose_umask):
    shape = LocalShape(tmp_path / "shape", dags_folder=tmp_path)
    _write_both(shape)
    for name in PRIVATE_FILES:
        assert _mode(shape.home / name) == 0o600, name
    state = json.loads((shape.home / STATE_FILE).read_text())
    assert state["addresses"]["jwt_secret"] == shape.addresses.jwt_secret
    assert json.loads((shape.home / "passwords.json").read_text()) == {"admin": "shape-admin"}
    # Written through a temporary file in the same folder, which is gone afterwards.
    assert sorted(os.listdir(shape.home)) == sorted(PRIVATE_FILES)


def test_a_world_readable_file_from_an_older_shape_is_replaced_by_a_private_one(
    tmp_path, loose_umask
):
    home = tmp_path / "shape"
    _write_both(LocalShape(home, dags_folder=tmp_path))
    for name in PRIVATE_FILES:
        os.chmod(home / name, 0o644)
    # Someone who opened the old file keeps reading the old file, never the new secrets' file.
    held = {name: open(home / name) for name in PRIVATE_FILES}  # noqa: SIM115 - closed below
    try:
        again = LocalShape(home, dags_folder=tmp_path)
        _write_both(again)
        for name, old in held.items():
            assert _mode(home / name) == 0o600, name
            assert os.fstat(old.fileno()).st_ino != (home / name).stat().st_ino, name
        assert again.addresses == LocalShape(home, dags_folder=tmp_path).addresses
    finally:
        for old in held.values():
            old.close()
