"""A checkpoint staged for an upload (the MLflow export): its regular files, copied into a
temporary directory that no name escapes, following no symlink.

A trainable writes its checkpoint's files itself, so a checkpoint may hold a symlink to a file
outside it (``airflow.cfg``), and an object store may hold keys with ``..`` in them. Neither is
sized or copied: a local file is opened with ``O_NOFOLLOW`` and copied from that descriptor only
when it is a regular file, a symlinked folder is not entered, and an object key whose copy would
land outside the temporary directory is left out. What is left out is named to the caller.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import shutil
import stat
import tempfile
from collections.abc import Iterator

from airflow_trials.exceptions import OutsideStorageRootError
from airflow_trials.storage.storage_root import is_inside, is_url, open_no_follow


def checkpoint_bytes(path: str) -> int:
    """The checkpoint's size: a local directory's regular files (symlinks not followed), or an
    fsspec URL's (``s3://...``); FileNotFoundError when it is not there."""
    if not is_url(path):
        local = path.removeprefix("file://")
        if os.path.isfile(local) and not os.path.islink(local):
            return os.lstat(local).st_size
        if not os.path.isdir(local) or os.path.islink(local):
            raise FileNotFoundError(path)
        return sum(
            info.st_size
            for folder, _, names in os.walk(local)
            for name in names
            if stat.S_ISREG((info := os.lstat(os.path.join(folder, name))).st_mode)
        )
    from fsspec.core import url_to_fs

    fs, root = url_to_fs(path)
    if not fs.exists(root):
        raise FileNotFoundError(path)
    return int(fs.du(root, total=True))


@contextlib.contextmanager
def local_checkpoint(path: str, skipped: list[str] | None = None) -> Iterator[str]:
    """The checkpoint's regular files copied into a temporary directory, for as long as the block
    runs: the directory, or the one file a single-file checkpoint is. What is left out (a symlink,
    not a regular file, an object key that would land outside the directory) is appended to
    ``skipped``."""
    left_out = skipped if skipped is not None else []
    with tempfile.TemporaryDirectory(prefix="airflow_trials_mlflow_") as scratch:
        if is_url(path):
            yield _fetch(path, scratch, left_out)
        else:
            yield _copy_local(path.removeprefix("file://"), scratch, left_out)


def _copy_local(source: str, scratch: str, skipped: list[str]) -> str:
    if not os.path.isdir(source) or os.path.islink(source):
        target = os.path.join(scratch, os.path.basename(source.rstrip("/")) or "checkpoint")
        return target if _copy_file(source, target, skipped) else scratch
    for folder, dirs, names in os.walk(source):  # a symlinked folder is listed, never entered
        inside = os.path.join(scratch, os.path.relpath(folder, source))
        os.makedirs(inside, exist_ok=True)
        links = [os.path.join(folder, d) for d in dirs if os.path.islink(os.path.join(folder, d))]
        skipped.extend(links)
        for name in names:
            _copy_file(os.path.join(folder, name), os.path.join(inside, name), skipped)
    return scratch


def _copy_file(source: str, target: str, skipped: list[str]) -> bool:
    try:
        opened = open_no_follow(source)
    except OutsideStorageRootError:  # a symlink, a FIFO, a device: never read
        skipped.append(source)
        return False
    with opened, open(target, "wb") as copy:
        shutil.copyfileobj(opened, copy)
    return True


def _fetch(url: str, scratch: str, skipped: list[str]) -> str:
    from fsspec.core import url_to_fs

    fs, root = url_to_fs(url)
    single = fs.isfile(root)
    entries = [(root, posixpath.basename(root))] if single else []
    if not single:
        for remote, info in fs.find(root, detail=True).items():
            if info.get("islink") or info.get("type") != "file":
                skipped.append(remote)
            else:
                entries.append((remote, posixpath.relpath(remote, root)))
    for remote, relative in entries:
        target = os.path.join(scratch, relative)
        if not is_inside(target, scratch):  # a key with ``..`` that climbs out
            skipped.append(remote)
            continue
        os.makedirs(os.path.dirname(target), exist_ok=True)
        fs.get_file(remote, target)
        if single:
            return target
    return scratch
