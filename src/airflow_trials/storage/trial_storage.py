"""Where trials keep checkpoints, metadata and logs: a local directory or any fsspec URL."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pickle
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from airflow_trials.core.trial import validate_name
from airflow_trials.exceptions import (
    CheckpointError,
    CheckpointNotFoundError,
    CheckpointStorageError,
    OutsideStorageRootError,
)
from airflow_trials.storage.storage_root import is_url, resolve_inside

if TYPE_CHECKING:
    from fsspec import AbstractFileSystem

log = logging.getLogger(__name__)

DEFAULT_STORAGE_ENV = "AIRFLOW_TRIALS_STORAGE"
_META_FILE = ".airflow_trials_checkpoint.json"
# In a trial's folder while its actor is paused by a graceful stop's drain.
_DRAINED_FILE = ".airflow_trials_drained.json"
_DICT_FILE = "checkpoint.pkl"
_LOGS_DIR = "logs"
#: The key of a checkpoint's metadata that holds the results since the trial's previous checkpoint.
RESULTS_KEY = "results"
_CHECKPOINT_PREFIX = "checkpoint_"


def default_storage_path() -> str:
    return os.environ.get(DEFAULT_STORAGE_ENV) or os.path.join(
        os.path.expanduser("~"), "airflow_trials_results"
    )


def configured_storage_root() -> str:
    """The storage root this process is configured with (``[airflow_trials] storage_path``, else
    ``$AIRFLOW_TRIALS_STORAGE``, else ``~/airflow_trials_results``): where the dashboard reads
    logs from and ``db delete-run`` deletes, unless told another."""
    from airflow_trials.provider_config import setting

    return setting("storage_path") or default_storage_path()


class TrialStorage:
    """Layout ``<storage_path>/<experiment>/<trial_id>/checkpoint_<iteration>/`` on a local path or
    URL.

    A Ray cluster needs a location every node reaches: a shared filesystem path or an fsspec URL
    such as ``s3://bucket/prefix`` (with the matching fsspec backend installed).

    :param storage_path: root directory or URL; default ``$AIRFLOW_TRIALS_STORAGE`` or
        ``~/airflow_trials_results``.
    :param local_log_path: local directory for captured stdout/stderr; default the storage root
        when it is local, else ``~/airflow_trials_results``.
    """

    def __init__(self, storage_path: str | None = None, local_log_path: str | None = None) -> None:
        self.storage_path = storage_path or default_storage_path()
        self.is_local = not is_url(self.storage_path)
        # fsspec is imported only for URLs, and only when the storage is first used (importing
        # s3fs and making its client costs about 1.4 s of CPU): a trial task, which only passes
        # the storage on to its actor, never pays it.
        self._fs: AbstractFileSystem | None = None
        if self.is_local:
            self.root = os.path.abspath(
                os.path.expanduser(self.storage_path.removeprefix("file://"))
            )
        else:
            # Paths stay full URLs, so a checkpoint path alone says where it lives.
            self.root = self.storage_path.rstrip("/")
        if local_log_path is None:
            local_log_path = (
                self.root
                if self.is_local
                else os.path.join(os.path.expanduser("~"), "airflow_trials_results")
            )
        self.local_log_path = os.path.abspath(os.path.expanduser(local_log_path))

    def endpoint(self) -> str:
        """Where the storage is reached, for messages: an object store's endpoint URL (its
        client's ``endpoint_url``, else ``AWS_ENDPOINT_URL``, else its URL's scheme and bucket),
        or the local root."""
        if self.is_local:
            return self.root
        fs = self._fs
        if fs is None:  # a message about the storage must not fail on making its client
            with contextlib.suppress(Exception):
                fs = self.fs
        client_kwargs = getattr(fs, "client_kwargs", None) or {}
        found = (
            client_kwargs.get("endpoint_url")
            or getattr(fs, "endpoint_url", None)
            or os.environ.get("AWS_ENDPOINT_URL")
        )
        if found:
            return str(found)
        scheme, _, rest = self.root.partition("://")
        return f"{scheme}://{rest.split('/', 1)[0]}"

    @property
    def fs(self) -> AbstractFileSystem:
        """The object store's filesystem, made on first use."""
        if self._fs is None:
            self._fs, _ = _url_to_fs(self.storage_path)
        return self._fs

    def prepare_in_background(self) -> None:
        """Make an object store's filesystem now, in a daemon thread, so that a trial's first
        checkpoint or its logs' upload do not wait for it while it trains; nothing for a local
        root. An error is left for the first real use to raise."""
        if not self.is_local and self._fs is None:
            threading.Thread(target=self._prepare, name="storage-client", daemon=True).start()

    def _prepare(self) -> None:
        with contextlib.suppress(Exception):
            _ = self.fs

    # -- paths ------------------------------------------------------------------------------------
    def _join(self, *parts: str) -> str:
        return os.path.join(self.root, *parts) if self.is_local else "/".join((self.root, *parts))

    def experiment_dir(self, experiment_name: str) -> str:
        return self._join(validate_name("Experiment name", experiment_name))

    def trial_dir(self, experiment_name: str, trial_id: str) -> str:
        return self._join(
            validate_name("Experiment name", experiment_name), validate_name("Trial id", trial_id)
        )

    def checkpoint_dir(self, experiment_name: str, trial_id: str, iteration: int) -> str:
        base = self.trial_dir(experiment_name, trial_id)
        name = f"{_CHECKPOINT_PREFIX}{iteration:06d}"
        return os.path.join(base, name) if self.is_local else f"{base}/{name}"

    def log_paths(self, experiment_name: str, trial_id: str) -> tuple[str, str]:
        """Local paths of the trial's captured stdout and stderr."""
        base = os.path.join(
            self.local_log_path,
            validate_name("Experiment name", experiment_name),
            validate_name("Trial id", trial_id),
        )
        return os.path.join(base, "stdout.log"), os.path.join(base, "stderr.log")

    def logs_dir(self, experiment_name: str, trial_id: str) -> str:
        """Where a finished trial's stdout.log and stderr.log are kept on the storage."""
        base = self.trial_dir(experiment_name, trial_id)
        return os.path.join(base, _LOGS_DIR) if self.is_local else f"{base}/{_LOGS_DIR}"

    def save_logs(self, experiment_name: str, trial_id: str) -> dict[str, str]:
        """Copy the trial's captured stdout and stderr from this node into :meth:`logs_dir`, so
        they outlive the node; returns ``{"stdout": path, "stderr": path}`` of the copies made
        (a stream that wrote no file is left out). Raises what the filesystem raised."""
        target_dir = self.logs_dir(experiment_name, trial_id)
        saved: dict[str, str] = {}
        for stream, source in zip(
            ("stdout", "stderr"), self.log_paths(experiment_name, trial_id), strict=True
        ):
            if not os.path.exists(source):
                continue
            name = os.path.basename(source)
            target = os.path.join(target_dir, name) if self.is_local else f"{target_dir}/{name}"
            self._upload_file(source, target)
            saved[stream] = target
        return saved

    # -- small files
    # --------------------------------------------------------------------------------
    def write_json(self, path: str, data: Any) -> None:
        """Write ``data`` as JSON to ``path``; atomically on a local filesystem."""
        # No indent: json's C encoder serves only unindented output, about 4x faster; a runner
        # writes trial.json at every trial's end and the experiment state (every trial) on its
        # driver thread (docs/benchmarks.md, "Where the time over the minimum goes").
        text = json.dumps(data, sort_keys=True, default=repr)
        if self.is_local:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
            with open(tmp, "w", encoding="utf-8") as f:
                f.write(text)
            os.replace(tmp, path)
        else:
            try:
                self.fs.pipe_file(path, text.encode("utf-8"))
            except Exception as e:  # noqa: BLE001 - fsspec backends raise their own error types
                raise _StorageUnanswered() from e

    def read_json(self, path: str) -> Any:
        if self.is_local:
            with open(path, encoding="utf-8") as f:
                return json.load(f)
        return json.loads(self.fs.cat_file(path).decode("utf-8"))

    def exists(self, path: str) -> bool:
        return os.path.exists(path) if self.is_local else bool(self.fs.exists(path))

    # -- a graceful stop's drain: whether the trial's last actor paused for a stop
    def mark_drained(self, experiment_name: str, trial_id: str, iteration: int | None) -> None:
        """Record that the trial's actor paused at ``iteration`` for a stop (None: it trains
        again, so its end from here on is its own): the next try reads a gone actor as stopped
        with the stack, not as a failure of the trial."""
        path = self._join(self.trial_dir(experiment_name, trial_id), _DRAINED_FILE)
        if iteration is not None:
            self.write_json(path, {"iteration": iteration, "at": time.time()})
        elif self.is_local:
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)
        elif self.fs.exists(path):
            self.fs.rm_file(path)

    def drained_at(self, experiment_name: str, trial_id: str) -> int | None:
        """The iteration the trial's last actor paused at for a stop, or None."""
        path = self._join(self.trial_dir(experiment_name, trial_id), _DRAINED_FILE)
        try:
            return int(self.read_json(path)["iteration"]) if self.exists(path) else None
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def has_checkpoint(self, path: str) -> bool:
        """Is a checkpoint this storage persisted complete at ``path``? Its metadata file is
        written last, so a checkpoint whose persist was cut short has none."""
        return self.exists(self._meta_path(path))

    def _meta_path(self, checkpoint: str) -> str:
        """Where a checkpoint's metadata file, written last, lies."""
        if self.is_local:
            return os.path.join(checkpoint, _META_FILE)
        return f"{checkpoint.rstrip('/')}/{_META_FILE}"

    # -- checkpoints
    # --------------------------------------------------------------------------------
    def scratch_dir(self, experiment_name: str, trial_id: str) -> str:
        """A fresh local directory to write a checkpoint into before it is persisted."""
        if self.is_local:
            base = self.trial_dir(experiment_name, trial_id)
            os.makedirs(base, exist_ok=True)
            return tempfile.mkdtemp(prefix=".scratch-", dir=base)
        return tempfile.mkdtemp(prefix="airflow_trials_ckpt_")

    def persist_checkpoint(
        self,
        experiment_name: str,
        trial_id: str,
        iteration: int,
        payload: Any,
        meta: Mapping[str, Any],
    ) -> str:
        """Store ``payload`` (a dict, or a local directory path) as the checkpoint at
        ``iteration``."""
        target = self.checkpoint_dir(experiment_name, trial_id, iteration)
        meta = {**meta, "iteration": iteration, "trial_id": trial_id}
        try:
            if isinstance(payload, Mapping):
                meta["kind"] = "dict"
                staging = self.scratch_dir(experiment_name, trial_id)
                try:
                    with open(os.path.join(staging, _DICT_FILE), "wb") as f:
                        pickle.dump(dict(payload), f)
                    self._install(staging, target, move=True)
                finally:
                    # Made here for this one save: a retry pickles the dict again, so a save that
                    # failed leaves no scratch copy behind (a moved one is gone already).
                    shutil.rmtree(staging, ignore_errors=True)
            elif isinstance(payload, str) and os.path.isdir(payload):
                meta["kind"] = "dir"
                if not (self.is_local and os.path.abspath(payload) == target):
                    # Scratch directories we handed out are moved; a user's own directory is copied.
                    name = os.path.basename(payload.rstrip("/"))
                    scratch = name.startswith((".scratch-", "airflow_trials_ckpt_"))
                    self._install(payload, target, move=scratch)
            else:
                raise CheckpointError(
                    f"Trial {trial_id}: a checkpoint must be a dict or an existing directory, "
                    f"got {payload!r}."
                )
            self.write_json(self._meta_path(target), meta)
        except CheckpointError:
            raise
        except _StorageUnanswered as e:
            raise CheckpointStorageError(
                f"Trial {trial_id} of experiment {experiment_name}: could not save its checkpoint "
                f"at iteration {iteration} to {target}: the storage at {self.endpoint()} did not "
                f"take it within its client's retries ({type(e.__cause__).__name__}: "
                f"{e.__cause__}). Check that the endpoint answers and this node reaches it. Not a "
                "failure of the trial: its task resumes it from its last saved checkpoint."
            ) from e.__cause__
        except (OSError, pickle.PicklingError, TypeError, AttributeError) as e:
            raise CheckpointError(
                f"Trial {trial_id} of experiment {experiment_name}: could not persist its "
                "checkpoint "
                f"at iteration {iteration} to {target}: {e}"
            ) from e
        return target

    def _install(self, source: str, target: str, move: bool) -> None:
        if self.is_local:
            if os.path.exists(target):
                shutil.rmtree(target)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            if move:
                os.replace(source, target)
            else:
                shutil.copytree(source, target)
        else:
            try:
                if self.fs.exists(target):
                    self.fs.rm(target, recursive=True)
                self.fs.put(source.rstrip("/") + "/", target, recursive=True)
            except Exception as e:  # noqa: BLE001 - fsspec backends raise their own error types
                raise _StorageUnanswered() from e
            if move:
                shutil.rmtree(source, ignore_errors=True)

    def _upload_file(self, source: str, target: str) -> None:
        """One local file to ``target``, replacing it (atomically on a local filesystem)."""
        if self.is_local:
            os.makedirs(os.path.dirname(target), exist_ok=True)
            tmp = f"{target}.tmp-{uuid.uuid4().hex[:8]}"
            shutil.copyfile(source, tmp)
            os.replace(tmp, target)
        else:
            self.fs.put_file(source, target)

    def saved_checkpoints(
        self, experiment_name: str, trial_id: str, after: int = 0
    ) -> list[tuple[str, dict[str, Any]]]:
        """The trial's complete checkpoints past iteration ``after``, oldest first, each as
        ``(path, metadata)``: what its actors saved, recorded in the trials DB or not (one whose
        persist was cut short has no metadata and is left out)."""
        found = []
        for iteration, path in sorted(self.checkpoint_dirs(experiment_name, trial_id).items()):
            if iteration <= after:
                continue
            try:
                found.append((path, self.read_json(self._meta_path(path))))
            except (FileNotFoundError, ValueError):
                continue  # not complete (its metadata is written last), or unreadable
        return found

    def checkpoint_dirs(self, experiment_name: str, trial_id: str) -> dict[int, str]:
        """Every checkpoint directory of the trial on the storage, complete or not, by iteration
        (one listing of its folder)."""
        base = self.trial_dir(experiment_name, trial_id)
        try:
            names = (
                os.listdir(base)
                if self.is_local
                else [str(p).rstrip("/").rsplit("/", 1)[-1] for p in self.fs.ls(base, detail=False)]
            )
        except (FileNotFoundError, NotADirectoryError):
            return {}
        found = {}
        for name in names:
            suffix = name.removeprefix(_CHECKPOINT_PREFIX)
            if suffix != name and suffix.isdigit():
                found[int(suffix)] = self.checkpoint_dir(experiment_name, trial_id, int(suffix))
        return found

    def load_checkpoint(self, path: str) -> tuple[Any, dict[str, Any]]:
        """Returns ``(payload, meta)``: the dict, or a local directory holding the checkpoint's
        files."""
        return read_checkpoint(path)

    def delete(self, path: str) -> None:
        """Delete the checkpoint (or trial folder) at ``path``, which must lie below the storage
        root (:func:`~airflow_trials.storage.storage_root.resolve_inside`): a record that names
        another place never deletes it.

        :raises CheckpointError: ``path`` is outside the root, or the filesystem failed.
        """
        try:
            resolve_inside(path, self.root)
        except OutsideStorageRootError as e:
            raise CheckpointError(f"Did not delete checkpoint {path}: {e}") from e
        try:
            if self.is_local:
                shutil.rmtree(path, ignore_errors=True)
            elif self.fs.exists(path):
                self.fs.rm(path, recursive=True)
        except OSError as e:
            raise CheckpointError(f"Could not delete checkpoint {path}: {e}") from e

    def delete_released(self, trial_id: str, paths: Iterable[str]) -> list[str]:
        """Delete checkpoints that no record names any more; returns those deleted. One that cannot
        be deleted is logged and only stays on the storage."""
        deleted = []
        for path in paths:
            try:
                self.delete(path)
            except CheckpointError as e:
                log.warning("Trial %s: %s; it stays on the storage.", trial_id, e)
                continue
            deleted.append(path)
        return deleted

    def copy_checkpoint(
        self, source: str, experiment_name: str, trial_id: str, iteration: int
    ) -> str:
        """Copy the checkpoint at ``source`` into ``trial_id``'s directory; returns the new path."""
        target = self.checkpoint_dir(experiment_name, trial_id, iteration)
        try:
            if self.is_local:
                if os.path.exists(target):
                    shutil.rmtree(target)
                shutil.copytree(source, target)
            else:
                if self.fs.exists(target):
                    self.fs.rm(target, recursive=True)
                self.fs.copy(source.rstrip("/") + "/", target, recursive=True)
        except OSError as e:
            raise CheckpointError(
                f"Could not copy checkpoint {source} to trial {trial_id} of experiment "
                f"{experiment_name}: {e}"
            ) from e
        return target


class _StorageUnanswered(Exception):  # noqa: N818 - a marker, raised from the backend's error
    """An object store's call failed after its client's retries (chained from its error)."""


def discard_restored(path: str, payload: Any) -> None:
    """Remove the local copy :func:`read_checkpoint` downloaded of the directory checkpoint at
    ``path`` (under a URL), once nothing reads it any more; nothing for a local checkpoint, whose
    directory is the checkpoint itself, or a dict."""
    if is_url(path) and isinstance(payload, str):
        shutil.rmtree(payload, ignore_errors=True)


def _url_to_fs(url: str) -> tuple[AbstractFileSystem, str]:
    import fsspec

    fs, root = fsspec.core.url_to_fs(url)
    return fs, str(root)


def load_checkpoint(path: str) -> Any:
    """What the trainable saved at the checkpoint ``path``: the dict it reported or returned from
    ``save_checkpoint``, or a local directory holding the files it wrote (a checkpoint under a URL,
    such as ``s3://``, is downloaded to a temporary directory first).

    ``path`` is a trial's ``best_checkpoint`` or ``latest_checkpoint`` as the leaderboard, the
    CLI and ``select_best``'s XCom give it. Raises :class:`CheckpointError` when it cannot be read.
    """
    return read_checkpoint(path)[0]


def read_checkpoint(path: str) -> tuple[Any, dict[str, Any]]:
    """``(payload, meta)`` of a checkpoint: see :func:`load_checkpoint`; ``meta`` holds its
    iteration."""
    missing = CheckpointNotFoundError(
        f"Could not load checkpoint {path}: no such directory. Take the path from a trial's "
        f"best_checkpoint or latest_checkpoint (leaderboard, select_best's XCom), on a "
        f"machine that sees the experiment's storage_path."
    )
    try:
        if is_url(path):
            fs, fs_path = _url_to_fs(path)
            if not fs.exists(
                fs_path
            ):  # fs.get of a missing prefix copies nothing and raises nothing
                raise missing
            local_dir = tempfile.mkdtemp(prefix="airflow_trials_restore_")
            try:
                fs.get(fs_path.rstrip("/") + "/", local_dir + "/", recursive=True)
            except BaseException:
                shutil.rmtree(local_dir, ignore_errors=True)
                raise
        else:
            local_dir = os.path.abspath(os.path.expanduser(path.removeprefix("file://")))
            if not os.path.isdir(local_dir):
                raise missing
        meta_file = os.path.join(local_dir, _META_FILE)
        if os.path.exists(meta_file):
            with open(meta_file, encoding="utf-8") as f:
                meta = json.load(f)
        else:
            meta = {"kind": "dir"}  # a directory written by hand, e.g. a restore_path
        if meta.get("kind") == "dict":
            try:
                with open(os.path.join(local_dir, _DICT_FILE), "rb") as f:
                    return pickle.load(f), meta
            finally:
                if is_url(path):  # the download, not the checkpoint: the dict is all it held
                    shutil.rmtree(local_dir, ignore_errors=True)
        return local_dir, meta
    except (OSError, pickle.UnpicklingError, EOFError, ValueError) as e:
        raise CheckpointError(f"Could not load checkpoint {path}: {e}") from e
