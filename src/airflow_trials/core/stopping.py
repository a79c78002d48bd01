"""Stopping criteria: metric thresholds or a callable deciding per result."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

StopFn = Callable[[str, Mapping[str, Any]], bool]


class Stopper:
    """Decides, from a trial's latest result, whether the trial is done.

    Subclass it, or pass a dict of thresholds / a callable to :func:`build_stopper`.
    """

    def __call__(self, trial_id: str, result: Mapping[str, Any]) -> bool:
        raise NotImplementedError

    def stop_all(self) -> bool:
        """Return True to end the whole experiment (default: never)."""
        return False

    def judges_experiment(self) -> bool:
        """Can :meth:`stop_all` say True? Not when it is this class's."""
        return type(self).stop_all is not Stopper.stop_all


class ThresholdStopper(Stopper):
    """Stops a trial once any metric reaches its threshold (``result[key] >= value``), as Ray Tune.

    :param thresholds: e.g. ``{"training_iteration": 10, "accuracy": 0.95}``.
    """

    def __init__(self, thresholds: Mapping[str, float]) -> None:
        for key, value in thresholds.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(
                    f"Stopping criterion {key!r} must be a number, got {value!r}; "
                    f"write e.g. {{'training_iteration': 10}}."
                )
        self.thresholds = dict(thresholds)

    def __call__(self, trial_id: str, result: Mapping[str, Any]) -> bool:
        for key, threshold in self.thresholds.items():
            if key not in result:
                raise KeyError(
                    f"Trial {trial_id} has stopping criterion {key!r} but its result has no such "
                    f"metric (it reported {sorted(result)}); report {key!r} or change the "
                    "criterion."
                )
            if result[key] >= threshold:
                return True
        return False


class FunctionStopper(Stopper):
    """Wraps ``fn(trial_id, result) -> bool``."""

    def __init__(self, fn: StopFn) -> None:
        self.fn = fn

    def __call__(self, trial_id: str, result: Mapping[str, Any]) -> bool:
        return bool(self.fn(trial_id, result))


def build_stopper(criterion: Mapping[str, float] | StopFn | Stopper | None) -> Stopper | None:
    if criterion is None:
        return None
    if isinstance(criterion, Stopper):
        return criterion
    if isinstance(criterion, Mapping):
        return ThresholdStopper(criterion) if criterion else None
    if callable(criterion):
        return FunctionStopper(criterion)
    raise ValueError(
        f"A stopping criterion must be a dict of thresholds, a callable (trial_id, result) -> bool "
        f"or a Stopper; got {criterion!r}."
    )
