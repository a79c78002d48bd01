"""The main job's Ctrl-C handling: a signal never lands inside a database call."""

from __future__ import annotations

import os
import signal

import pytest

from airflow_trials.mainjob import Interrupts


@pytest.fixture
def interrupts():
    saved = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    handler = Interrupts()
    handler.install()
    yield handler
    signal.signal(signal.SIGINT, saved[0])
    signal.signal(signal.SIGTERM, saved[1])


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_inside_a_deferred_section_is_raised_as_it_ends(interrupts, signum):
    finished = []
    with pytest.raises(KeyboardInterrupt):
        with interrupts.deferred():
            with interrupts.deferred():  # nested: only the outermost end raises
                os.kill(os.getpid(), signum)  # the handler runs here, at the next bytecode
                finished.append("inner")
            finished.append("outer")
    assert finished == ["inner", "outer"] and interrupts.requested.is_set()


def test_a_signal_outside_any_section_raises_at_once(interrupts):
    with pytest.raises(KeyboardInterrupt):
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(1000):  # the handler runs within the first few bytecodes
            pass
        pytest.fail("the signal did not interrupt")


def test_a_section_without_a_signal_raises_nothing(interrupts):
    with interrupts.deferred():
        pass
    assert not interrupts.requested.is_set()
