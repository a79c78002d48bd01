"""Search spaces (grid and random) described as JSON, and reproducible config generation."""

from __future__ import annotations

import copy
import inspect
import itertools
import json
import math
import random
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from airflow_trials.core.domains import (
    DOMAINS,
    LIST_DOMAINS,
    SAMPLE_FROM,
    check_numeric,
    choice,
    grid_search,
    lograndint,
    loguniform,
    qlograndint,
    qloguniform,
    qrandint,
    qrandn,
    quniform,
    randint,
    randn,
    sample,
    sample_from,
    uniform,
)
from airflow_trials.core.imports import import_object, split_import_path

__all__ = [
    "choice",
    "count_configs",
    "drawn_keys",
    "generate_configs",
    "grid_keys",
    "grid_search",
    "lograndint",
    "loguniform",
    "qlograndint",
    "qloguniform",
    "qrandint",
    "qrandn",
    "quniform",
    "randint",
    "randn",
    "sample_from",
    "uniform",
    "validate_search_space",
]

# A sample_from function -> a JSON value, and what it takes: "config, rng", "config" or "" (nothing,
# as Ray Tune's sample_from also allows).
_Function = tuple[Callable[..., Any], str]


def _is_domain(value: Any) -> bool:
    return isinstance(value, Mapping) and len(value) == 1 and next(iter(value)) in DOMAINS


def _walk(space: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    for key, value in space.items():
        path = f"{prefix}{key}"
        if _is_domain(value):
            yield path, value
        elif isinstance(value, Mapping):
            yield from _walk(value, f"{path}.")


def validate_search_space(space: Any, *, import_functions: bool = True) -> None:
    """Raise ValueError naming the key and the fix for anything malformed.

    :param import_functions: also import each ``sample_from`` function and check that it can take
        the config; default True. False checks only the path's form (parsing a DAG file does not
        import user code; ``generate_configs`` imports it before any trial exists).
    """
    if not isinstance(space, Mapping):
        raise ValueError(
            f"A search space must be a dict of parameter -> value or domain, got {space!r}."
        )
    for path, domain in _walk(space):
        kind, arg = next(iter(domain.items()))
        where = f"Search space key {path!r} ({kind})"
        if kind in LIST_DOMAINS:
            if not isinstance(arg, list) or not arg:
                raise ValueError(f"{where} needs a non-empty list of values, got {arg!r}.")
        elif kind == SAMPLE_FROM:
            if import_functions:
                _load_function(where, arg)
            elif split_import_path(arg) is None:
                raise ValueError(
                    f"{where} needs an import path 'package.module:function', got {arg!r}."
                )
        else:
            check_numeric(where, kind, arg)
    for key in space:
        if not isinstance(key, str) or not key:
            raise ValueError(f"Search space keys must be non-empty strings, got {key!r}.")


def _load_function(where: str, path: Any) -> _Function:
    """The ``sample_from`` function at ``path`` and what it takes (see _Function); ValueError if
    unusable."""
    hint = (
        "where the configs are generated (the Airflow worker running suggest_configs, or your "
        "driver)"
    )
    try:
        fn = import_object(path, "sample_from function", ValueError, hint)
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from e
    if inspect.isclass(fn) or not callable(fn):
        raise ValueError(
            f"{where}: {path!r} is {type(fn).__name__} {fn!r}, not a function of the config."
        )
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError) as e:
        raise ValueError(
            f"{where}: cannot read the signature of {path!r} ({e}); wrap it in a def."
        ) from e
    if "rng" in signature.parameters and _binds(signature, {}, rng=None):
        return fn, "config, rng"
    if _binds(signature, {}):
        return fn, "config"
    if _binds(signature):
        return fn, ""
    raise ValueError(
        f"{where}: {path!r} must take the config as its one positional argument, as "
        f"def {getattr(fn, '__name__', 'fn')}(config) or (config, rng), but its signature is "
        f"{signature}."
    )


def _binds(signature: inspect.Signature, *args: Any, **kwargs: Any) -> bool:
    try:
        signature.bind(*args, **kwargs)
    except TypeError:
        return False
    return True


class _Pending:
    """Holds a ``sample_from`` key's place (and so its order) until its function has run."""

    def __init__(self, path: str, function_path: str) -> None:
        self.path = path
        self.function_path = function_path


def _resolve(
    space: Mapping[str, Any], grid: Mapping[str, Any], rng: random.Random, prefix: str = ""
) -> dict[str, Any]:
    config: dict[str, Any] = {}
    for key, value in space.items():
        path = f"{prefix}{key}"
        if _is_domain(value):
            kind, arg = next(iter(value.items()))
            if kind == "grid_search":
                config[key] = grid[path]
            elif kind == SAMPLE_FROM:
                config[key] = _Pending(path, arg)
            else:
                config[key] = sample(kind, arg, rng)
        elif isinstance(value, Mapping):
            config[key] = _resolve(value, grid, rng, f"{path}.")
        else:
            config[key] = value
    return config


def _pending(config: dict[str, Any]) -> Iterator[tuple[dict[str, Any], str, _Pending]]:
    for key, value in config.items():
        if isinstance(value, _Pending):
            yield config, key, value
        elif isinstance(value, dict):
            yield from _pending(value)


def _resolved_so_far(config: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``config`` without the ``sample_from`` keys not run yet: what a function sees."""
    return {
        key: _resolved_so_far(value) if isinstance(value, dict) else copy.deepcopy(value)
        for key, value in config.items()
        if not isinstance(value, _Pending)
    }


def _run_functions(
    config: dict[str, Any], functions: Mapping[str, _Function], rng: random.Random
) -> None:
    """Replace each pending ``sample_from`` key, in the space's order, by its function's value."""
    for parent, key, pending in list(_pending(config)):
        fn, takes = functions[pending.path]
        # One draw per call whatever the function does, so a seed always gives the same configs.
        fn_rng = random.Random(rng.getrandbits(64))
        seen = _resolved_so_far(config)
        where = f"Search space key {pending.path!r} (sample_from {pending.function_path!r})"
        try:
            value = fn(seen, rng=fn_rng) if takes == "config, rng" else fn(seen) if takes else fn()
        except Exception as e:
            raise ValueError(
                f"{where}: the function raised {type(e).__name__}: {e}. It receives the config "
                "with "
                "every other domain sampled, and of the sample_from keys only those before it in "
                "the "
                f"search space (here: {sorted(seen)})."
            ) from e
        try:
            json.dumps(value, allow_nan=True)
        except (TypeError, ValueError) as e:
            raise ValueError(
                f"{where}: the function returned {type(value).__name__} {value!r}, which is not "
                "JSON "
                f"({e}); configs are stored as JSON, so return numbers, strings, lists or dicts."
            ) from e
        parent[key] = value


def grid_keys(space: Mapping[str, Any]) -> list[str]:
    """The keys of ``space`` (nested ones dotted) that are a ``grid_search``."""
    return [path for path, domain in _walk(space) if "grid_search" in domain]


def drawn_keys(space: Mapping[str, Any]) -> list[str]:
    """The keys of ``space`` (nested ones dotted) drawn afresh for each config: every domain but
    ``grid_search``, ``sample_from`` included (its function may draw). Without any, each pass
    over the grid makes the same configs."""
    return [path for path, domain in _walk(space) if "grid_search" not in domain]


def count_configs(space: Mapping[str, Any], num_samples: int = 1) -> int:
    """How many configs :func:`generate_configs` makes: every grid combination, ``num_samples``
    times."""
    grids = [domain["grid_search"] for _, domain in _walk(space) if "grid_search" in domain]
    return num_samples * math.prod(len(values) for values in grids)


def generate_configs(
    space: Mapping[str, Any], num_samples: int = 1, seed: int | None = None
) -> list[dict[str, Any]]:
    """Ray Tune's variant generation: every grid combination, ``num_samples`` times, with the random
    domains sampled for each config, then the ``sample_from`` functions run on it. The same ``seed``
    gives the same configs."""
    validate_search_space(space, import_functions=False)
    if not isinstance(num_samples, int) or isinstance(num_samples, bool) or num_samples < 1:
        raise ValueError(f"num_samples must be a whole number >= 1, got {num_samples!r}.")
    functions = {
        path: _load_function(f"Search space key {path!r} ({SAMPLE_FROM})", domain[SAMPLE_FROM])
        for path, domain in _walk(space)
        if SAMPLE_FROM in domain
    }
    rng = random.Random(seed)
    # The functions draw from a stream of their own, so adding one leaves every other value as it
    # was.
    functions_rng = random.Random(None if seed is None else f"sample_from:{seed}")
    grids = [
        (path, domain["grid_search"]) for path, domain in _walk(space) if "grid_search" in domain
    ]
    combos = list(itertools.product(*(values for _, values in grids))) or [()]
    configs = []
    for _ in range(num_samples):
        for combo in combos:
            config = _resolve(space, dict(zip([p for p, _ in grids], combo, strict=True)), rng)
            _run_functions(config, functions, functions_rng)
            configs.append(config)
    return configs
