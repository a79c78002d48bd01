"""RunnerViews: what a TrialRunner shows of itself (statuses, recorded results, a summary), and a
check of its settings."""

from __future__ import annotations

from typing import TYPE_CHECKING

from airflow_trials.core.result import TIMESTAMP, Result
from airflow_trials.core.status import TrialStatus
from airflow_trials.core.trial import Trial

if TYPE_CHECKING:
    from airflow_trials.core.scheduler import TrialScheduler
    from airflow_trials.execution.driver.executor import RayTrialExecutor

TrialStatusMap = dict[str, tuple[Trial, TrialStatus]]
"""Trial id -> (trial, its status), as returned by fetch_status_results."""
TrialIdAndResultList = list[tuple[str, Result]]
"""(trial id, result) pairs, oldest first."""


def check_concurrency_cap(max_concurrent_trials: int | None) -> None:
    """ValueError unless ``max_concurrent_trials`` is None or a whole number >= 1."""
    cap = max_concurrent_trials
    if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 1):
        raise ValueError(f"max_concurrent_trials must be a whole number >= 1 or None, got {cap!r}.")


class RunnerViews:
    """Read-only views of :class:`~airflow_trials.execution.driver.runner.TrialRunner`'s state."""

    experiment_name: str
    trial_executor: RayTrialExecutor
    scheduler: TrialScheduler
    _trials: list[Trial]
    _results: TrialIdAndResultList
    _results_seen: int

    @property
    def experiment_dir(self) -> str:
        return self.trial_executor.storage.experiment_dir(self.experiment_name)

    def fetch_status_results(self) -> tuple[TrialStatusMap, TrialIdAndResultList]:
        """Every trial's status, and the results recorded since the last call, sorted by time."""
        new = self._results[self._results_seen :]
        self._results_seen = len(self._results)
        statuses = {t.trial_id: (t, t.status) for t in self._trials}
        return statuses, sorted(new, key=lambda pair: pair[1].get(TIMESTAMP, 0.0))

    def results(self, trial_id: str | None = None) -> TrialIdAndResultList:
        """All recorded results (of one trial, if given), in the order they were processed."""
        return [(tid, r) for tid, r in self._results if trial_id is None or tid == trial_id]

    def debug_string(self) -> str:
        counts: dict[str, int] = {}
        for trial in self._trials:
            counts[trial.status.value] = counts.get(trial.status.value, 0) + 1
        summary = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
        return (
            f"== Experiment {self.experiment_name} ==\n{self.scheduler.debug_string()}\n"
            f"Resources: {self.trial_executor.actors.resource_string()}\nTrials: {summary}"
        )
