"""SweepProgress: a sweep's counts, best value and ETA from the runner's events, and its log
line."""

from __future__ import annotations

import pytest

from airflow_trials.core.sweep_progress import SweepProgress, format_duration, progress_line
from airflow_trials.core.trial import Trial


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def trial(trial_id: str) -> Trial:
    return Trial("tests.trainables:counting", trial_id=trial_id)


def test_counts_best_and_eta_follow_the_runners_events():
    clock = Clock()
    progress = SweepProgress(5, "loss", "min", clock=clock)
    a, b, c = trial("a"), trial("b"), trial("c")
    for t in (a, b):
        progress.on_trial_start(t)
    assert progress.snapshot()["running"] == 2 and progress.snapshot()["pending"] == 3
    assert progress.eta_seconds() is None  # nothing ended yet
    progress.on_trial_result(a, {"loss": 0.5})
    progress.on_trial_result(b, {"loss": 0.7})
    progress.on_trial_result(b, {"loss": float("nan")})  # never the best
    progress.on_trial_result(b, {"accuracy": 1.0})  # no metric: ignored
    clock.now += 10
    progress.on_trial_complete(a)
    progress.on_trial_recover(b)  # back to waiting: not running, not done
    progress.on_trial_start(c)
    progress.on_trial_result(c, {"loss": 0.25})
    progress.on_trial_error(c)
    snap = progress.snapshot()
    assert (snap["terminated"], snap["errored"], snap["running"], snap["pending"]) == (1, 1, 0, 3)
    assert (snap["best_value"], snap["best_trial_id"]) == (0.25, "c")
    assert snap["eta_seconds"] == pytest.approx(3 * 10 / 2)
    assert (
        progress_line(snap)
        == "5 trials: 2 done (1 errored), 0 running, 3 pending; best loss=0.25 (trial c); ETA 15s"
    )


def test_a_resumed_sweep_counts_what_ended_before_and_paces_on_its_own_trials():
    clock = Clock()
    progress = SweepProgress(
        10, "score", "max", done_before=4, best_before=(9.0, "old"), clock=clock
    )
    assert (
        progress.eta_seconds() is None
    )  # the earlier driver's trials say nothing of this one's pace
    t = trial("t")
    progress.on_trial_start(t)
    progress.on_trial_result(t, {"score": 3.0})  # below the earlier best
    clock.now += 60
    progress.on_trial_complete(t)
    snap = progress.snapshot()
    assert (snap["terminated"], snap["best_value"], snap["best_trial_id"]) == (5, 9.0, "old")
    assert snap["eta_seconds"] == pytest.approx(5 * 60)
    progress.finished = True
    assert (
        progress_line(progress.snapshot())
        == "10 trials: 5 done, 0 running, 5 pending; best score=9 (trial old)"
    )


def test_mode_is_checked_and_durations_read_well():
    with pytest.raises(ValueError, match="mode must be 'min' or 'max', got 'up'"):
        SweepProgress(1, "score", "up")
    assert [format_duration(s) for s in (0, 42.4, 200, 3900)] == ["0s", "42s", "3m20s", "1h05m"]
