"""Search spaces (grid and random) described as JSON, and reproducible config generation."""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Iterator, Mapping
from typing import Any

# A domain is a one-key dict, so a search space is plain JSON (Airflow Params, XCom, the store).
_DOMAINS = ("grid_search", "choice", "uniform", "loguniform", "randint")


def grid_search(values: list[Any]) -> dict[str, list[Any]]:
    """Every value, crossed with every other grid (as Ray Tune's ``tune.grid_search``)."""
    return {"grid_search": list(values)}


def choice(values: list[Any]) -> dict[str, list[Any]]:
    return {"choice": list(values)}


def uniform(lower: float, upper: float) -> dict[str, list[float]]:
    return {"uniform": [lower, upper]}


def loguniform(lower: float, upper: float) -> dict[str, list[float]]:
    return {"loguniform": [lower, upper]}


def randint(lower: int, upper: int) -> dict[str, list[int]]:
    """An integer in ``[lower, upper)``."""
    return {"randint": [lower, upper]}


def _is_domain(value: Any) -> bool:
    return isinstance(value, Mapping) and len(value) == 1 and next(iter(value)) in _DOMAINS


def _walk(space: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    for key, value in space.items():
        path = f"{prefix}{key}"
        if _is_domain(value):
            yield path, value
        elif isinstance(value, Mapping):
            yield from _walk(value, f"{path}.")


def validate_search_space(space: Any) -> None:
    """Raise ValueError naming the key and the fix for anything malformed."""
    if not isinstance(space, Mapping):
        raise ValueError(f"A search space must be a dict of parameter -> value or domain, got {space!r}.")
    for path, domain in _walk(space):
        kind, arg = next(iter(domain.items()))
        where = f"Search space key {path!r} ({kind})"
        if kind in ("grid_search", "choice"):
            if not isinstance(arg, list) or not arg:
                raise ValueError(f"{where} needs a non-empty list of values, got {arg!r}.")
            continue
        if not isinstance(arg, list) or len(arg) != 2 or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in arg
        ):
            raise ValueError(f"{where} needs [lower, upper] numbers, got {arg!r}.")
        lower, upper = arg
        if not (math.isfinite(lower) and math.isfinite(upper)):
            raise ValueError(f"{where} needs finite bounds (not NaN or infinity), got [{lower}, {upper}].")
        if not lower < upper:
            raise ValueError(f"{where} needs lower < upper, got [{lower}, {upper}].")
        if kind == "loguniform" and lower <= 0:
            raise ValueError(f"{where} needs lower > 0 (it samples the logarithm), got {lower}.")
        if kind == "randint" and not (float(lower).is_integer() and float(upper).is_integer()):
            raise ValueError(f"{where} needs whole-number bounds, got [{lower}, {upper}].")
    for key in space:
        if not isinstance(key, str) or not key:
            raise ValueError(f"Search space keys must be non-empty strings, got {key!r}.")


def _sample(kind: str, arg: Any, rng: random.Random) -> Any:
    if kind == "choice":
        return rng.choice(arg)
    lower, upper = arg
    if kind == "uniform":
        return rng.uniform(lower, upper)
    if kind == "loguniform":
        return math.exp(rng.uniform(math.log(lower), math.log(upper)))
    return rng.randrange(int(lower), int(upper))  # randint


def _resolve(space: Mapping[str, Any], grid: Mapping[str, Any], rng: random.Random, prefix: str = "") -> dict[str, Any]:
    config: dict[str, Any] = {}
    for key, value in space.items():
        path = f"{prefix}{key}"
        if _is_domain(value):
            kind, arg = next(iter(value.items()))
            config[key] = grid[path] if kind == "grid_search" else _sample(kind, arg, rng)
        elif isinstance(value, Mapping):
            config[key] = _resolve(value, grid, rng, f"{path}.")
        else:
            config[key] = value
    return config


def count_configs(space: Mapping[str, Any], num_samples: int = 1) -> int:
    """How many configs :func:`generate_configs` makes: every grid combination, ``num_samples`` times."""
    grids = [domain["grid_search"] for _, domain in _walk(space) if "grid_search" in domain]
    return num_samples * math.prod(len(values) for values in grids)


def generate_configs(space: Mapping[str, Any], num_samples: int = 1, seed: int | None = None) -> list[dict[str, Any]]:
    """Ray Tune's variant generation: every grid combination, ``num_samples`` times, with the random
    domains sampled for each config. The same ``seed`` gives the same configs."""
    validate_search_space(space)
    if not isinstance(num_samples, int) or isinstance(num_samples, bool) or num_samples < 1:
        raise ValueError(f"num_samples must be a whole number >= 1, got {num_samples!r}.")
    rng = random.Random(seed)
    grids = [(path, domain["grid_search"]) for path, domain in _walk(space) if "grid_search" in domain]
    combos = list(itertools.product(*(values for _, values in grids))) or [()]
    configs = []
    for _ in range(num_samples):
        for combo in combos:
            configs.append(_resolve(space, dict(zip([p for p, _ in grids], combo, strict=True)), rng))
    return configs
