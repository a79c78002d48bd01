"""WriteBehind (execution/driver/write_behind.py): a sweep driver's store writes, off the runner's
thread."""

from __future__ import annotations

import threading

import pytest

from airflow_trials.execution.driver.write_behind import WriteBehind


def test_writes_are_applied_in_order_off_the_caller_s_thread_and_drain_waits_for_them():
    applied, threads = [], set()
    gate = threading.Event()
    writer = WriteBehind("unit")

    def write(i):
        gate.wait(10)  # the first write is slow: the caller goes on meanwhile
        threads.add(threading.current_thread().name)
        applied.append(i)

    for i in range(50):
        writer.submit(write, i)
    assert applied == []  # queued, none applied yet: submit never waited
    gate.set()
    writer.drain()
    assert applied == list(range(50))
    assert threads == {"write-behind unit"}
    writer.close()


def test_a_failed_write_stops_every_later_one_and_is_raised_to_the_caller():
    applied = []
    writer = WriteBehind("sweep e/run_1")

    def fail():
        raise ValueError("no such trial row")

    writer.submit(applied.append, 1)
    writer.submit(fail)
    writer.submit(applied.append, 3)  # would build on the missing row: never applied
    with pytest.raises(
        RuntimeError,
        match=r"sweep e/run_1: a write to the trials DB failed, so none after it "
        r"was applied: ValueError: no such trial row",
    ) as info:
        writer.drain()
    assert isinstance(info.value.__cause__, ValueError)
    assert applied == [1]
    with pytest.raises(RuntimeError, match="no such trial row"):
        writer.submit(applied.append, 4)
    writer.close()  # ends the thread without raising
    assert applied == [1]


def test_close_applies_what_is_queued_first():
    applied = []
    writer = WriteBehind("unit")
    for i in range(20):
        writer.submit(applied.append, i)
    writer.close()
    assert applied == list(range(20))


def test_submit_waits_for_room_once_max_queued_writes_are_queued():
    applied, started, gate, submitted = [], threading.Event(), threading.Event(), threading.Event()
    writer = WriteBehind("unit", max_queued=2)

    def slow(i):
        started.set()
        gate.wait(10)
        applied.append(i)

    writer.submit(slow, 0)
    assert started.wait(10)  # the thread holds write 0: the queue is empty
    writer.submit(applied.append, 1)
    writer.submit(applied.append, 2)  # the queue is full now

    def third():
        writer.submit(applied.append, 3)
        submitted.set()

    caller = threading.Thread(target=third)
    caller.start()
    assert not submitted.wait(0.2)  # waits for room while the DB is behind
    assert writer._queue.qsize() == 2
    gate.set()
    caller.join(10)
    assert submitted.is_set()
    writer.drain()
    assert applied == [0, 1, 2, 3]
    writer.close()


def test_max_queued_below_one_is_refused():
    with pytest.raises(ValueError, match="WriteBehind unit: max_queued must be 1 or more, got 0"):
        WriteBehind("unit", max_queued=0)
