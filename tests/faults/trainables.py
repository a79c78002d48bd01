"""The fault tests' trainable, and the journal through which it proves how many copies of a trial
ran.

A test injects its fault while the trials are surely mid-run, whatever the machine's load: each
trial holds before iteration ``hold_at + 1`` until the test opens the gate (the file ``open`` in
the journal directory), then runs on to ``iterations``.

Every incarnation of a trial (a process running its function, from the start or from a
checkpoint) appends to ``<journal_dir>/<trial_id>.jsonl``: a ``start`` line, a ``beat`` line per
iteration (a ``held`` line every half second while it waits at the gate) and an ``end`` line when
it returns or is stopped. A killed incarnation writes no ``end``; it ran until at most one
iteration after its last line. Lines are appended with
O_APPEND and are short, so concurrent writers never interleave within a line.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import airflow_trials


def journaled(config: dict[str, Any]) -> None:
    """``iterations`` results of ``score = iteration * x``, ``sleep_s`` seconds apart, each with a
    checkpoint; resumes after the checkpoint it is given. Before iteration ``hold_at + 1`` (if
    ``hold_at`` > 0) it waits for the gate to open."""
    journal_dir = Path(config["journal_dir"])
    journal = journal_dir / f"{airflow_trials.get_trial_id()}.jsonl"
    incarnation = uuid.uuid4().hex
    checkpoint = airflow_trials.get_checkpoint()
    start = int(checkpoint["iteration"]) if checkpoint else 0
    hold_at = int(config.get("hold_at", 0))
    _append(journal, "start", incarnation, iteration=start)
    try:
        for iteration in range(start + 1, int(config["iterations"]) + 1):
            if hold_at and iteration == hold_at + 1:
                while not gate(journal_dir).exists():
                    time.sleep(0.5)
                    _append(journal, "held", incarnation)  # alive while held, for the overlap check
            time.sleep(float(config["sleep_s"]))
            _append(journal, "beat", incarnation, iteration=iteration)
            airflow_trials.report(
                score=iteration * float(config["x"]), checkpoint={"iteration": iteration}
            )
    finally:
        _append(journal, "end", incarnation)


class JournaledClass(airflow_trials.Trainable):
    """``journaled`` as a class trainable, which checkpoints only when the engine asks
    (``checkpoint_freq``, a drain): a stop can lose the iterations since its last checkpoint.
    It journals the same lines; its ``start`` line comes with its first step, after a restore."""

    def setup(self, config: dict[str, Any]) -> None:
        self.journal = Path(config["journal_dir"]) / f"{self.trial_id}.jsonl"
        self.incarnation = uuid.uuid4().hex
        self.iteration = 0
        self.started = False

    def step(self) -> dict[str, Any]:
        if not self.started:
            _append(self.journal, "start", self.incarnation, iteration=self.iteration)
            self.started = True
        self.iteration += 1
        time.sleep(float(self.config["sleep_s"]))
        _append(self.journal, "beat", self.incarnation, iteration=self.iteration)
        return {
            "score": self.iteration * float(self.config["x"]),
            "done": self.iteration >= int(self.config["iterations"]),
        }

    def save_checkpoint(self, checkpoint_dir: str) -> dict[str, Any]:
        return {"iteration": self.iteration}

    def load_checkpoint(self, checkpoint: Any) -> None:
        self.iteration = int(checkpoint["iteration"])

    def cleanup(self) -> None:
        _append(self.journal, "end", self.incarnation)


def gate(journal_dir: str | Path) -> Path:
    """The file whose existence lets held trials go on."""
    return Path(journal_dir) / "open"


def _append(path: Path, event: str, incarnation: str, **fields: Any) -> None:
    line = json.dumps(
        {"event": event, "incarnation": incarnation, "pid": os.getpid(), "t": time.time(), **fields}
    )
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


@dataclass
class Incarnation:
    """One process's run of a trial, as its journal lines tell it.

    :param resumed_from: the checkpoint's iteration it started after (0: from scratch).
    :param started: when it started (epoch seconds).
    :param last_seen: its last line's time: its end, or its last beat when it was killed.
    :param iterations: the iterations it reported, in order.
    :param beat_times: when it reported each of them.
    :param ended: whether it wrote its ``end`` line (it was not killed).
    """

    incarnation: str
    pid: int
    resumed_from: int
    started: float
    last_seen: float
    iterations: list[int]
    beat_times: list[float]
    ended: bool


def read_journal(journal_dir: str | Path, trial_id: str) -> list[Incarnation]:
    """The trial's incarnations, in the order they started."""
    path = Path(journal_dir) / f"{trial_id}.jsonl"
    by_id: dict[str, Incarnation] = {}
    for line in path.read_text().splitlines() if path.exists() else ():
        entry = json.loads(line)
        key = entry["incarnation"]
        if entry["event"] == "start":
            by_id[key] = Incarnation(
                key, entry["pid"], entry["iteration"], entry["t"], entry["t"], [], [], False
            )
            continue
        inc = by_id[key]
        inc.last_seen = max(inc.last_seen, entry["t"])
        if entry["event"] == "beat":
            inc.iterations.append(entry["iteration"])
            inc.beat_times.append(entry["t"])
        inc.ended = inc.ended or entry["event"] == "end"
    return sorted(by_id.values(), key=lambda inc: inc.started)
