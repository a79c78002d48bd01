"""Where a trial's stdout.log and stderr.log are, as the dashboard's process sees them, and their
tails.

The trials DB records no log paths: a finished trial's logs are copied to ``logs/`` in its
directory on the experiment's storage, next to its checkpoints, so the directory is derived from
a recorded checkpoint path, else from the storage root of the dashboard's environment
(``AIRFLOW_TRIALS_STORAGE``, else ``[airflow_trials] storage_path``, else
``~/airflow_trials_results``). While the trial runs, its node
writes the files into that trial directory itself when the storage is a local path (the default
``local_log_path``), which the dashboard reads when it runs on the same machine or shares the path.

Only regular files under that storage root are read and served
(:func:`~airflow_trials.storage.storage_root.open_regular_file`): a trainable that replaces its
``stdout.log`` with a symlink, or a checkpoint path recorded outside the root, shows nothing.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import BinaryIO
from urllib.parse import quote

from starlette.background import BackgroundTask
from starlette.responses import StreamingResponse

from airflow_trials.storage.storage_root import is_inside, is_url, open_regular_file
from airflow_trials.storage.trial_output import STREAMS, OutputChunk, read_tail
from airflow_trials.storage.trial_storage import configured_storage_root
from airflow_trials.store import CheckpointRecordRow, ExperimentRunRecord, TrialRecord

log = logging.getLogger(__name__)

TAIL_LINES = 200
TAIL_BYTES = 64 * 1024
_CHUNK_BYTES = 64 * 1024


@dataclass(frozen=True)
class TrialLog:
    """One of a trial's log files as the trial page shows it.

    :param stream: ``stdout`` or ``stderr``.
    :param location: where the file is, or where it goes when the trial ends (path or URL).
    :param tail: its last lines when this process can read it; None otherwise.
    :param size_bytes: its size when readable.
    """

    stream: str
    location: str
    tail: OutputChunk | None = None
    size_bytes: int | None = None

    @property
    def readable(self) -> bool:
        return self.tail is not None


def trial_dirs(
    trial: TrialRecord, run: ExperimentRunRecord | None, checkpoints: Sequence[CheckpointRecordRow]
) -> list[str]:
    """The trial's directory on the storage: from its checkpoint paths, then from the storage
    root. A local checkpoint path outside the storage root names none."""
    root = configured_storage_root()
    dirs = [
        c.path.rstrip("/").rsplit("/", 1)[0]
        if is_url(c.path)
        else os.path.dirname(c.path.rstrip("/"))
        for c in checkpoints
    ]
    dirs = [d for d in dirs if is_url(d) or is_inside(d, root)]
    if run is not None:
        dirs.append(
            f"{root.rstrip('/')}/{run.experiment_name}/{trial.trial_id}"
            if is_url(root)
            else os.path.join(os.path.expanduser(root), run.experiment_name, trial.trial_id)
        )
    return list(dict.fromkeys(dirs))


def trial_logs(
    trial: TrialRecord, run: ExperimentRunRecord | None, checkpoints: Sequence[CheckpointRecordRow]
) -> list[TrialLog]:
    """Each stream's file that this process can read (the saved copy, or, while the trial runs,
    the one its node writes), else where the saved copy is or will be."""
    dirs = trial_dirs(trial, run, checkpoints)
    saved = [_join(d, "logs") for d in dirs]
    live = [d for d in dirs if not is_url(d)]
    # A running trial's own files are newer than a copy an earlier try left.
    candidates = saved + live if trial.status.is_terminal() else live + saved
    found = []
    for stream in STREAMS:
        name = f"{stream}.log"
        read = next(
            (
                tail
                for d in candidates
                if not is_url(d)
                and (tail := _read_tail(trial.trial_id, stream, _join(d, name))) is not None
            ),
            None,
        )
        found.append(read or TrialLog(stream, _join(saved[0], name) if saved else name))
    return found


def _read_tail(trial_id: str, stream: str, path: str) -> TrialLog | None:
    """``path``'s tail, when it is a regular file under the storage root this process reads."""
    opened = _open(trial_id, path)
    if opened is None:
        return None
    with opened as f:
        tail = read_tail(path, TAIL_LINES, TAIL_BYTES, file=f)
        return TrialLog(stream, path, tail, os.fstat(f.fileno()).st_size)


def open_log(trial_id: str, logs: Sequence[TrialLog], stream: str) -> BinaryIO | None:
    """``stream``'s file opened for reading, when this process can read it (a regular file under
    the storage root, not a symlink); the caller serves it from this file and closes it."""
    path = next((log.location for log in logs if log.stream == stream and log.readable), None)
    return None if path is None else _open(trial_id, path)


def _open(trial_id: str, path: str) -> BinaryIO | None:
    try:
        return open_regular_file(path, configured_storage_root())
    except FileNotFoundError:
        return None
    except OSError as e:  # outside the root, a symlink, not a file, or unreadable
        log.warning("Trial %s: its log %s is not read: %s", trial_id, path, e)
        return None


def _join(directory: str, name: str) -> str:
    return f"{directory}/{name}" if is_url(directory) else os.path.join(directory, name)


def log_download(opened: BinaryIO, filename: str) -> StreamingResponse:
    """A download of the opened log file, as long as it was when opened (a running trial's file
    grows), read from that file only; it is closed when the response ends."""
    size = os.fstat(opened.fileno()).st_size
    return StreamingResponse(
        _chunks(opened, size),
        media_type="text/plain; charset=utf-8",
        headers={
            "Content-Disposition": f'attachment; filename="{quote(filename)}"',
            "Content-Length": str(size),
        },
        background=BackgroundTask(opened.close),
    )


def _chunks(opened: BinaryIO, size: int) -> Iterator[bytes]:
    left = size
    while left > 0:
        chunk = opened.read(min(left, _CHUNK_BYTES))
        if not chunk:
            return
        left -= len(chunk)
        yield chunk
