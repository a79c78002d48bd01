"""Resources a trial asks for, with arithmetic that never drifts."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from airflow_trials.exceptions import AirflowTrialsError

# Ray schedules resources in units of 1/10000; computing in those integer units means
# 0.99 - 3 * 0.33 is exactly 0 instead of -1e-16.
_UNITS_PER_ONE = 10_000
_STANDARD = ("cpu", "gpu", "memory")
_RAY_NAMES = {"cpu": "CPU", "gpu": "GPU", "memory": "memory"}


def _to_units(value: float) -> int:
    return round(float(value) * _UNITS_PER_ONE)


def _from_units(units: int) -> float:
    return units / _UNITS_PER_ONE


@dataclass(frozen=True, eq=False)
class Resources:
    """What one trial needs: CPUs, GPUs, memory in bytes and custom Ray resources.

    Values may be fractional (``gpu=0.5`` shares a GPU between two trials). Arithmetic is done
    in Ray's resource granularity (1/10000), so sums and differences are exact.

    :param cpu: CPUs, default 1.
    :param gpu: GPUs, default 0.
    :param memory: memory in bytes, default 0 (not reserved).
    :param custom_resources: other Ray resources by name, e.g. ``{"TPU": 1}``; default none.
    """

    cpu: float = 1.0
    gpu: float = 0.0
    memory: float = 0.0
    custom_resources: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # What a user writes is one trial's request: a share of one GPU, or whole GPUs.
        if isinstance(self.gpu, (int, float)) and self.gpu > 1 and float(self.gpu) != int(self.gpu):
            raise ValueError(
                f"gpu={self.gpu:g} is invalid: a trial may share one GPU (gpu below 1) or use "
                "whole "
                f"GPUs, not {self.gpu:g}; use e.g. gpu=0.5, 1 or 2."
            )
        self._normalise()

    def _normalise(self) -> None:
        values = {"cpu": self.cpu, "gpu": self.gpu, "memory": self.memory, **self.custom_resources}
        for name, value in values.items():
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                raise ValueError(
                    f"Resource {name!r} must be a number, got {value!r}; "
                    f"write e.g. Resources(cpu=1, gpu=0.5)."
                )
        for name in self.custom_resources:
            if name.lower() in _STANDARD or name in _RAY_NAMES.values():
                raise ValueError(
                    f"Custom resource {name!r} shadows a standard one; "
                    f"pass it as cpu=, gpu= or memory= instead."
                )
        # Normalise so that equal amounts compare equal whatever float noise they came with.
        object.__setattr__(self, "cpu", _from_units(_to_units(self.cpu)))
        object.__setattr__(self, "gpu", _from_units(_to_units(self.gpu)))
        object.__setattr__(self, "memory", _from_units(_to_units(self.memory)))
        object.__setattr__(
            self,
            "custom_resources",
            {k: _from_units(_to_units(v)) for k, v in sorted(self.custom_resources.items())},
        )
        # The runner compares resources on every step: keep the integer form at hand.
        units = {name: _to_units(getattr(self, name)) for name in _STANDARD}
        units.update({k: _to_units(v) for k, v in self.custom_resources.items()})
        object.__setattr__(self, "_unit_map", units)
        object.__setattr__(self, "_key", tuple(sorted((k, v) for k, v in units.items() if v)))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Resources) and self._key == other._key  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash(self._key)  # type: ignore[attr-defined]

    # -- arithmetic ---------------------------------------------------------------------------
    def _units(self) -> dict[str, int]:
        return self._unit_map  # type: ignore[attr-defined, no-any-return]

    @classmethod
    def _from_unit_dict(cls, units: Mapping[str, int]) -> Resources:
        """An amount that arithmetic gave (what is free, what trials hold): not one trial's
        request, so 1.5 GPUs is a fine answer (two GPUs, half of one taken)."""
        amount = object.__new__(cls)
        for name in _STANDARD:
            object.__setattr__(amount, name, _from_units(units.get(name, 0)))
        object.__setattr__(
            amount,
            "custom_resources",
            {k: _from_units(v) for k, v in units.items() if k not in _STANDARD and v != 0},
        )
        amount._normalise()
        return amount

    def __add__(self, other: Resources) -> Resources:
        a, b = self._units(), other._units()
        return Resources._from_unit_dict(
            {k: a.get(k, 0) + b.get(k, 0) for k in a.keys() | b.keys()}
        )

    def __sub__(self, other: Resources) -> Resources:
        a, b = self._units(), other._units()
        return Resources._from_unit_dict(
            {k: a.get(k, 0) - b.get(k, 0) for k in a.keys() | b.keys()}
        )

    @staticmethod
    def subtract(original: Resources, to_remove: Resources) -> Resources:
        """``original - to_remove``, as Ray Tune's ``Resources.subtract``."""
        return original - to_remove

    def is_nonnegative(self) -> bool:
        return all(v >= 0 for v in self._units().values())

    def fits_in(self, available: Resources) -> bool:
        """True when every amount asked for is at most what ``available`` has."""
        have = available._units()
        return all(v <= have.get(k, 0) for k, v in self._units().items() if v > 0)

    def shortfall(self, available: Resources) -> dict[str, float]:
        """The amounts by which this request exceeds ``available``, by resource name."""
        have = available._units()
        return {
            k: _from_units(v - have.get(k, 0))
            for k, v in self._units().items()
            if v > have.get(k, 0)
        }

    def is_empty(self) -> bool:
        return all(v == 0 for v in self._units().values())

    # -- conversions --------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "cpu": self.cpu,
            "gpu": self.gpu,
            "memory": self.memory,
            "custom_resources": dict(self.custom_resources),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Resources:
        return cls.from_dict(json.loads(text))

    @classmethod
    def from_dict(cls, spec: Mapping[str, Any] | Resources | None) -> Resources:
        """Build from ``{"cpu": 1, "gpu": 0.5, "memory": ..., "custom_resources": {...}}``.

        Ray's spelling (``{"CPU": 1, "GPU": 1, "TPU": 2}``) is accepted too; unknown keys become
        custom resources.
        """
        if spec is None:
            return cls()
        if isinstance(spec, Resources):
            return spec
        if not isinstance(spec, Mapping):
            raise ValueError(
                f"Resources must be a mapping such as {{'cpu': 1, 'gpu': 0.5}}, got {spec!r}."
            )
        kwargs: dict[str, Any] = {}
        custom: dict[str, float] = dict(spec.get("custom_resources") or {})
        for key, value in spec.items():
            if key == "custom_resources":
                continue
            lowered = key.lower()
            if lowered in _STANDARD and key in (lowered, _RAY_NAMES[lowered]):
                kwargs[lowered] = value
            else:
                custom[key] = value
        return cls(**kwargs, custom_resources=custom)

    @classmethod
    def from_ray(cls, ray_resources: Mapping[str, float]) -> Resources:
        """Build from ``ray.cluster_resources()``; Ray's bookkeeping keys (``node:...``) are
        dropped."""
        custom = {
            k: v
            for k, v in ray_resources.items()
            if k not in ("CPU", "GPU", "memory", "object_store_memory")
            and not k.startswith("node:")
            and not k.startswith("accelerator_type:")
            and "_group_" not in k
        }
        return cls(
            cpu=ray_resources.get("CPU", 0.0),
            gpu=ray_resources.get("GPU", 0.0),
            memory=ray_resources.get("memory", 0.0),
            custom_resources=custom,
        )

    def to_ray_bundle(self) -> dict[str, float]:
        """The placement-group bundle for this request; zero amounts are left out, as Ray wants."""
        bundle = {_RAY_NAMES[name]: getattr(self, name) for name in _STANDARD}
        bundle.update(self.custom_resources)
        return {k: v for k, v in bundle.items() if v > 0}

    def summary_string(self) -> str:
        parts = [f"{_fmt(self.cpu)} CPU", f"{_fmt(self.gpu)} GPU"]
        if self.memory:
            parts.append(f"{self.memory / 2**30:.2f} GiB memory")
        parts.extend(f"{_fmt(v)} {k}" for k, v in self.custom_resources.items())
        return ", ".join(parts)

    def __str__(self) -> str:
        return self.summary_string()


def _fmt(value: float) -> str:
    return f"{value:g}"


class InsufficientResourcesError(AirflowTrialsError):
    """A trial asks for more than the whole cluster has, so it could never start.

    :param needed: what the trial asks for; None when not known. Default None.
    :param total: everything the Ray cluster has; None when not known. Default None.
    """

    def __init__(
        self, message: str, needed: Resources | None = None, total: Resources | None = None
    ):
        super().__init__(message)
        self.needed = needed
        self.total = total

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (type(self), (str(self), self.needed, self.total))
