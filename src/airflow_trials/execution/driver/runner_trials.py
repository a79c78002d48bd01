"""RunnerTrials: a TrialRunner's trials: added one by one or fed as they can start, looked up by
id, and the window of those not finished yet (the ended ones before it forgotten when asked)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from airflow_trials.core.status import TrialStatus
from airflow_trials.core.trial import Trial
from airflow_trials.execution.driver.exploit import check_scheduler_can_run

if TYPE_CHECKING:
    from airflow_trials.core.scheduler import TrialScheduler
    from airflow_trials.core.stopping import StopFn, Stopper
    from airflow_trials.execution.driver.executor import RayTrialExecutor


class RunnerTrials:
    """The trials of :class:`~airflow_trials.execution.driver.runner.TrialRunner`, which sets
    the attributes below and calls :meth:`_init_trials` once."""

    experiment_name: str
    trial_executor: RayTrialExecutor
    scheduler: TrialScheduler
    stop_criterion: Mapping[str, float] | StopFn | Stopper | None
    _experiment_stopper: Stopper | None

    def _init_trials(self, forget_ended: bool) -> None:
        self._trials: list[Trial] = []
        self._forget_ended = forget_ended
        self._feed: Iterator[Trial] | None = None
        self._fed_next: Trial | None = None
        self._shapes: set[Any] = set()  # every trial's resources, ever: what a waiting one needs
        self._finished_prefix = 0
        self._by_id: dict[str, Trial] = {}

    def add_trial(self, trial: Trial) -> None:
        """Add a trial; raises InsufficientResourcesError if it could never fit the cluster."""
        if trial.trial_id in self._by_id:
            raise ValueError(
                f"Trial id {trial.trial_id} is already in experiment {self.experiment_name}; "
                f"give each trial a unique trial_id."
            )
        if trial.experiment_name != self.experiment_name:
            if trial.experiment_name != "default":
                raise ValueError(
                    f"Trial {trial.trial_id} belongs to experiment {trial.experiment_name}, not "
                    f"{self.experiment_name}; create it with "
                    f"experiment_name={self.experiment_name!r}."
                )
            trial.experiment_name = self.experiment_name
        if trial.stopper is None and self._experiment_stopper is not None:
            trial.stopping_criterion = self.stop_criterion
            trial.stopper = self._experiment_stopper
        if not trial.status.is_terminal():
            self.trial_executor.actors.check_fits_cluster(trial)
            check_scheduler_can_run(self.scheduler, trial)
        self.scheduler.on_trial_add(trial)
        self._trials.append(trial)
        self._shapes.add(trial.resources)
        self._by_id[trial.trial_id] = trial

    def feed(self, trials: Iterable[Trial]) -> None:
        """Add ``trials`` one at a time as they can start, rather than all now: the runner takes
        the next when none of its trials waits (PENDING), as Ray Tune's controller asks its
        search algorithm for trials. A 100,000-trial sweep then holds one waiting trial, not
        100,000. In order, so FIFO starts them as it would have; a scheduler that sorts the
        trials it has (bracket by bracket) should be given them with :meth:`add_trial`."""
        if self._feed is not None:
            raise ValueError(
                f"Experiment {self.experiment_name} is already fed trials; feed() once per runner."
            )
        self._feed = iter(trials)
        self._fed_next = next(self._feed, None)

    def _top_up(self) -> None:
        """Add the fed trial next in line if no trial waits to start (one an ending trial's actor
        is to take over does not wait)."""
        if self._fed_next is None or any(
            t.status == TrialStatus.PENDING for t in self._startable()
        ):
            return
        trial, self._fed_next = self._fed_next, next(self._feed or iter(()), None)
        self.add_trial(trial)

    def get_trials(self) -> list[Trial]:
        return self._trials

    def get_trial(self, trial_id: str) -> Trial:
        try:
            return self._by_id[trial_id]
        except KeyError as e:
            raise KeyError(f"No trial {trial_id} in experiment {self.experiment_name}.") from e

    def _startable(self) -> list[Trial]:
        """:meth:`_unfinished` without the trials reserved for a hand-over
        (``RayTrialExecutor.reserved_trial_ids``): they start on the actor of the trial they
        follow, nowhere else."""
        unfinished = self._unfinished()
        reserved = self.trial_executor.reserved_trial_ids()
        return [t for t in unfinished if t.trial_id not in reserved] if reserved else unfinished

    def _unfinished(self) -> list[Trial]:
        """The trials from the first unfinished one on: they mostly finish in the order they
        started, so skipping the finished prefix keeps a step's scans short."""
        trials, start = self._trials, self._finished_prefix
        while start < len(trials) and trials[start].status.is_terminal():
            start += 1
        if self._forget_ended and start:  # the callbacks recorded them: let them go
            for trial in trials[:start]:
                del self._by_id[trial.trial_id]
            del trials[:start]
            start = 0
        self._finished_prefix = start
        return trials[start:]
