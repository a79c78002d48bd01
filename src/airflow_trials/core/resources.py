"""Resources a trial asks for, with arithmetic that never drifts: one bundle (:class:`Resources`)
or several bundles of one placement group (:class:`PlacementGroupFactory`, Ray Tune's spelling)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from airflow_trials.exceptions import AirflowTrialsError

# Ray schedules resources in units of 1/10000; computing in those integer units means
# 0.99 - 3 * 0.33 is exactly 0 instead of -1e-16.
_UNITS_PER_ONE = 10_000
_STANDARD = ("cpu", "gpu", "memory")
_RAY_NAMES = {"cpu": "CPU", "gpu": "GPU", "memory": "memory"}
#: Ray's placement strategies, as ``ray.util.placement_group`` and Ray Tune take them.
STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")


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
        amounts = tuple(sorted((k, v) for k, v in units.items() if v))
        object.__setattr__(self, "_key", (amounts, self._placement_key()))

    def _placement_key(self) -> Any:
        """What, besides the amounts, tells two requests apart: nothing for one bundle."""
        return None

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

    # -- placement: one bundle, unless a PlacementGroupFactory says otherwise ---------------------
    @property
    def strategy(self) -> str:
        """Ray's placement strategy for the trial's bundles; moot for one bundle."""
        return "PACK"

    @property
    def head(self) -> Resources:
        """What the trial's own actor takes, in bundle 0: all of a one-bundle request."""
        return self

    @property
    def head_bundle_is_empty(self) -> bool:
        """Bundle 0 is ``{}``: the actor takes nothing, the later bundles are the group's."""
        return False

    def placed_bundles(self) -> tuple[Resources, ...]:
        """The trial's placement group's bundles, in order; none for a request of nothing (its
        actor then runs outside any placement group)."""
        return () if self.is_empty() else (self,)

    @property
    def bundles(self) -> list[dict[str, float]]:
        """:meth:`placed_bundles` in Ray's spelling, as Ray Tune's ``bundles``."""
        return [bundle.to_ray_bundle() for bundle in self.placed_bundles()]

    # -- conversions --------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "cpu": self.cpu,
            "gpu": self.gpu,
            "memory": self.memory,
            "custom_resources": dict(self.custom_resources),
        }

    @staticmethod
    def spec_of(value: Mapping[str, Any] | Resources | None) -> dict[str, Any]:
        """``value`` as a plain dict that :meth:`from_dict` reads back (what an operator keeps and
        Airflow serialises): a Resources' :meth:`to_dict`, a mapping copied, {} for None."""
        return value.to_dict() if isinstance(value, Resources) else dict(value or {})

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
        for key, reader in _SPEC_FORMS.items():  # several bundles, Ray Train's workers
            if key in spec:
                return reader(spec)
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


class PlacementGroupFactory(Resources):
    """A trial's resources as several bundles of one Ray placement group, in Ray Tune's spelling:
    ``PlacementGroupFactory([{"CPU": 1}] + [{"CPU": 1, "GPU": 1}] * 4, strategy="PACK")``.

    The trial's actor runs in bundle 0; the other bundles are for the Ray tasks and actors its
    trainable starts (Ray Train's workers, say), which land in the trial's placement group:
    ``ray.util.get_current_placement_group()`` inside the trainable returns it. A first bundle of
    ``{}`` leaves the actor no resources of its own, as in Ray Tune (``head_bundle_is_empty``).

    As a :class:`Resources` it is the sum of its bundles (``cpu``, ``gpu``, ...: what the
    cluster's totals and the GPU pool's slots count). It is a plain value: ``to_dict`` is JSON
    that :meth:`Resources.from_dict` reads back, so a trial stays plain JSON.

    :param bundles: the bundles, at least one, each a dict of Ray resources such as
        ``{"CPU": 1, "GPU": 0.5}`` (``CPU``/``GPU``/``memory`` or ``cpu``/``gpu``/``memory``;
        other names are custom resources). A bundle shares one GPU (below 1) or takes whole GPUs.
    :param strategy: ``"PACK"`` (default: on as few nodes as possible), ``"SPREAD"`` (over the
        nodes as evenly as possible), ``"STRICT_PACK"`` (all on one node) or ``"STRICT_SPREAD"``
        (each bundle on a node of its own).
    """

    # Set once, in __init__ (the dataclass above is frozen).
    _given: tuple[Resources, ...]  # the bundles as given, the first maybe empty
    _strategy: str

    def __init__(self, bundles: Sequence[Mapping[str, Any]], strategy: str = "PACK") -> None:
        given = _checked_bundles(bundles)
        if not isinstance(strategy, str) or strategy not in STRATEGIES:
            fix = str(strategy).upper() if str(strategy).upper() in STRATEGIES else "PACK"
            raise ValueError(
                f"PlacementGroupFactory strategy {strategy!r} is not one of "
                f"{', '.join(STRATEGIES)}; write e.g. strategy={fix!r}."
            )
        total = Resources(cpu=0)
        for bundle in given:
            total = total + bundle
        for name in _STANDARD:
            object.__setattr__(self, name, getattr(total, name))
        object.__setattr__(self, "custom_resources", dict(total.custom_resources))
        object.__setattr__(self, "_given", given)
        object.__setattr__(self, "_strategy", strategy)
        self._normalise()

    def _placement_key(self) -> Any:
        if len(self._given) == 1:  # one bundle: the same request as a plain Resources
            return None
        return (tuple(b._key for b in self._given), self._strategy)  # type: ignore[attr-defined]

    @property
    def strategy(self) -> str:
        return self._strategy

    @property
    def head_bundle_is_empty(self) -> bool:
        return self._given[0].is_empty()

    @property
    def head(self) -> Resources:
        return self._given[0]

    def placed_bundles(self) -> tuple[Resources, ...]:
        # An empty head is no bundle of the group, as in Ray Tune: the actor takes bundle 0 then.
        return self._given[1:] if self.head_bundle_is_empty else self._given

    @property
    def required_resources(self) -> dict[str, float]:
        """The sum of the bundles in Ray's spelling, as Ray Tune's ``required_resources``."""
        return Resources.to_ray_bundle(self)

    def to_ray_bundle(self) -> dict[str, float]:
        raise TypeError(
            "A PlacementGroupFactory is several bundles, not one: read its bundles "
            "(or required_resources for their sum)."
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            **super().to_dict(),
            "bundles": [Resources.to_ray_bundle(b) for b in self._given],
            "strategy": self.strategy,
        }

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any]) -> PlacementGroupFactory:
        """Read :meth:`to_dict`'s form back: ``{"bundles": [...], "strategy": ...}``, with the
        sums (``cpu``, ``gpu``, ...) it also writes, which must agree with the bundles."""
        unknown = sorted(set(spec) - {"bundles", "strategy", *_STANDARD, "custom_resources"})
        if unknown:
            raise ValueError(
                f"Resources with bundles take only bundles, strategy and their sums, got "
                f"{unknown}; put each amount in a bundle."
            )
        factory = cls(spec["bundles"], spec.get("strategy", "PACK"))
        sums = Resources.to_dict(factory)
        given = {k: spec[k] for k in sums if k in spec}
        if given and _amount({**sums, **given}) != _amount(sums):
            raise ValueError(
                f"Resources with bundles give {given} as their sums, but the bundles add up to "
                f"{Resources.summary_string(factory)}; leave the sums out."
            )
        return factory

    def summary_string(self) -> str:
        parts = " + ".join(f"[{compact_bundle(b)}]" for b in self._given)
        return f"{parts} ({self.strategy}; {Resources.summary_string(self)} in all)"

    def __repr__(self) -> str:
        bundles = [Resources.to_ray_bundle(b) for b in self._given]
        return f"PlacementGroupFactory({bundles!r}, strategy={self.strategy!r})"


#: The forms of :meth:`Resources.from_dict` besides one bundle, by the key that marks each: a
#: subclass defined elsewhere (``core/train_resources.py``) registers its own with
#: :func:`register_spec_form`, so this module imports none of them.
_SPEC_FORMS: dict[str, Callable[[Mapping[str, Any]], Resources]] = {
    "bundles": PlacementGroupFactory.from_spec
}


def register_spec_form(key: str, reader: Callable[[Mapping[str, Any]], Resources]) -> None:
    """Let :meth:`Resources.from_dict` read the dicts that carry ``key`` with ``reader``."""
    _SPEC_FORMS[key] = reader


def _amount(sums: Mapping[str, Any]) -> Resources:
    """``Resources.to_dict``'s form as an amount (1.5 GPUs is a fine sum of bundles)."""
    units = {k: _to_units(sums[k]) for k in _STANDARD}
    units.update({k: _to_units(v) for k, v in sums["custom_resources"].items()})
    return Resources._from_unit_dict(units)


def compact_bundle(bundle: Resources) -> str:
    """A bundle in a few words, its zero amounts left out (``1 CPU, 1 GPU``)."""
    return ", ".join(
        f"{_fmt(v / 2**30) + ' GiB' if k == 'memory' else _fmt(v)} {k}"
        for k, v in Resources.to_ray_bundle(bundle).items()
    )


def _checked_bundles(bundles: Any) -> tuple[Resources, ...]:
    """The bundles as Resources; ValueError, in one line naming the fix, for what Ray would refuse
    or never place."""
    example = "PlacementGroupFactory([{'CPU': 1}, {'CPU': 1, 'GPU': 1}])"
    if isinstance(bundles, Mapping):
        raise ValueError(
            f"PlacementGroupFactory takes a list of bundles, got the one dict {dict(bundles)!r}; "
            f"wrap it in a list, e.g. {example}."
        )
    if not isinstance(bundles, Sequence) or isinstance(bundles, str):
        raise ValueError(
            f"PlacementGroupFactory takes a list of bundles (dicts of Ray resources), got "
            f"{bundles!r}; write e.g. {example}."
        )
    if not bundles:
        raise ValueError(
            f"PlacementGroupFactory needs at least one bundle, got an empty list; write e.g. "
            f"{example} (bundle 0 is the trial's actor)."
        )
    given = tuple(checked_bundle(i, bundle) for i, bundle in enumerate(bundles))
    for i, bundle in enumerate(given):
        if i and bundle.is_empty():
            raise ValueError(
                f"PlacementGroupFactory bundle {i} is empty; only bundle 0 (the trial's actor) may "
                f"be, so give it resources or drop it."
            )
    if len(given) == 1 and given[0].is_empty():
        raise ValueError(
            f"PlacementGroupFactory({list(bundles)!r}) asks for nothing; give bundle 0 resources, "
            f"e.g. {example}."
        )
    return given


def checked_bundle(index: int, bundle: Any, where: str = "") -> Resources:
    """Bundle ``index`` as Resources; ValueError naming ``where`` (default: "PlacementGroupFactory
    bundle <index>") for what Ray would refuse."""
    where = where or f"PlacementGroupFactory bundle {index}"
    if not isinstance(bundle, Mapping):
        raise ValueError(
            f"{where} must be a dict of Ray resources such as {{'CPU': 1, 'GPU': 1}}, got "
            f"{bundle!r}."
        )
    amounts = {k: v for k, v in bundle.items() if k != "custom_resources"}
    amounts.update(bundle.get("custom_resources") or {})
    for name, value in amounts.items():
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not number or not math.isfinite(value) or value < 0:
            raise ValueError(
                f"{where} asks for {name}={value!r}: amounts must be finite numbers >= 0; write "
                f"e.g. {{'CPU': 1, 'GPU': 1}}."
            )
    gpu = next((v for k, v in amounts.items() if k in ("GPU", "gpu")), 0)
    if gpu > 1 and float(gpu) != int(gpu):
        raise ValueError(
            f"{where} asks for GPU={gpu:g}: a bundle shares one GPU (below 1) or takes whole "
            f"GPUs; split it into bundles such as {{'GPU': {int(gpu)}}} and "
            f"{{'GPU': {gpu - int(gpu):g}}}."
        )
    try:  # a bundle lists what it asks for: what it leaves out is 0, not Resources' 1 CPU
        return Resources.from_dict({"cpu": 0, **bundle})
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from e


class InsufficientResourcesError(AirflowTrialsError):
    """A trial asks for more than the whole cluster has, or for bundles no node (or no nodes
    together) could hold, so it could never start.

    :param needed: what the trial asks for; None when not known. Default None.
    :param total: everything the Ray cluster has; None when not known. Default None.
    :param nodes: each node's total resources, when the nodes refused it; default None.
    """

    def __init__(
        self,
        message: str,
        needed: Resources | None = None,
        total: Resources | None = None,
        nodes: Sequence[Resources] | None = None,
    ):
        super().__init__(message)
        self.needed = needed
        self.total = total
        self.nodes = None if nodes is None else tuple(nodes)

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (type(self), (str(self), self.needed, self.total, self.nodes))
