"""Scheduler decisions and the FIFO scheduler; early-stopping schedulers plug in here."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from enum import StrEnum

from airflow_trials.core.resources import Resources
from airflow_trials.core.result import Result
from airflow_trials.core.status import TrialStatus
from airflow_trials.core.trial import Trial


class Decision(StrEnum):
    """What the runner does with a trial after one of its results."""

    CONTINUE = "CONTINUE"
    PAUSE = "PAUSE"
    STOP = "STOP"


HasResources = Callable[[Resources], bool]


class TrialScheduler:
    """Decides which trial runs next and what happens after each result.

    The runner calls the ``on_trial_*`` hooks as trials move, ``choose_trial_to_run`` whenever it
    could launch one, and ``on_trial_result`` for each result, acting on the :class:`Decision`.
    The scheduler never touches Ray: it sees trials and a ``has_resources`` predicate.
    """

    CONTINUE = Decision.CONTINUE
    PAUSE = Decision.PAUSE
    STOP = Decision.STOP

    def on_trial_add(self, trial: Trial) -> None:
        pass

    def on_trial_error(self, trial: Trial) -> None:
        pass

    def on_trial_result(self, trial: Trial, result: Result) -> Decision:
        return Decision.CONTINUE

    def on_trial_complete(self, trial: Trial, result: Result) -> None:
        pass

    def on_trial_remove(self, trial: Trial) -> None:
        pass

    def choose_trial_to_run(self, trials: Sequence[Trial], has_resources: HasResources) -> Trial | None:
        raise NotImplementedError

    def debug_string(self) -> str:
        return f"Using {type(self).__name__}."


class FIFOScheduler(TrialScheduler):
    """Runs trials in the order they were added; PAUSED trials only when no PENDING one fits."""

    def choose_trial_to_run(self, trials: Sequence[Trial], has_resources: HasResources) -> Trial | None:
        # Trials of one shape share the answer: asking once per shape keeps a step cheap when
        # hundreds of trials wait.
        answers: dict[Resources, bool] = {}
        for status in (TrialStatus.PENDING, TrialStatus.PAUSED):
            for trial in trials:
                if trial.status != status:
                    continue
                fits = answers.get(trial.resources)
                if fits is None:
                    fits = answers[trial.resources] = has_resources(trial.resources)
                if fits:
                    return trial
        return None

    def debug_string(self) -> str:
        return "Using FIFO scheduling algorithm."
