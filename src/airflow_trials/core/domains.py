"""The search domains as JSON one-key dicts, each checked and sampled with Ray Tune 2.60's
semantics.

A domain such as ``{"qloguniform": [1e-4, 1e-1, 5e-5]}`` is plain JSON, so a search space travels
through Airflow Params, XCom and the trials DB. Sampling uses a ``random.Random``, so the same
seed gives the same values; the distributions follow ``ray.tune.search.sample``.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from typing import Any

#: Domains whose argument is a list of values.
LIST_DOMAINS = ("grid_search", "choice")
#: Domains whose argument is a list of numbers, with the names of those numbers.
NUMERIC_DOMAINS: dict[str, tuple[str, ...]] = {
    "uniform": ("lower", "upper"),
    "quniform": ("lower", "upper", "q"),
    "loguniform": ("lower", "upper"),
    "qloguniform": ("lower", "upper", "q"),
    "randint": ("lower", "upper"),
    "qrandint": ("lower", "upper", "q"),
    "lograndint": ("lower", "upper"),
    "qlograndint": ("lower", "upper", "q"),
    "randn": ("mean", "sd"),
    "qrandn": ("mean", "sd", "q"),
}
#: The domain whose argument is the import path of a function of the config.
SAMPLE_FROM = "sample_from"
DOMAINS = (*LIST_DOMAINS, *NUMERIC_DOMAINS, SAMPLE_FROM)

_INTEGER_DOMAINS = ("randint", "qrandint", "lograndint", "qlograndint")
_LOG_DOMAINS = ("loguniform", "qloguniform", "lograndint", "qlograndint")


# -- constructors: what a DAG file writes
# -----------------------------------------------------------


def grid_search(values: list[Any]) -> dict[str, list[Any]]:
    """Every value, crossed with every other grid (as Ray Tune's ``tune.grid_search``)."""
    return {"grid_search": list(values)}


def choice(values: list[Any]) -> dict[str, list[Any]]:
    """One of ``values``, each equally likely."""
    return {"choice": list(values)}


def uniform(lower: float, upper: float) -> dict[str, list[float]]:
    """A float in ``[lower, upper)``."""
    return {"uniform": [lower, upper]}


def quniform(lower: float, upper: float, q: float) -> dict[str, list[float]]:
    """A float in ``[lower, upper]`` rounded to a multiple of ``q``; the bounds must be multiples of
    ``q``."""
    return {"quniform": [lower, upper, q]}


def loguniform(lower: float, upper: float) -> dict[str, list[float]]:
    """A float in ``[lower, upper)`` whose logarithm is uniform; ``lower > 0``."""
    return {"loguniform": [lower, upper]}


def qloguniform(lower: float, upper: float, q: float) -> dict[str, list[float]]:
    """:func:`loguniform` rounded to a multiple of ``q`` (upper bound inclusive); bounds multiples
    of ``q``."""
    return {"qloguniform": [lower, upper, q]}


def randint(lower: int, upper: int) -> dict[str, list[int]]:
    """An integer in ``[lower, upper)``."""
    return {"randint": [lower, upper]}


def qrandint(lower: int, upper: int, q: int = 1) -> dict[str, list[int]]:
    """A multiple of ``q`` in ``[lower, upper]``, each equally likely (``upper`` exclusive when ``q
    == 1``)."""
    return {"qrandint": [lower, upper, q]}


def lograndint(lower: int, upper: int) -> dict[str, list[int]]:
    """An integer in ``[lower, upper)`` whose logarithm is uniform; ``lower > 0``."""
    return {"lograndint": [lower, upper]}


def qlograndint(lower: int, upper: int, q: int) -> dict[str, list[int]]:
    """A multiple of ``q`` in ``[lower, upper]`` drawn log-uniformly (``upper`` exclusive when ``q
    == 1``)."""
    return {"qlograndint": [lower, upper, q]}


def randn(mean: float = 0.0, sd: float = 1.0) -> dict[str, list[float]]:
    """A float from the normal distribution with ``mean`` and standard deviation ``sd`` > 0."""
    return {"randn": [mean, sd]}


def qrandn(mean: float, sd: float, q: float) -> dict[str, list[float]]:
    """:func:`randn` rounded to a multiple of ``q``."""
    return {"qrandn": [mean, sd, q]}


def sample_from(function: str) -> dict[str, str]:
    """The value ``function`` returns for the trial's config, as Ray Tune's ``tune.sample_from``.

    :param function: the import path ``"package.module:name"`` of a function taking ``(config)``
        or ``(config, rng)``: ``config`` holds every other value of the trial already sampled
        (grid and random domains, and the ``sample_from`` keys before this one in the space);
        ``rng`` is a ``random.Random`` seeded from the experiment's seed, for reproducible draws.
        Its return value must be JSON. A path, never a lambda: the space stays JSON.
    """
    if not isinstance(function, str):
        raise TypeError(
            "sample_from() takes the import path of a function, such as "
            "'my_pkg.search:batch_size', "
            f"got {type(function).__name__} {function!r}; search spaces are JSON (they travel "
            "through "
            "Airflow Params, XCom and the trials DB), so define the function in a module and pass "
            "its path."
        )
    return {SAMPLE_FROM: function}


# -- validation
# -------------------------------------------------------------------------------------


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _is_multiple(value: float, q: float) -> bool:
    return math.isclose(value / q, round(value / q))  # Ray's divisibility test, rel_tol 1e-9


def _grid_index(bound: float, q: float, round_fn: Callable[[float], float]) -> int:
    """``bound``'s index on the grid of multiples of ``q``, rounded inwards unless it is on it."""
    scaled = bound / q
    nearest = round(scaled)
    return nearest if math.isclose(scaled, nearest) else int(round_fn(scaled))


def check_numeric(where: str, kind: str, arg: Any) -> None:
    """Raise ValueError, prefixed with ``where``, if ``arg`` is not a valid argument of ``kind``."""
    names = NUMERIC_DOMAINS[kind]
    shape = f"[{', '.join(names)}]"
    if not isinstance(arg, list) or len(arg) != len(names) or not all(_is_number(v) for v in arg):
        raise ValueError(f"{where} needs {shape} numbers, got {arg!r}.")
    if not all(math.isfinite(v) for v in arg):
        what = "bounds" if names[0] == "lower" else "values"
        raise ValueError(
            f"{where} needs finite {what} (not NaN or infinity), got {shape} = {arg!r}."
        )
    values = dict(zip(names, arg, strict=True))
    if "q" in values and values["q"] <= 0:
        raise ValueError(f"{where} needs a quantization step q > 0, got {values['q']}.")
    if "sd" in values:
        if values["sd"] <= 0:
            raise ValueError(f"{where} needs a standard deviation sd > 0, got {values['sd']}.")
        return
    _check_bounds(where, kind, values["lower"], values["upper"], values.get("q"))


def _check_bounds(where: str, kind: str, lower: float, upper: float, q: float | None) -> None:
    if not lower < upper:
        raise ValueError(f"{where} needs lower < upper, got [{lower}, {upper}].")
    if kind in _LOG_DOMAINS and lower <= 0:
        raise ValueError(f"{where} needs lower > 0 (it samples the logarithm), got {lower}.")
    if kind in _INTEGER_DOMAINS:
        if not (float(lower).is_integer() and float(upper).is_integer()):
            raise ValueError(f"{where} needs whole-number bounds, got [{lower}, {upper}].")
        if q is None:
            return
        if not float(q).is_integer():
            raise ValueError(
                f"{where} needs a whole-number q >= 1 (its values are integers), got {q}."
            )
        if _grid_index(upper, q, math.floor) < _grid_index(lower, q, math.ceil):
            raise ValueError(
                f"{where} has no multiple of q={q} between {lower} and {upper}; widen the bounds "
                "or lower q."
            )
    elif q is not None:
        for name, bound in (("lower", lower), ("upper", upper)):
            if not _is_multiple(bound, q):
                raise ValueError(
                    f"{where} needs bounds that are multiples of q={q} (as Ray Tune), but {name} "
                    "is "
                    f"{bound}; use {round(bound / q) * q:g} or another q."
                )


# -- sampling
# ---------------------------------------------------------------------------------------


def _log_uniform(rng: random.Random, lower: float, upper: float) -> float:
    return math.exp(rng.uniform(math.log(lower), math.log(upper)))


def _log_randint(rng: random.Random, lower: int, upper: int) -> int:
    """An integer in ``[lower, upper)`` with a uniform logarithm: Ray floors ``exp(uniform(log))``;
    the clamp keeps the bounds where ``exp(log(n))`` rounds to just below or at ``n``."""
    return min(max(math.floor(_log_uniform(rng, lower, upper)), lower), upper - 1)


def quantized_int_indices(lower: float, upper: float, q: float) -> tuple[int, int]:
    """The grid indices ``[low, high)`` of a ``qrandint`` / ``qlograndint``: its values are
    ``index * q``, with the bounds rounded inwards and ``upper`` excluded only when ``q == 1``."""
    return _grid_index(lower, q, math.ceil), _grid_index(upper, q, math.floor) + (
        0 if q == 1 else 1
    )


def _quantized_int(kind: str, lower: float, upper: float, q: float, rng: random.Random) -> int:
    """Ray's quantized Integer domain: the same domain over grid indices, so each multiple of ``q``
    is drawn as the base sampler would draw an integer; upper-exclusive only when ``q == 1``."""
    low, high = quantized_int_indices(lower, upper, q)
    index = _log_randint(rng, low, high) if kind == "qlograndint" else rng.randrange(low, high)
    return int(index * q)


def _quantized_float(kind: str, arg: list[float], rng: random.Random) -> float:
    """Ray's quantized Float domain: sample between the bounds snapped inwards to the grid, then
    round to the nearest multiple of ``q`` (half to even, as ``np.round``), so ``upper`` is
    inclusive."""
    if kind == "qrandn":
        mean, sd, q = arg
        value = rng.normalvariate(mean, sd)
    else:
        lower, upper, q = arg
        low = _grid_index(lower, q, math.ceil) * q
        high = _grid_index(upper, q, math.floor) * q
        value = _log_uniform(rng, low, high) if kind == "qloguniform" else rng.uniform(low, high)
    return float(round(value / q) * q)


def sample(kind: str, arg: Any, rng: random.Random) -> Any:
    """One value of a validated random domain (not ``grid_search`` or ``sample_from``)."""
    if kind == "choice":
        return rng.choice(arg)
    if kind in ("quniform", "qloguniform", "qrandn"):
        return _quantized_float(kind, arg, rng)
    if kind in ("qrandint", "qlograndint"):
        lower, upper, q = arg
        return _quantized_int(kind, lower, upper, q, rng)
    if kind == "randn":
        return rng.normalvariate(*arg)
    lower, upper = arg
    if kind == "uniform":
        return rng.uniform(lower, upper)
    if kind == "loguniform":
        return _log_uniform(rng, lower, upper)
    if kind == "lograndint":
        return _log_randint(rng, int(lower), int(upper))
    return rng.randrange(int(lower), int(upper))  # randint
