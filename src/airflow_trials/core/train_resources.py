"""A Ray Train trial's resources: its Train driver's bundle, which the trial's own actor holds, and
the workers that Ray Train V2 reserves itself (:class:`RayTrainResources`).

Train V2 (on by default since Ray 2.51) starts its workers in a placement group of its own, not in
the trial's (docs/engine.md, "Ray Train inside a trial"), so a plain ``PlacementGroupFactory`` with
worker bundles would book them twice. Declared here instead, the workers count where a trial's
resources are counted, with none of them booked by the trial's own group:

* the trial's sums (``gpu``, ``cpu``, ...): the runner starts a trial only when its driver and its
  workers fit beside the running ones, the cluster check refuses one that never could, and an
  Airflow GPU pool takes slots for every worker's GPUs;
* :meth:`RayTrainResources.scaling_settings`: Train's ``ScalingConfig`` of the same workers, which
  the trainable builds with ``airflow_trials.trial_scaling_config()``, so that one declaration
  sizes both.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from airflow_trials.core.resources import (
    STRATEGIES,
    PlacementGroupFactory,
    Resources,
    checked_bundle,
    compact_bundle,
    register_spec_form,
)

#: The key of :meth:`RayTrainResources.to_dict` that :meth:`Resources.from_dict` dispatches on.
RAY_TRAIN_KEY = "ray_train"


class RayTrainResources(PlacementGroupFactory):
    """A trial whose trainable runs a Ray Train trainer:
    ``RayTrainResources(driver={"CPU": 0.25}, num_workers=2, resources_per_worker={"CPU": 1,
    "GPU": 1}, placement_strategy="SPREAD")``.

    The trial's actor (the Train driver) holds ``driver`` in the trial's placement group; Train
    reserves the ``num_workers`` workers in its own group, with ``placement_strategy``. As a
    :class:`Resources` it is the sum of the driver and all workers, which is what the GPU pool's
    slots, the runner's admission and the cluster check count.

    :param driver: the driver's bundle, a dict of Ray resources; default ``{"CPU": 1}``.
    :param num_workers: Train's workers, at least 1.
    :param resources_per_worker: each worker's bundle; default ``{"CPU": 1}``. A worker shares one
        GPU (below 1) or takes whole GPUs; with a GPU, :meth:`scaling_settings` sets ``use_gpu``.
    :param placement_strategy: Train's strategy for its workers' group: ``"PACK"`` (default),
        ``"SPREAD"``, ``"STRICT_PACK"`` or ``"STRICT_SPREAD"``.
    """

    _num_workers: int
    _per_worker: Resources

    def __init__(
        self,
        driver: Mapping[str, Any] | None = None,
        num_workers: int = 1,
        resources_per_worker: Mapping[str, Any] | None = None,
        placement_strategy: str = "PACK",
    ) -> None:
        if not isinstance(num_workers, int) or isinstance(num_workers, bool) or num_workers < 1:
            raise ValueError(
                f"RayTrainResources num_workers must be a whole number >= 1, got {num_workers!r}; "
                "write e.g. num_workers=2."
            )
        if placement_strategy not in STRATEGIES:
            raise ValueError(
                f"RayTrainResources placement_strategy {placement_strategy!r} is not one of "
                f"{', '.join(STRATEGIES)}; write e.g. placement_strategy='SPREAD'."
            )
        driver = {"CPU": 1} if driver is None else driver
        if checked_bundle(0, driver, "RayTrainResources driver").is_empty():
            raise ValueError(
                f"RayTrainResources driver {dict(driver)!r} asks for nothing: the trial's actor "
                "(Train's driver) needs a bundle of its own; write e.g. driver={'CPU': 0.25}."
            )
        per_worker = {"CPU": 1} if resources_per_worker is None else resources_per_worker
        worker = checked_bundle(1, per_worker, "RayTrainResources resources_per_worker")
        if worker.is_empty():
            raise ValueError(
                f"RayTrainResources resources_per_worker {dict(per_worker)!r} asks for nothing; "
                "write e.g. resources_per_worker={'CPU': 1, 'GPU': 1}."
            )
        # Before the bundles: the identity (_placement_key) is computed with them.
        object.__setattr__(self, "_num_workers", num_workers)
        object.__setattr__(self, "_per_worker", worker)
        super().__init__([driver] + [per_worker] * num_workers, strategy=placement_strategy)

    @property
    def num_workers(self) -> int:
        return self._num_workers

    @property
    def resources_per_worker(self) -> dict[str, float]:
        """Each worker's bundle in Ray's spelling."""
        return Resources.to_ray_bundle(self._per_worker)

    @property
    def placement_strategy(self) -> str:
        """Train's strategy for its workers' group."""
        return self._strategy

    @property
    def strategy(self) -> str:
        return "PACK"  # the trial's own group is the driver's one bundle

    def placed_bundles(self) -> tuple[Resources, ...]:
        # The trial's group holds the driver only: Train V2 books its workers in a group of its own.
        return (self._given[0],)

    def _placement_key(self) -> Any:
        driver, worker = self._given[0], self._per_worker
        key = (driver._key, self._num_workers, worker._key)  # type: ignore[attr-defined]
        return (RAY_TRAIN_KEY, key, self._strategy)

    def scaling_settings(self) -> dict[str, Any]:
        """Ray Train's ``ScalingConfig`` arguments for these workers (``use_gpu`` when a worker
        has a GPU): ``ScalingConfig(**resources.scaling_settings())``, which
        ``airflow_trials.trial_scaling_config()`` builds inside the trainable."""
        per_worker = self.resources_per_worker
        return {
            "num_workers": self._num_workers,
            "resources_per_worker": per_worker,
            "use_gpu": per_worker.get("GPU", 0) > 0,
            "placement_strategy": self._strategy,
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            **Resources.to_dict(self),
            RAY_TRAIN_KEY: {
                "driver": Resources.to_ray_bundle(self._given[0]),
                "num_workers": self._num_workers,
                "resources_per_worker": self.resources_per_worker,
                "placement_strategy": self._strategy,
            },
        }

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any]) -> RayTrainResources:  # type: ignore[override]
        """Read :meth:`to_dict`'s form back (its sums are recomputed from the workers)."""
        train = spec[RAY_TRAIN_KEY]
        if not isinstance(train, Mapping):
            raise ValueError(
                f"Resources' {RAY_TRAIN_KEY!r} must be a dict such as {{'num_workers': 2, "
                f"'resources_per_worker': {{'CPU': 1}}}}, got {train!r}."
            )
        known = {"driver", "num_workers", "resources_per_worker", "placement_strategy"}
        unknown = sorted(set(train) - known)
        if unknown:
            raise ValueError(
                f"Resources' {RAY_TRAIN_KEY!r} takes driver, num_workers, resources_per_worker "
                f"and placement_strategy, got {unknown}; drop them."
            )
        return cls(
            train.get("driver"),
            train.get("num_workers", 1),
            train.get("resources_per_worker"),
            train.get("placement_strategy", "PACK"),
        )

    def summary_string(self) -> str:
        return (
            f"driver [{compact_bundle(self._given[0])}] + Ray Train {self._num_workers} x "
            f"[{compact_bundle(self._per_worker)}] ({self._strategy}; "
            f"{Resources.summary_string(self)} in all)"
        )

    def __repr__(self) -> str:
        return (
            f"RayTrainResources(driver={Resources.to_ray_bundle(self._given[0])!r}, "
            f"num_workers={self._num_workers}, resources_per_worker={self.resources_per_worker!r}, "
            f"placement_strategy={self._strategy!r})"
        )


register_spec_form(RAY_TRAIN_KEY, RayTrainResources.from_spec)

__all__ = ["RAY_TRAIN_KEY", "RayTrainResources"]
