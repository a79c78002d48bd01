"""``with_parameters``: large constants handed to a trainable by reference, not through its
config."""

from __future__ import annotations

import keyword
from collections.abc import Callable, Mapping
from typing import Any

# Trainable.__init__(config, trial_id, **parameters) takes these itself.
_RESERVED = ("config", "trial_id")


class TrainableWithParameters:
    """A trainable's import path with constants passed to it as keyword arguments.

    Made by :func:`with_parameters`. The engine puts each constant in Ray's object store once,
    when the first trial that uses it starts (:meth:`references`), and every trial's actor reads
    it from there: a function trainable is called ``fn(config, **parameters)``, a Trainable
    class's ``setup(config, **parameters)``. Trials keep only the import path and the names, so
    their config, checkpoints and stored state stay small JSON.

    :param trainable: the import path ``"package.module:name"``.
    :param parameters: name -> value; names are Python identifiers other than ``config`` and
        ``trial_id``.
    """

    def __init__(self, trainable: str, parameters: Mapping[str, Any]) -> None:
        if not isinstance(trainable, str) or not trainable.strip():
            raise TypeError(
                f"with_parameters() takes the trainable's import path first, such as "
                f"'my_pkg.train:train_fn', got {trainable!r}."
            )
        bad = [
            n for n in parameters if not n.isidentifier() or keyword.iskeyword(n) or n in _RESERVED
        ]
        if bad:
            raise ValueError(
                f"with_parameters({trainable!r}, ...): {bad} cannot be keyword arguments of the "
                f"trainable ('config' and 'trial_id' are taken); rename them."
            )
        self.trainable = trainable
        self.names: tuple[str, ...] = tuple(sorted(parameters))
        self._values: dict[str, Any] | None = dict(parameters)
        self._references: dict[str, Any] | None = None

    def references(self, put: Callable[[Any], Any]) -> dict[str, Any]:
        """Name -> reference, putting each value with ``put`` (Ray's ``ray.put``) on the first
        call only; this object then drops its own hold on the values."""
        if self._references is None:
            values = self._values or {}
            self._references = {name: put(values[name]) for name in self.names}
            self._values = None
        return dict(self._references)

    def __repr__(self) -> str:
        return f"with_parameters({self.trainable!r}, {', '.join(self.names)})"


def with_parameters(trainable: str, **parameters: Any) -> TrainableWithParameters:
    """Ray Tune's ``tune.with_parameters`` for an import path: pass the result as a Trial's
    trainable.

    ``Trial(with_parameters("my_pkg.train:train", data=big_array), config)`` calls
    ``train(config, data=big_array)`` in the trial's actor, with ``big_array`` read from Ray's
    object store, where it is put once for all trials sharing this object. Engine only
    (``TrialRunner``, ``RayTrialExecutor``): the Airflow operators refuse it, since each trial
    runs in its own task.
    """
    return TrainableWithParameters(trainable, parameters)


def refuse_in_airflow(trainable: Any, where: str) -> None:
    """Raise TypeError, naming the fix, when an Airflow task is handed a with_parameters bundle."""
    if isinstance(trainable, TrainableWithParameters):
        raise TypeError(
            f"{where}: {trainable!r} works only with TrialRunner / RayTrialExecutor in one driver "
            f"process. In an Airflow DAG each trial is its own task, run by another process, so "
            f"constants held in the DAG file's memory cannot reach it. Pass the import path "
            f"{trainable.trainable!r} and load the data inside the trainable (from a path or URL "
            "in "
            f"the config, or a module-level cache)."
        )
