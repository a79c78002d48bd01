"""SweepProgress: a whole experiment's progress in a few counters (done, running, pending, best,
ETA).

A sweep's driver keeps one as a runner callback, and its task log shows :meth:`SweepProgress.line`.
It costs the same per result at trial 10 and at trial 10,000: counters and one best value, never a
scan of the trials.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from typing import Any

from airflow_trials.core.callback import Callback
from airflow_trials.core.progress import format_value
from airflow_trials.core.result import Result
from airflow_trials.core.status import TrialStatus
from airflow_trials.core.trial import Trial

#: What :meth:`SweepProgress.snapshot` returns (plain values: it crosses Ray and becomes an event).
SweepSnapshot = dict[str, Any]


class SweepProgress(Callback):
    """Counts a sweep's trials as they start and end, and keeps the best ``metric`` reported.

    :param total: trials in the sweep, those finished before a resume included.
    :param metric: the metric that ranks trials. :param mode: ``"min"`` or ``"max"``.
    :param done_before: trials that had ended before this driver started (a resumed sweep); default
        0.
    :param best_before: ``(best value, trial id)`` among those, or None; default None.
    :param clock: seconds, for the ETA; default ``time.monotonic``.
    """

    def __init__(
        self,
        total: int,
        metric: str,
        mode: str,
        *,
        done_before: int = 0,
        best_before: tuple[float, str] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if mode not in ("min", "max"):
            raise ValueError(f"mode must be 'min' or 'max', got {mode!r}.")
        self.total = total
        self.metric = metric
        self.mode = mode
        self.terminated = done_before
        self.errored = 0
        self.resumed_done = done_before
        self._running: set[str] = set()
        self.best: tuple[float, str] | None = best_before
        self._clock = clock
        self._started = clock()
        self.finished = False
        self.error: str | None = None

    # -- the runner's events -----------------------------------------------------------------
    def on_trial_start(self, trial: Trial) -> None:
        self._running.add(trial.trial_id)

    def on_trial_result(self, trial: Trial, result: Result) -> None:
        value = result.get(self.metric)
        if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
            return
        if self.best is None or (
            value > self.best[0] if self.mode == "max" else value < self.best[0]
        ):
            self.best = (float(value), trial.trial_id)

    def on_trial_recover(self, trial: Trial) -> None:
        self._running.discard(trial.trial_id)

    def on_trial_error(self, trial: Trial) -> None:
        self._ended(trial, TrialStatus.ERROR)

    def on_trial_complete(self, trial: Trial) -> None:
        self._ended(trial, TrialStatus.TERMINATED)

    def _ended(self, trial: Trial, status: TrialStatus) -> None:
        self._running.discard(trial.trial_id)
        if status is TrialStatus.ERROR:
            self.errored += 1
        else:
            self.terminated += 1

    # -- reading it ---------------------------------------------------------------------------
    @property
    def done(self) -> int:
        return self.terminated + self.errored

    def eta_seconds(self) -> float | None:
        """Seconds left at this driver's pace so far; None before its first trial ended."""
        finished_here = self.done - self.resumed_done
        if finished_here <= 0:
            return None
        left = self.total - self.done
        return left * (self._clock() - self._started) / finished_here

    def snapshot(self) -> SweepSnapshot:
        running = len(self._running)
        return {
            "total": self.total,
            "terminated": self.terminated,
            "errored": self.errored,
            "running": running,
            "pending": max(0, self.total - self.done - running),
            "best_value": self.best[0] if self.best else None,
            "best_trial_id": self.best[1] if self.best else None,
            "metric": self.metric,
            "mode": self.mode,
            "eta_seconds": self.eta_seconds(),
            "elapsed_seconds": self._clock() - self._started,
            "finished": self.finished,
            "error": self.error,
        }


def progress_line(snapshot: Mapping[str, Any]) -> str:
    """``2000 trials: 120 done (2 errored), 4 running, 1876 pending; best score=0.93 (trial t-7);
    ETA 3m20s``."""
    done = snapshot["terminated"] + snapshot["errored"]
    errored = f" ({snapshot['errored']} errored)" if snapshot["errored"] else ""
    line = (
        f"{snapshot['total']} trials: {done} done{errored}, {snapshot['running']} running, "
        f"{snapshot['pending']} pending"
    )
    if snapshot.get("best_value") is not None:
        line += (
            f"; best {snapshot['metric']}={format_value(snapshot['best_value'])} (trial "
            f"{snapshot['best_trial_id']})"
        )
    eta = snapshot.get("eta_seconds")
    if eta is not None and not snapshot.get("finished"):
        line += f"; ETA {format_duration(eta)}"
    return line


def format_duration(seconds: float) -> str:
    """``3m20s``, ``1h05m``, ``42s``."""
    seconds = max(0, int(round(seconds)))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def sweep_summary(
    run_key: str, progress: Mapping[str, Any] | None, warm_started_trials: int
) -> dict[str, Any]:
    """What a finished sweep task returns and pushes (XCom ``sweep``): the run's counts and best
    trial from the driver's last progress (None values when the driver was gone and the trials
    DB told that the run had ended)."""
    progress = progress or {}
    summary = {
        key: progress.get(key)
        for key in (
            "total",
            "terminated",
            "errored",
            "best_value",
            "best_trial_id",
            "metric",
            "mode",
            "elapsed_seconds",
        )
    }
    summary["run_key"] = run_key
    summary["warm_started_trials"] = warm_started_trials
    return summary


def end_line(summary: Mapping[str, Any]) -> str:
    """``Sweep <run> ended: 2000 trials TERMINATED, 0 ERROR; best loss=0.1 (trial t-7).``"""
    if summary.get("total") is None:
        return (
            f"Sweep {summary['run_key']} ended: every trial of the run had ended when its "
            "driver was last seen."
        )
    return (
        f"Sweep {summary['run_key']} ended: {summary['terminated']} trials TERMINATED, "
        f"{summary['errored']} ERROR; "
        f"best {summary['metric']}={format_value(summary['best_value'])} (trial "
        f"{summary['best_trial_id']})."
    )
