"""Where a trial's stdout.log and stderr.log are, as the dashboard's process sees them, and their
tails.

The trials DB records no log paths: a finished trial's logs are copied to ``logs/`` in its
directory on the experiment's storage, next to its checkpoints, so the directory is derived from
a recorded checkpoint path, else from the storage root of the dashboard's environment
(``AIRFLOW_TRIALS_STORAGE``, else ``[airflow_trials] storage_path``, else
``~/airflow_trials_results``). While the trial runs, its node
writes the files into that trial directory itself when the storage is a local path (the default
``local_log_path``), which the dashboard reads when it runs on the same machine or shares the path.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from airflow_trials.execution.storage import default_storage_path
from airflow_trials.execution.trial_output import STREAMS, OutputChunk, read_tail
from airflow_trials.provider_config import setting
from airflow_trials.store import CheckpointRecordRow, ExperimentRunRecord, TrialRecord

TAIL_LINES = 200
TAIL_BYTES = 64 * 1024


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
    root."""
    dirs = [
        c.path.rstrip("/").rsplit("/", 1)[0]
        if _is_url(c.path)
        else os.path.dirname(c.path.rstrip("/"))
        for c in checkpoints
    ]
    if run is not None:
        root = setting("storage_path") or default_storage_path()
        dirs.append(
            f"{root.rstrip('/')}/{run.experiment_name}/{trial.trial_id}"
            if _is_url(root)
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
    live = [d for d in dirs if not _is_url(d)]
    # A running trial's own files are newer than a copy an earlier try left.
    candidates = saved + live if trial.status.is_terminal() else live + saved
    found = []
    for stream in STREAMS:
        name = f"{stream}.log"
        path = next(
            (
                _join(d, name)
                for d in candidates
                if not _is_url(d) and os.path.isfile(_join(d, name))
            ),
            None,
        )
        if path is None:
            found.append(TrialLog(stream, _join(saved[0], name) if saved else name))
        else:
            found.append(
                TrialLog(
                    stream, path, read_tail(path, TAIL_LINES, TAIL_BYTES), os.path.getsize(path)
                )
            )
    return found


def readable_log(logs: Sequence[TrialLog], stream: str) -> str | None:
    """The local path of ``stream``'s file, when this process can read it."""
    return next((log.location for log in logs if log.stream == stream and log.readable), None)


def _join(directory: str, name: str) -> str:
    return f"{directory}/{name}" if _is_url(directory) else os.path.join(directory, name)


def _is_url(path: str) -> bool:
    return "://" in path and not path.startswith("file://")
