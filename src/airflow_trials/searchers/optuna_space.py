"""Search spaces as Optuna distributions: flat names for nested keys, and the domains Optuna can
sample."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)

from airflow_trials.core.domains import DOMAINS, quantized_int_indices
from airflow_trials.core.search import validate_search_space

# : Joins nested keys into Optuna's flat parameter names, as Ray Tune does: ``{"a": {"b": ..}}`` ->
# ``a/b``.
SEPARATOR = "/"

OptunaSpace = dict[str, BaseDistribution]
"""Flat parameter name -> the Optuna distribution it is sampled from."""

_PRIMITIVE = (type(None), bool, int, float, str)
_NO_NORMAL = (
    "Optuna has no normal distribution; use uniform(mean - 3 * sd, mean + 3 * sd), or sample it "
    "with generate_configs() and add_trial()"
)
_UNSUPPORTED = {
    "grid_search": (
        "Optuna picks every value itself and does not cross grids; use choice(values) to let it "
        "pick, or generate_configs() and add_trial() to run every combination"
    ),
    "randn": _NO_NORMAL,
    "qrandn": _NO_NORMAL,
    "sample_from": (
        "Optuna draws each value from a distribution and cannot call a function of the config; "
        "compute that value in the trainable from the suggested ones"
    ),
    "qloguniform": (
        "Optuna cannot sample on a log scale with a step; use loguniform(lower, upper) (no step) "
        "or quniform(lower, upper, q) (no log scale)"
    ),
    "qlograndint": (
        "Optuna samples integers on a log scale only with step 1; use lograndint(lower, upper) "
        "or qrandint(lower, upper, q)"
    ),
}


def is_leaf(value: Any) -> bool:
    """A domain (``{"uniform": [0, 1]}``) or an Optuna distribution: one parameter, not a nested
    space."""
    if isinstance(value, BaseDistribution):
        return True
    return isinstance(value, Mapping) and len(value) == 1 and next(iter(value)) in DOMAINS


def leaves(space: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Every value of ``space`` with its flat name; nested dicts are entered, parameters are not."""
    for key, value in space.items():
        if not isinstance(key, str) or SEPARATOR in key:
            raise ValueError(
                f"Search space key {prefix + str(key)!r}: OptunaSearch joins nested keys with "
                f"{SEPARATOR!r}, so a key must be a string without it; rename the key."
            )
        if isinstance(value, Mapping) and value and not is_leaf(value):
            yield from leaves(value, f"{prefix}{key}{SEPARATOR}")
        else:
            yield f"{prefix}{key}", value


def indexed_choices(value: Any) -> list[Any] | None:
    """The values of a ``choice`` Optuna cannot hold (lists, dicts), which it then samples by
    index."""
    if isinstance(value, Mapping) and "choice" in value:
        choices = value["choice"]
        if not all(isinstance(c, _PRIMITIVE) for c in choices):
            return list(choices)
    return None


def to_distribution(path: str, domain: Mapping[str, Any]) -> BaseDistribution:
    """The Optuna distribution of one validated domain; ValueError naming ``path`` if Optuna has
    none."""
    kind, arg = next(iter(domain.items()))
    if kind in _UNSUPPORTED and not (kind == "qlograndint" and arg[2] == 1):
        raise ValueError(f"OptunaSearch cannot search key {path!r} ({kind}): {_UNSUPPORTED[kind]}.")
    if kind == "choice":
        indexed = indexed_choices(domain)
        return CategoricalDistribution(list(range(len(arg))) if indexed is not None else arg)
    if kind in ("uniform", "loguniform"):
        return FloatDistribution(arg[0], arg[1], log=kind == "loguniform")
    if kind == "quniform":
        return FloatDistribution(arg[0], arg[1], step=arg[2])
    if kind in ("randint", "lograndint"):
        return IntDistribution(int(arg[0]), int(arg[1]) - 1, log=kind == "lograndint")
    low, high = quantized_int_indices(*arg)  # qrandint, and qlograndint with q == 1
    q = int(arg[2])
    return IntDistribution(low * q, (high - 1) * q, log=kind == "qlograndint", step=q)


def convert_search_space(space: Mapping[str, Any]) -> OptunaSpace:
    """Ray Tune's ``OptunaSearch.convert_search_space`` for our JSON domains: each domain of
    ``space`` (nested keys joined with ``/``) as its Optuna distribution. An Optuna distribution
    in the space is kept as it is; fixed values are left out. Raises ValueError naming the key for
    a malformed domain or one Optuna cannot sample (``grid_search``, ``randn``,
    ``sample_from``...)."""
    validate_search_space(space, import_functions=False)
    distributions: OptunaSpace = {}
    for path, value in leaves(space):
        if isinstance(value, BaseDistribution):
            distributions[path] = value
        elif is_leaf(value):
            distributions[path] = to_distribution(path, value)
    return distributions


def in_distribution(distribution: BaseDistribution, value: Any) -> bool:
    """Whether ``distribution`` can hold ``value`` (a point to evaluate, or a finished trial's)."""
    if isinstance(distribution, CategoricalDistribution):
        # 1 == True in Python, but a choice of [0, 1] does not hold True.
        return any(
            c == value and isinstance(c, bool) == isinstance(value, bool)
            for c in distribution.choices
        )
    if isinstance(distribution, FloatDistribution | IntDistribution):
        number = isinstance(value, int | float) and not isinstance(value, bool)
        return number and distribution.low <= value <= distribution.high
    return True  # another distribution class: Optuna checks the value itself


def flatten_like(
    point: Mapping[str, Any], space: Mapping[str, Any], prefix: str = ""
) -> dict[str, Any]:
    """``point``'s values by flat name, entering only the dicts that are nested spaces in ``space``
    (a ``choice`` of dicts has dict values that are values, not keys)."""
    flat: dict[str, Any] = {}
    for key, value in point.items():
        sub = space.get(key)
        if isinstance(value, Mapping) and isinstance(sub, Mapping) and sub and not is_leaf(sub):
            flat.update(flatten_like(value, sub, f"{prefix}{key}{SEPARATOR}"))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def leaf_at(space: Mapping[str, Any], path: str) -> Any:
    """The value of ``space`` at the flat name ``path`` (``a/b``)."""
    value: Any = space
    for key in path.split(SEPARATOR):
        value = value[key]
    return value


def flat_point(
    where: str,
    point: Mapping[str, Any],
    space: Mapping[str, Any],
    distributions: Mapping[str, BaseDistribution],
) -> dict[str, Any]:
    """A point as Optuna's flat params, checked against the space's ``distributions``; ``where``
    names the point in messages (``points_to_evaluate[0]``)."""
    fixed = {path for path, _ in leaves(space)} - set(distributions)
    flat: dict[str, Any] = {}
    for path, value in flatten_like(point, space).items():
        here = f"OptunaSearch: {where} key {path!r}"
        distribution = distributions.get(path)
        if distribution is None:
            if path not in fixed:
                raise ValueError(
                    f"{here} is not in the search space (its keys: {sorted(distributions)})."
                )
            continue
        choices = indexed_choices(leaf_at(space, path))
        if choices is not None:
            value = next((i for i, c in enumerate(choices) if c == value), value)
        if not in_distribution(distribution, value):
            raise ValueError(f"{here}: {value!r} is outside its domain {distribution}.")
        flat[path] = value
    return flat
