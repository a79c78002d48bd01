"""Scheduler decisions, the FIFO scheduler and the base of the schedulers that judge one metric."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

from airflow_trials.core.checkpoint import CheckpointRecord
from airflow_trials.core.pareto import MetricSpec, ModeSpec, scheduler_metric_and_mode
from airflow_trials.core.resources import Resources
from airflow_trials.core.result import Result
from airflow_trials.core.status import TrialStatus
from airflow_trials.core.stop_kind import StopKind
from airflow_trials.core.trial import Trial

#: The key naming the rule in a scheduler's serialized Airflow-path settings (a MedianRule's and
#: a MOASHARungs' ``to_dict()``; AshaRungs' dicts have none): what
#: ``schedulers/registry.py`` reads them back by.
RULE_KEY = "rule"


class Decision(StrEnum):
    """What the runner does with a trial after one of its results."""

    CONTINUE = "CONTINUE"
    PAUSE = "PAUSE"
    STOP = "STOP"


HasResources = Callable[[Resources], bool]


class RecordedVerdict(Protocol):
    """A verdict a rule stored on a result (ASHA at a rung, the median rule on a running mean):
    the first one, however often the result is judged again."""

    @property
    def decision(self) -> Decision: ...

    @property
    def reason(self) -> str | None: ...


@dataclass(frozen=True)
class Exploit:
    """A bottom-quantile trial is to continue from a top trial's checkpoint with a perturbed config.

    :param trial_id: the trial that was paused and takes over the donor's state.
    :param donor_trial_id: the top trial it clones.
    :param donor_checkpoint: the donor's checkpoint to copy into the trial and resume from.
    :param new_config: the trial's config from now on: the donor's, explored.
    :param operations: dotted key -> what explore did, e.g. ``{"lr": "0.01 * 1.2"}``.
    :param time: the trial's ``time_attr`` when it was exploited.
    """

    trial_id: str
    donor_trial_id: str
    donor_checkpoint: CheckpointRecord
    new_config: dict[str, Any]
    operations: dict[str, str]
    time: float


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

    def judges_results(self) -> bool:
        """Can :meth:`on_trial_result` say anything but CONTINUE? Not when it is this class's."""
        return type(self).on_trial_result is not TrialScheduler.on_trial_result

    def picks_in_order(self) -> bool:
        """Does it start the waiting trials in the order they were added, as they are (FIFO's
        :meth:`choose_trial_to_run`, no exploit)? Then which trial starts next is known before a
        slot frees, so the runner may hand an ending trial's actor to it at once (docs/engine.md,
        "Hand-over"). Not by default."""
        return False

    def on_trial_complete(self, trial: Trial, result: Result) -> None:
        pass

    def on_trial_remove(self, trial: Trial) -> None:
        pass

    def choose_trial_to_run(
        self, trials: Sequence[Trial], has_resources: HasResources
    ) -> Trial | None:
        raise NotImplementedError

    def take_pending_actions(self) -> list[tuple[str, Decision]]:
        """Decisions on trials other than the one a hook was called for (HyperBand's halving
        stops the bracket's paused trials), oldest first; the caller carries each out. Emptied
        by the call; none by default."""
        return []

    def take_exploit(self, trial_id: str) -> Exploit | None:
        """For a trial this scheduler paused: the state it takes over before it runs again
        (PopulationBasedTraining's exploit), once; None by default. The runner pauses such a
        trial without saving, then applies it (``execution/driver/exploit.py``)."""
        return None

    def decision_reason(self, trial_id: str) -> str | None:
        """Why this scheduler last paused or stopped the trial, as a sentence; None if it never
        did."""
        return None

    def stop_kind(self, trial_id: str) -> StopKind:
        """The kind of this scheduler's stop of the trial (its stop kind from then on):
        SCHEDULER, stopped before its budget was spent, by default; MAX_T where it stopped the
        trial because it reached ``max_t``."""
        return StopKind.SCHEDULER

    def debug_string(self) -> str:
        return f"Using {type(self).__name__}."


class FIFOScheduler(TrialScheduler):
    """Runs trials in the order they were added; PAUSED trials only when no PENDING one fits."""

    def choose_trial_to_run(
        self, trials: Sequence[Trial], has_resources: HasResources
    ) -> Trial | None:
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

    def picks_in_order(self) -> bool:
        cls = type(self)
        return (
            cls.choose_trial_to_run is FIFOScheduler.choose_trial_to_run
            and cls.take_exploit is TrialScheduler.take_exploit
        )

    def debug_string(self) -> str:
        return "Using FIFO scheduling algorithm."


MODES = ("min", "max")


class MetricScheduler(FIFOScheduler):
    """Base of the schedulers that judge trials by one metric, as Ray Tune's do.

    It holds ``metric`` and ``mode``, takes them late through :meth:`set_search_properties`,
    checks them when a trial is added, reads the numbers a decision needs from a result with
    errors that name the missing key, and keeps the reason for each trial's last PAUSE or STOP
    (:meth:`decision_reason`). Trials run in FIFO order.

    :param metric: the result key judged, one (beside a searcher that optimises several, one of
        its metrics); default None (set it later with set_search_properties).
    :param mode: ``"min"`` or ``"max"``; default None (likewise).
    """

    def __init__(self, metric: str | None = None, mode: str | None = None) -> None:
        self._check_one_metric(metric)
        self._check_mode(mode)
        self.metric = metric
        self.mode = mode
        self._reasons: dict[str, str] = {}
        # The trials stopped because they reached max_t (stop kind MAX_T, not SCHEDULER).
        self._max_t_stops: set[str] = set()

    def _check_one_metric(self, metric: object) -> None:
        if metric is not None and not isinstance(metric, str):
            name = type(self).__name__
            raise ValueError(
                f"{name} judges trials by one metric, got metric={metric!r}; pass one metric to "
                f"the scheduler, e.g. {name}(metric='val_loss', mode='min'), or use "
                "FIFOScheduler (the default), which judges no metric, beside a searcher that "
                "optimises several."
            )

    def _check_mode(self, mode: str | None) -> None:
        if mode is not None and mode not in MODES:
            raise ValueError(
                f"{type(self).__name__} got mode={mode!r}, which is not a mode: use mode='min' "
                f"when a lower metric is better or mode='max' when a higher one is."
            )

    def set_search_properties(self, metric: str | None, mode: str | None, **spec: Any) -> bool:
        """Set ``metric`` and ``mode`` unless already set (Ray Tune's rule; the caller warns on
        False).

        Unlike Ray Tune, a mode without a metric does not fall back to an anonymous ``_metric``:
        the engine reports no such key.
        """
        if (self.metric and metric) or (self.mode and mode):
            return False
        self._check_one_metric(metric)
        self._check_mode(mode)
        self.metric = metric or self.metric
        self.mode = mode or self.mode
        return True

    @property
    def _sign(self) -> float:
        """Turns the metric into a score where higher is better."""
        return 1.0 if self.mode == "max" else -1.0

    def _check_ready(self, trial: Trial) -> None:
        if self.metric and self.mode:
            return
        name = type(self).__name__
        raise ValueError(
            f"{name} cannot take trial {trial.trial_id}: it has no metric or no mode to judge "
            f"trials by (metric={self.metric!r}, mode={self.mode!r}); create it with both, e.g. "
            f"{name}(metric='score', mode='max'), or call set_search_properties(metric, mode) "
            f"before adding trials."
        )

    def _number(self, trial: Trial, result: Mapping[str, Any], key: str, role: str) -> float:
        """``result[key]`` as a float; ValueError naming the key and the trial when it is
        missing."""
        name = type(self).__name__
        if key not in result:
            reported = ", ".join(sorted(str(k) for k in result)) or "nothing"
            raise ValueError(
                f"Trial {trial.trial_id} reported a result without {key!r}, the {role} {name} "
                f"decides by (the result has: {reported}); report {key!r} in every result, or "
                f"create {name} with a {role} the trainable reports."
            )
        return self._as_number(trial, key, result[key])

    def _as_number(self, trial: Trial, key: str, value: Any) -> float:
        try:
            return float(value)
        except (TypeError, ValueError) as e:
            raise ValueError(
                f"Trial {trial.trial_id} reported {key}={value!r}, but {type(self).__name__} needs "
                f"a number there; report {key} as an int or a float."
            ) from e

    def _optional_number(self, result: Mapping[str, Any], key: str) -> float | None:
        """``result[key]`` as a float, None when missing or not a number (a trial ended early)."""
        try:
            return float(result[key])
        except (KeyError, TypeError, ValueError):
            return None

    def decision_reason(self, trial_id: str) -> str | None:
        return self._reasons.get(trial_id)

    def stop_kind(self, trial_id: str) -> StopKind:
        return StopKind.MAX_T if trial_id in self._max_t_stops else StopKind.SCHEDULER


def format_number(value: float) -> str:
    """A number for a reason: integral values without a fraction, others to 4 significant digits."""
    value = float(value)
    if math.isfinite(value) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return f"{value:.4g}"


def experiment_metric_and_mode(
    scheduler: Any, metric: str | None, mode: str | None, name: str
) -> tuple[str, str]:
    """The metric and mode a scheduler judges by on the Airflow path: its own, or the experiment's
    where it has none (as Ray Tune's Tuner fills them from TuneConfig). ValueError, naming the fix,
    when the two disagree or neither gives one."""
    pairs = (("metric", scheduler.metric, metric), ("mode", scheduler.mode, mode))
    clash = [
        f"{key} {theirs!r} vs {ours!r}"
        for key, theirs, ours in pairs
        if theirs and ours and theirs != ours
    ]
    if clash:
        raise ValueError(
            f"The scheduler and the experiment disagree on {', '.join(clash)} (scheduler vs "
            "experiment): give the scheduler the experiment's metric and mode, or none."
        )
    chosen_metric, chosen_mode = scheduler.metric or metric, scheduler.mode or mode
    if not chosen_metric or not chosen_mode:
        raise ValueError(f"{name} needs a metric and a mode: give them to it or to the experiment.")
    return chosen_metric, chosen_mode


def judged_metric_and_mode(
    scheduler: Any, metric: MetricSpec, mode: ModeSpec
) -> tuple[MetricSpec, ModeSpec]:
    """What a scheduler judges trials by on the Airflow path, of an experiment of one metric or of
    several: all of them for one that takes several (MOASHA), else the one metric it names or is
    given (:func:`~airflow_trials.core.pareto.scheduler_metric_and_mode`, then
    :func:`experiment_metric_and_mode`). ValueError, naming the fix, as those raise it."""
    judged, judged_mode = scheduler_metric_and_mode(scheduler, metric, mode)
    if isinstance(judged, list) or isinstance(judged_mode, list):
        return metric, mode  # a scheduler that takes several: all of them
    return experiment_metric_and_mode(scheduler, judged, judged_mode, type(scheduler).__name__)
