"""Helpers of the in-process actor tests (run-ahead, hand-over): which iterations a trainable
started, from the log it writes, and a bounded wait for a condition."""

from __future__ import annotations

import time


def started(log) -> list[int]:
    return [int(line.split()[1]) for line in log.read_text().splitlines()] if log.exists() else []


def wait_for(condition, what, timeout_s=10.0):
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)
