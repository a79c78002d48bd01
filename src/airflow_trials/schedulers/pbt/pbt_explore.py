"""PBT's explore step: how a cloned config is perturbed, as Ray Tune 2.60's ``_explore``."""

from __future__ import annotations

import copy
import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from airflow_trials.core import domains
from airflow_trials.core.scheduler import format_number

#: key -> a list of values, a search-space domain, a function of nothing, or a nested Mutations.
Mutations = Mapping[str, Any]
ExploreFn = Callable[[dict[str, Any]], dict[str, Any]]
#: key -> Ray Tune's description of what explore did ("* 1.2", "shift left", "resample"), or nested.
Operations = dict[str, Any]


def _domain_kind(value: Any) -> str | None:
    """The domain's name when ``value`` is one of ours (a one-key dict such as
    ``{"uniform": [0, 1]}``)."""
    if isinstance(value, Mapping) and len(value) == 1:
        kind = next(iter(value))
        if kind in domains.DOMAINS:
            return str(kind)
    return None


def explore(
    config: Mapping[str, Any],
    mutations: Mutations,
    resample_probability: float,
    perturbation_factors: Sequence[float],
    custom_explore_fn: ExploreFn | None,
    rng: random.Random,
) -> tuple[dict[str, Any], Operations]:
    """A perturbed copy of ``config`` and what was done to each key, as Ray Tune's ``_explore``.

    ``rng`` is drawn exactly where Ray draws from the ``random`` module, in the same order, so
    ``random.Random(s)`` gives Ray's configs after ``random.seed(s)``. Only a resample from a
    search-space domain differs: it draws from ``rng`` here, from NumPy's global state in Ray.
    """
    operations: Operations = {}
    new_config = copy.deepcopy(dict(config))
    p, factors = resample_probability, perturbation_factors
    for key, mutation in mutations.items():
        if isinstance(mutation, Mapping) and _domain_kind(mutation) is None:
            new_config[key], operations[key] = explore(config[key], mutation, p, factors, None, rng)
        elif isinstance(mutation, list | tuple):
            new_config[key], operations[key] = _explore_list(config[key], mutation, p, rng)
        else:
            new_config[key], operations[key] = _explore_number(
                config[key], mutation, p, factors, rng
            )
    if custom_explore_fn is None:
        return new_config, operations
    explored = custom_explore_fn(new_config)
    if explored is None:
        raise ValueError(
            "PopulationBasedTraining's custom_explore_fn returned None; it must return the config "
            "it was given, changed as needed."
        )
    return explored, operations


def _explore_list(
    value: Any, values: Sequence[Any], p: float, rng: random.Random
) -> tuple[Any, str]:
    # The draw comes first even when the value is not in the list: Ray's `or` evaluates it first.
    if rng.random() < p or value not in values:
        return rng.choice(values), "resample"
    shift = rng.choice([-1, 1])
    old = values.index(value)
    new = min(max(old + shift, 0), len(values) - 1)
    side = "left" if shift == -1 else "right"
    return values[new], f"shift {side}{' (noop)' if old == new else ''}"


def _explore_number(
    value: Any, mutation: Any, p: float, factors: Sequence[float], rng: random.Random
) -> tuple[Any, str]:
    if rng.random() < p:
        new, operation = _resample(mutation, rng), "resample"
    else:
        factor = rng.choice(factors)
        new, operation = value * factor, f"* {factor}"
    # A bool stays a bool and an int (batch_size) is rounded back, as Ray does.
    if isinstance(value, bool):
        new = bool(new)
    elif isinstance(value, int):
        new = int(round(new))
    return new, operation


def _resample(mutation: Any, rng: random.Random) -> Any:
    kind = _domain_kind(mutation)
    if kind is not None:
        return domains.sample(kind, mutation[kind], rng)
    if isinstance(mutation, list | tuple):
        return rng.choice(mutation)
    return mutation()


def fill_missing(config: dict[str, Any], mutations: Mutations, rng: random.Random) -> None:
    """Sample the keys ``config`` lacks from their mutations, as Ray Tune does on a trial's
    start."""
    for key, mutation in mutations.items():
        if isinstance(mutation, Mapping) and _domain_kind(mutation) is None:
            fill_missing(config.setdefault(key, {}), mutation, rng)
        elif key not in config:
            config[key] = _resample(mutation, rng)


def check_mutations(mutations: Any, path: str = "") -> None:
    """Raise a TypeError or ValueError naming the first hyperparam_mutations entry PBT cannot
    use."""
    name = "PopulationBasedTraining"
    use = "a list, a domain (e.g. uniform(0, 1)), a function of no arguments or a nested dict"
    if not isinstance(mutations, Mapping):
        raise TypeError(
            f"{name} got hyperparam_mutations{path} = {mutations!r}; give a dict of key -> {use}."
        )
    for key, mutation in mutations.items():
        where = f"{name} got hyperparam_mutations{path}[{key!r}] = {mutation!r}"
        kind = _domain_kind(mutation)
        if kind in (domains.SAMPLE_FROM, "grid_search"):
            raise ValueError(
                f"{where}: {kind} cannot be resampled or perturbed (Ray Tune refuses it too); "
                f"use a list of values or a domain such as uniform."
            )
        if kind == "choice" and not (isinstance(mutation[kind], list) and mutation[kind]):
            raise ValueError(f"{where}: choice needs a non-empty list of values.")
        if kind in domains.NUMERIC_DOMAINS:
            domains.check_numeric(where, str(kind), mutation[kind])
        elif kind is None and isinstance(mutation, Mapping):
            check_mutations(mutation, f"{path}[{key!r}]")
        elif isinstance(mutation, list | tuple) and not mutation:
            raise ValueError(
                f"{where}: an empty list has no value to resample or shift to; list the values "
                f"the key may take, or leave the key out."
            )
        elif kind is None and not isinstance(mutation, list | tuple) and not callable(mutation):
            raise TypeError(f"{where}, of type {type(mutation).__name__}; use {use}.")


def describe_changes(
    old: Mapping[str, Any], new: Mapping[str, Any], operations: Operations, prefix: str = ""
) -> list[tuple[str, Any, str]]:
    """``(dotted key, new value, what was done)`` per explored key; a factor shows the old value."""
    changes: list[tuple[str, Any, str]] = []
    for key, operation in operations.items():
        if isinstance(operation, dict):
            changes += describe_changes(
                old.get(key, {}), new.get(key, {}), operation, f"{prefix}{key}."
            )
        elif operation.startswith("* "):
            shown = f"{show_value(old.get(key))} {operation}"
            changes.append((f"{prefix}{key}", new.get(key), shown))
        else:
            changes.append((f"{prefix}{key}", new.get(key), operation))
    return changes


def show_value(value: Any) -> str:
    """A config value as a PBT decision reason shows it: numbers compact, strings quoted."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return format_number(value)
    return repr(value) if isinstance(value, str) else str(value)
