"""What a trainable is, and how one is found by its import path: the class users subclass
(:class:`Trainable`), :func:`load_trainable` and :func:`check_accepts_parameters`.

The driver checks a trainable with these before it launches a trial; the worker
(:mod:`airflow_trials.execution.worker.trainable`) runs it. Nothing here imports ray.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

from airflow_trials.core.imports import import_object
from airflow_trials.exceptions import TrainableNotFoundError

# -- the class API -------------------------------------------------------------------------------


class Trainable:
    """Subclass this for the class API; the engine calls ``setup`` once, then ``step`` per
    iteration.

    ``save_checkpoint(checkpoint_dir)`` writes files into ``checkpoint_dir`` and may return a dict
    instead; ``load_checkpoint`` receives that dict or the directory path. Return True from
    ``reset_config`` to let a reused actor take a new config without building a new object.

    :param config: the trial's hyperparameters.
    :param trial_id: the trial this object trains.
    :param parameters: the constants of :func:`~airflow_trials.with_parameters`, passed on to
        ``setup`` as keyword arguments; default none.
    """

    def __init__(self, config: Mapping[str, Any], trial_id: str = "", **parameters: Any) -> None:
        self.config = dict(config)
        self.trial_id = trial_id
        self.setup(self.config, **parameters)

    def setup(self, config: dict[str, Any]) -> None:
        """Build the model and data; called once with the trial's config. A trial made with
        :func:`~airflow_trials.with_parameters` also passes its constants as keyword arguments:
        define ``setup(self, config, data)`` to take them."""

    def step(self) -> Mapping[str, Any]:
        """Run one iteration and return its metrics."""
        raise NotImplementedError(f"{type(self).__name__} must implement step()")

    def save_checkpoint(self, checkpoint_dir: str) -> Mapping[str, Any] | None:
        """Write state into ``checkpoint_dir`` (return None) or return it as a dict."""
        raise NotImplementedError(
            f"{type(self).__name__} has no save_checkpoint(); implement it to use checkpoint_freq, "
            f"checkpoint_at_end, pause or failure recovery."
        )

    def load_checkpoint(self, checkpoint: Mapping[str, Any] | str) -> None:
        """Restore state from what ``save_checkpoint`` produced (a dict, or a directory path)."""
        raise NotImplementedError(f"{type(self).__name__} has no load_checkpoint()")

    def reset_config(self, new_config: dict[str, Any]) -> bool:
        """Take a new config in place; return True if done (default: False, a new object is
        built)."""
        return False

    def cleanup(self) -> None:
        """Release what setup() acquired; called when the trial stops."""


# -- loading trainables by import path -----------------------------------------------------------


def load_trainable(path: str) -> Callable[..., Any] | type[Trainable]:
    """Resolve ``"package.module:name"`` (or ``"package.module.name"``) to a function or Trainable
    class."""
    obj = import_object(
        path, "trainable", TrainableNotFoundError, "where the trial runs (the Ray workers too)"
    )
    if inspect.isclass(obj):
        if not issubclass(obj, Trainable):
            raise TrainableNotFoundError(
                f"Trainable {path!r} is a class but not a subclass of airflow_trials.Trainable."
            )
        return obj
    if not callable(obj):
        raise TrainableNotFoundError(
            f"Trainable {path!r} is neither a function nor a Trainable class."
        )
    return obj


def check_accepts_parameters(
    trainable: Callable[..., Any] | type[Trainable], path: str, names: tuple[str, ...]
) -> None:
    """Raise TrainableNotFoundError unless the trainable takes ``names`` as keyword arguments
    (a function after ``config``; a Trainable class in ``setup`` after ``config``)."""
    if not names:
        return
    fn: Callable[..., Any] = trainable
    args: tuple[Any, ...] = ({},)
    is_class = False
    if isinstance(trainable, type) and issubclass(trainable, Trainable):
        fn, args, is_class = trainable.setup, (None, {}), True  # unbound: self, config
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # a builtin or C function: its call will tell
    try:
        signature.bind(*args, **dict.fromkeys(names))
    except TypeError as e:
        wanted = f"({'self, ' if is_class else ''}config, {', '.join(names)})"
        raise TrainableNotFoundError(
            f"Trainable {path!r} does not take the with_parameters constants {', '.join(names)} as "
            f"keyword arguments ({e}); define {'its setup' if is_class else 'it'} as {wanted}."
        ) from e
