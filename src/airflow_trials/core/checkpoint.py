"""Checkpoint records and the policy that keeps the N best of a trial's checkpoints."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class CheckpointRecord:
    """One persisted checkpoint of a trial.

    :param path: directory or fsspec URL holding the checkpoint.
    :param iteration: ``training_iteration`` the checkpoint was taken at.
    :param metrics: the result reported with it, used to score it.
    """

    path: str
    iteration: int
    metrics: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "iteration": self.iteration, "metrics": _jsonable(self.metrics)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CheckpointRecord:
        return cls(
            path=data["path"], iteration=int(data["iteration"]), metrics=data.get("metrics") or {}
        )


def _jsonable(metrics: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in metrics.items() if isinstance(v, (str, int, float, bool)) or v is None}


class CheckpointManager:
    """Keeps a trial's checkpoints: the newest always, and at most ``keep_checkpoints_num`` in all.

    When more are kept than allowed, the lowest-scoring one is dropped (by
    ``checkpoint_score_attr``,
    higher is better; prefix the attribute with ``min-`` when lower is better; without an
    attribute the oldest is dropped). The newest checkpoint is never dropped, because a restore
    after a failure needs it.

    A dropped checkpoint is also *retired*: a record written earlier (the trials DB, a saved
    experiment state) may still name it as the one to resume from, so it may be deleted from
    storage only once every such record was rewritten. :attr:`version` counts the changes of the
    kept set; a recorder that wrote the kept set as of version ``v`` hands ``v`` to
    :meth:`release`, which returns the retired checkpoints no record names any more::

        manager = CheckpointManager(keep_checkpoints_num=1)
        manager.on_checkpoint(CheckpointRecord("ckpt_1", 1))
        recorded = manager.version              # the trials DB now holds ckpt_1
        manager.on_checkpoint(CheckpointRecord("ckpt_2", 2))    # drops ckpt_1: retired, not deleted
        assert manager.release(recorded) == []  # the DB still names ckpt_1
        assert [r.path for r in manager.release(manager.version)] == ["ckpt_1"]  # DB rewritten

    :param keep_checkpoints_num: how many to keep; ``None`` keeps all (default).
    :param checkpoint_score_attr: metric that ranks checkpoints; default: recency.
    """

    def __init__(
        self,
        keep_checkpoints_num: int | None = None,
        checkpoint_score_attr: str | None = None,
    ) -> None:
        if keep_checkpoints_num is not None and keep_checkpoints_num < 1:
            raise ValueError(
                f"keep_checkpoints_num must be at least 1 or None, got {keep_checkpoints_num}; "
                f"use None to keep every checkpoint."
            )
        self.keep_checkpoints_num = keep_checkpoints_num
        self.checkpoint_score_attr = checkpoint_score_attr
        self._kept: list[CheckpointRecord] = []
        self._version = 0
        # (version that dropped it, record): dropped, not yet released for deletion.
        self._retired: list[tuple[int, CheckpointRecord]] = []

    @property
    def version(self) -> int:
        """How many times the kept set changed: a recorder acknowledges the version it wrote."""
        return self._version

    @property
    def retired(self) -> list[CheckpointRecord]:
        """Dropped checkpoints not yet released for deletion (a record may still name them)."""
        return [record for _, record in self._retired]

    def release(self, recorded_version: int | None = None) -> list[CheckpointRecord]:
        """Forget and return the retired checkpoints that no record names any more, now that a
        record of the kept set as of ``recorded_version`` was written (None: every retired one,
        when nothing outside this process names checkpoints). The caller deletes them."""
        if recorded_version is None:
            released, self._retired = self._retired, []
        else:
            released = [entry for entry in self._retired if entry[0] <= recorded_version]
            self._retired = [entry for entry in self._retired if entry[0] > recorded_version]
        return [record for _, record in released]

    @property
    def newest(self) -> CheckpointRecord | None:
        return self._kept[-1] if self._kept else None

    @property
    def kept(self) -> list[CheckpointRecord]:
        return list(self._kept)

    def best(self) -> CheckpointRecord | None:
        if not self._kept:
            return None
        if self.checkpoint_score_attr is None:
            return self._kept[-1]
        return max(self._kept, key=self._score)

    def score_value(self, record: CheckpointRecord) -> float | None:
        """The raw value of ``checkpoint_score_attr`` in the record's metrics, if it has one."""
        if self.checkpoint_score_attr is None:
            return None
        value = record.metrics.get(self.checkpoint_score_attr.removeprefix("min-"))
        if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
            return None
        return float(value)

    def _score(self, record: CheckpointRecord) -> float:
        attr = self.checkpoint_score_attr
        if attr is None:
            return float(record.iteration)
        sign = 1.0
        if attr.startswith("min-"):
            attr, sign = attr[4:], -1.0
        value = record.metrics.get(attr)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
            return -math.inf
        return sign * float(value)

    def on_checkpoint(self, record: CheckpointRecord) -> list[CheckpointRecord]:
        """Register a new checkpoint; returns the ones it pushed out, retired until
        :meth:`release`."""
        if self._kept and self._kept[-1].path == record.path:
            self._kept[-1] = record
            return []
        self._version += 1
        # Saved again where a retired one was (a retry from an earlier checkpoint): not deletable.
        self._retired = [entry for entry in self._retired if entry[1].path != record.path]
        self._kept.append(record)
        dropped: list[CheckpointRecord] = []
        limit = self.keep_checkpoints_num
        while limit is not None and len(self._kept) > limit:
            candidates = self._kept[:-1]  # never the newest
            worst = min(candidates, key=lambda r: (self._score(r), r.iteration))
            self._kept.remove(worst)
            dropped.append(worst)
        self._retired.extend((self._version, record_out) for record_out in dropped)
        return dropped

    def clear(self) -> list[CheckpointRecord]:
        """Forget every kept checkpoint (the caller deletes them, or registers some again); returns
        them. The retired ones stay retired until :meth:`release`."""
        kept, self._kept = self._kept, []
        self._version += 1
        return kept

    def to_dict(self) -> dict[str, Any]:
        return {
            "kept": [r.to_dict() for r in self._kept],
            "retired": [r.to_dict() for r in self.retired],
        }

    def load(self, data: Mapping[str, Any]) -> None:
        """Take over a saved state; its retired checkpoints wait for the first record written
        after it (version 1)."""
        self._kept = [CheckpointRecord.from_dict(r) for r in data.get("kept", [])]
        self._version = 1
        self._retired = [(1, CheckpointRecord.from_dict(r)) for r in data.get("retired", [])]
