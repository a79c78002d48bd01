"""Is a path inside the storage root: the one check made before a path that a record or a
trainable named is read, served, deleted or staged.

The dashboard's log view, ``airflow-trials db delete-run``, the workers' checkpoint deletes
(:meth:`TrialStorage.delete`) and the MLflow export's staging all ask it. A local path is resolved
with ``realpath`` (symlinks and ``..`` followed) and must lie strictly below the realpath of the
root (``os.path.commonpath``); a file is then opened with ``O_NOFOLLOW`` and read from that
descriptor only if ``fstat`` says it is a regular file, so a symlink swapped in after the check is
not followed. A URL (an fsspec path such as ``s3://bucket/trials``) must share the root's scheme,
and its path, with ``..`` taken away, must lie below the root's.

Plain file I/O: imports neither Ray nor Airflow, so the api-server and the CLI may use it.
"""

from __future__ import annotations

import errno
import os
import posixpath
import stat
from typing import BinaryIO

from airflow_trials.exceptions import OutsideStorageRootError


def is_url(path: str) -> bool:
    """An fsspec URL (``s3://...``); a ``file://`` URL is a local path."""
    return "://" in path and not path.startswith("file://")


def resolve_inside(path: str, root: str) -> str:
    """``path`` resolved (a local path's realpath, a URL's normalised form), when it lies strictly
    below ``root`` (resolved the same way).

    :raises OutsideStorageRootError: it does not, or one is a URL and the other is not.
    """
    if is_url(path) or is_url(root):
        resolved, base = _normalised_url(path), _normalised_url(root)
        inside = is_url(path) and is_url(root) and resolved.startswith(base.rstrip("/") + "/")
    else:
        resolved, base = _real(path), _real(root)
        inside = resolved != base and os.path.commonpath([resolved, base]) == base
    if not inside:
        raise OutsideStorageRootError(
            f"{path} (resolved: {resolved}) is not inside the storage root {root}: airflow_trials "
            "reads, serves and deletes only what lies under its storage root. Set "
            "[airflow_trials] storage_path (or AIRFLOW_TRIALS_STORAGE) to the root the trials "
            "wrote to, or remove the path by hand if it is really to go."
        )
    return resolved


def is_inside(path: str, root: str) -> bool:
    """Whether ``path`` lies strictly below ``root`` (see :func:`resolve_inside`)."""
    try:
        resolve_inside(path, root)
    except OutsideStorageRootError:
        return False
    return True


def open_regular_file(path: str, root: str) -> BinaryIO:
    """``path`` opened for reading, when it is a regular file below ``root``: checked with
    :func:`resolve_inside`, opened with ``O_NOFOLLOW`` and ``fstat``-ed, so the caller reads the
    file that passed the check. The caller closes it.

    :raises OutsideStorageRootError: outside the root, a symlink, or not a regular file.
    :raises FileNotFoundError: no such file.
    """
    resolved = resolve_inside(path, root)
    if resolved != _without_links(path, root):
        # A link anywhere below the root (to another trial's log, a checkpoint, trial.json) is
        # refused as well: the file served must be the one the caller named.
        raise OutsideStorageRootError(
            f"{path} goes through a symlink below the storage root {root}, which is never "
            "followed: only regular files are read."
        )
    opened = open_no_follow(resolved, shown_as=path)
    if os.fstat(opened.fileno()).st_nlink > 1:  # a hard link reaches another file the same way
        opened.close()
        raise OutsideStorageRootError(f"{path} is a hard link: only unlinked files are read.")
    return opened


def open_no_follow(path: str, *, shown_as: str | None = None) -> BinaryIO:
    """``path`` opened for reading when it is a regular file and not a symlink; read from the
    returned file only (its descriptor is what was checked).

    :raises OutsideStorageRootError: a symlink, or not a regular file.
    :raises OSError: it cannot be opened (FileNotFoundError: no such file).
    """
    try:
        # O_NONBLOCK: a FIFO opens at once (and is refused below) instead of waiting for a writer.
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as e:
        if e.errno != errno.ELOOP:
            raise
        raise OutsideStorageRootError(
            f"{shown_as or path} is a symlink, which is never followed: only regular files are "
            "read."
        ) from e
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OutsideStorageRootError(
            f"{shown_as or path} is not a regular file: only regular files are read."
        )
    return os.fdopen(fd, "rb")


def _without_links(path: str, root: str) -> str | None:
    """``path`` below the root's realpath as if no symlink below the root were followed; None
    when its plain (absolute, normalised) form is below neither form of the root."""
    plain = os.path.normpath(os.path.abspath(_local(path)))
    for base in (os.path.normpath(os.path.abspath(_local(root))), _real(root)):
        if os.path.commonpath([plain, base]) == base:
            return os.path.join(_real(root), os.path.relpath(plain, base))
    return None


def _local(path: str) -> str:
    return os.path.expanduser(path.removeprefix("file://"))


def _real(path: str) -> str:
    return os.path.realpath(_local(path))


def _normalised_url(url: str) -> str:
    scheme, sep, rest = url.partition("://")
    # ``..`` is taken away, as a filesystem would: a key that climbs out lands outside.
    return f"{scheme}{sep}{posixpath.normpath('/' + rest).lstrip('/')}"
