"""Hyperparameter importances, the pure part: a run's trial configs and values as the parameters,
distributions and points an importance evaluator reads, and the ranking it gives back.

Optuna's evaluators (:mod:`~airflow_trials.searchers.optuna_importances`) need each parameter's
distribution. Where the run recorded its search space, a parameter's domain gives it (its kind,
bounds and log scale, as ``OptunaSearch`` would sample it); elsewhere it is inferred from the
values the trials took: numbers spanning at least two powers of ten, all positive, on a log
scale; strings, booleans and anything else as categories. Nested configs are flattened with
``/`` as Ray Tune flattens them. Keys every trial shares one value of are left out (they explain
nothing), and so are trials without a finite value of the metric (they failed, or have not
reported it yet); both are counted.

Example::

    data = prepare_importances(
        [{"lr": 0.1, "layers": 2}, {"lr": 0.01, "layers": 4}, {"lr": 0.001, "layers": 2}],
        [0.9, 0.5, None],
        metric="loss",
        mode="min",
        subject="run manual__1 (id 3) of experiment mnist",
    )
    data.num_trials, data.num_skipped, sorted(data.params)   # 2, 1, ['layers', 'lr']
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from airflow_trials.core.domains import DOMAINS
from airflow_trials.exceptions import AirflowTrialsError

#: The evaluators: PED-ANOVA (Optuna's default; numpy only) and fANOVA (a random forest;
#: scikit-learn).
EVALUATORS = ("ped-anova", "fanova")
DEFAULT_EVALUATOR = "ped-anova"
#: The fewest trials with a value of the metric that importances are computed from.
MIN_TRIALS = 2
#: Joins nested config keys, as Ray Tune and OptunaSearch do: ``{"a": {"b": 1}}`` -> ``a/b``.
SEPARATOR = "/"
# Without a recorded domain, only positive numbers whose largest is at least this many times their
# smallest may be read on a log scale (a learning rate from 1e-4 to 1e-1; not layers 1..8).
_LOG_RATIO = 100.0
_FLOAT_DOMAINS = {"uniform": False, "quniform": False, "loguniform": True, "qloguniform": True}
_INT_DOMAINS = {"randint": False, "qrandint": False, "lograndint": True, "qlograndint": True}
_UPPER_EXCLUSIVE = ("randint", "lograndint")  # Ray Tune's randint(lower, upper) never gives upper
_CATEGORY_DOMAINS = ("choice", "grid_search")

Kind = Literal["float", "int", "categorical"]


class ImportancesError(AirflowTrialsError):
    """Hyperparameter importances cannot be computed; the message says why and what to do."""


class NotEnoughTrialsError(ImportancesError, ValueError):
    """Too few trials with a value of the metric, no hyperparameter that varies among them, or
    one value for all of them: there is nothing for an importance to explain yet."""


class EvaluatorUnavailableError(ImportancesError):
    """The evaluator asked for needs a package that is not installed (fANOVA: scikit-learn)."""


@dataclass(frozen=True)
class ParamSpec:
    """The distribution a hyperparameter is evaluated on, as plain values.

    :param name: the flat name (nested keys joined with ``/``).
    :param kind: ``"float"``, ``"int"`` or ``"categorical"``.
    :param low: the smallest value (numbers); None for categories.
    :param high: the largest value (numbers); None for categories.
    :param log: evaluated on a log scale; default False.
    :param choices: the categories, in a stable order; default none (numbers).
    :param from_search_space: the run's recorded search space gave it; False: inferred from the
        values. Default False.
    :param json_choices: the choices are the JSON text of values of several types (1, True and
        "1", which Optuna would confuse); a trial's value is then its JSON text. Default False.
    """

    name: str
    kind: Kind
    low: float | None = None
    high: float | None = None
    log: bool = False
    choices: tuple[Any, ...] = ()
    from_search_space: bool = False
    json_choices: bool = False


@dataclass(frozen=True)
class ImportanceInput:
    """What an evaluator reads: the varying parameters and one point per usable trial.

    :param subject: what the importances are of, for messages ("run r1 (id 3) of experiment m").
    :param metric: the metric the values are of.
    :param mode: ``"min"`` or ``"max"``.
    :param params: name -> distribution of each parameter that varies, by name.
    :param points: per usable trial, its trial id, its values of the varying parameters (a
        trial may lack one: a conditional parameter) and its value of the metric.
    :param num_skipped: trials left out for having no finite value of the metric.
    :param constant: the keys left out because every usable trial has the same value.
    """

    subject: str
    metric: str
    mode: str
    params: dict[str, ParamSpec]
    points: list[tuple[str, dict[str, Any], float]]
    num_skipped: int
    constant: list[str] = field(default_factory=list)

    @property
    def num_trials(self) -> int:
        """The trials the importances are computed from."""
        return len(self.points)


@dataclass(frozen=True)
class ParamImportance:
    """One hyperparameter's share of the importance (the shares sum to 1).

    :param name: the flat parameter name.
    :param importance: its share, 0 to 1.
    :param spec: the distribution it was evaluated on.
    """

    name: str
    importance: float
    spec: ParamSpec


@dataclass(frozen=True)
class Importances:
    """The hyperparameter importances of one metric of a run, most important first.

    :param subject: what they are of ("run r1 (id 3) of experiment m").
    :param metric: the metric.
    :param mode: ``"min"`` or ``"max"``.
    :param evaluator: ``"ped-anova"`` or ``"fanova"``.
    :param params: the parameters, most important first (ties by name).
    :param num_trials: trials they were computed from.
    :param num_skipped: trials left out for having no value of the metric.
    :param constant: config keys left out because all those trials share one value.
    :param notes: what the evaluator warned about (few trials, parameters it left out).
    """

    subject: str
    metric: str
    mode: str
    evaluator: str
    params: list[ParamImportance]
    num_trials: int
    num_skipped: int
    constant: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def check_evaluator(name: str) -> str:
    """``name`` if it is one of :data:`EVALUATORS`, else a ValueError that lists them."""
    if name not in EVALUATORS:
        raise ValueError(
            f"Unknown importance evaluator {name!r}; use one of {', '.join(EVALUATORS)} "
            f"(default {DEFAULT_EVALUATOR})."
        )
    return name


def flatten_config(
    config: Mapping[str, Any], search_space: Mapping[str, Any] | None = None, prefix: str = ""
) -> dict[str, Any]:
    """The config's values by flat name (``a/b``). A nested dict is entered unless the search
    space says its key is a domain (a ``choice`` of dicts takes dicts as values)."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        sub = search_space.get(key) if isinstance(search_space, Mapping) else None
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value and not _is_domain(sub):
            flat.update(
                flatten_config(value, sub if isinstance(sub, Mapping) else None, name + SEPARATOR)
            )
        else:
            flat[name] = value
    return flat


def flat_domains(search_space: Any, prefix: str = "") -> dict[str, tuple[str, Any]]:
    """Each domain of a recorded search space by flat name: ``(kind, argument)``. Anything else
    (fixed values, a malformed entry) is left out: the values then decide."""
    if not isinstance(search_space, Mapping):
        return {}
    found: dict[str, tuple[str, Any]] = {}
    for key, value in search_space.items():
        name = f"{prefix}{key}"
        if _is_domain(value):
            kind, arg = next(iter(value.items()))
            found[name] = (kind, arg)
        elif isinstance(value, Mapping):
            found.update(flat_domains(value, name + SEPARATOR))
    return found


def prepare_importances(
    configs: Sequence[Mapping[str, Any]],
    values: Sequence[float | None],
    *,
    metric: str,
    mode: str,
    subject: str,
    search_space: Any = None,
    trial_ids: Sequence[str] | None = None,
) -> ImportanceInput:
    """The parameters, distributions and points of the trials' importances.

    :param configs: each trial's config.
    :param values: each trial's value of the metric, in the order of ``configs`` (its best, as
        the leaderboard ranks it); None or a non-finite value: the trial is skipped.
    :param metric: the metric, for messages.
    :param mode: ``"min"`` or ``"max"``.
    :param subject: what they are of, for messages ("run r1 (id 3) of experiment mnist").
    :param search_space: the run's recorded search space; default None (inferred from values).
    :param trial_ids: each trial's id; default ``trial-<index>``.
    :raises NotEnoughTrialsError: fewer than :data:`MIN_TRIALS` trials with a value, no key that
        varies among them, or one value of the metric for all of them.
    """
    if len(configs) != len(values):
        raise ValueError(f"{len(configs)} configs but {len(values)} values; pass one per trial.")
    if mode not in ("min", "max"):
        raise ValueError(f"mode must be 'min' or 'max', got {mode!r}.")
    ids = list(trial_ids) if trial_ids is not None else [f"trial-{i}" for i in range(len(configs))]
    domains = flat_domains(search_space)
    space = search_space if isinstance(search_space, Mapping) else None
    usable = [
        (trial_id, flatten_config(config or {}, space), float(value))
        for trial_id, config, value in zip(ids, configs, values, strict=True)
        if value is not None and _is_finite_number(value)
    ]
    total = len(configs)
    skipped = total - len(usable)
    where = f"Cannot compute the hyperparameter importances of {metric} for {subject}"
    if len(usable) < MIN_TRIALS:
        raise NotEnoughTrialsError(
            f"{where}: {len(usable)} of its {total} trials reported {metric} as a number and "
            f"ended TERMINATED ({skipped} without it: failed, not ended, or not reported yet), "
            f"and the importances need at least {MIN_TRIALS}. Wait for more trials to report "
            f"{metric} and end, or pick a metric they report."
        )
    params, constant = _params_and_constant(usable, domains)
    if not params:
        shared = f" ({', '.join(constant)} the same in each)" if constant else ""
        raise NotEnoughTrialsError(
            f"{where}: no hyperparameter varies among its {len(usable)} trials that reported "
            f"{metric}{shared}, so there is nothing to rank. Importances need trials whose configs "
            "differ: a search space with at least one domain."
        )
    _refuse_one_value(where, metric, [value for _, _, value in usable])
    points = [
        (trial_id, {k: _as_param(params[k], v) for k, v in flat.items() if k in params}, value)
        for trial_id, flat, value in usable
    ]
    return ImportanceInput(subject, metric, mode, params, points, skipped, constant)


def _params_and_constant(
    usable: Sequence[tuple[str, Mapping[str, Any], float]], domains: Mapping[str, Any]
) -> tuple[dict[str, ParamSpec], list[str]]:
    """Each key's parameter over the trials' values, by key; and the keys with one value in
    every trial, which no importance can rank."""
    by_key: dict[str, list[Any]] = {}
    for _, flat, _ in usable:
        for key, value in flat.items():
            by_key.setdefault(key, []).append(value)
    params: dict[str, ParamSpec] = {}
    constant: list[str] = []
    for key in sorted(by_key):
        spec = _spec(key, by_key[key], domains.get(key))
        if spec is None:
            constant.append(key)
        else:
            params[key] = spec
    return params, constant


def _refuse_one_value(where: str, metric: str, values: Sequence[float]) -> None:
    """NotEnoughTrialsError when every trial has the same value: no hyperparameter mattered."""
    first = values[0]
    if all(value == first for value in values):
        raise NotEnoughTrialsError(
            f"{where}: all {len(values)} of its trials that reported {metric} have the same "
            f"value ({first:.6g}), so no hyperparameter made a difference. Wait for more trials, "
            "or pick a metric that differs between them."
        )


def ranked(found: Mapping[str, float], data: ImportanceInput) -> list[ParamImportance]:
    """An evaluator's importances (name -> share) as :class:`ParamImportance`, most important
    first, ties by name."""
    rows = [ParamImportance(name, float(share), data.params[name]) for name, share in found.items()]
    return sorted(rows, key=lambda r: (-r.importance, r.name))


# -- the distribution of one parameter ----------------------------------------------------------


def _is_domain(value: Any) -> bool:
    return isinstance(value, Mapping) and len(value) == 1 and next(iter(value)) in DOMAINS


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _is_finite_number(value: Any) -> bool:
    return _is_number(value) and math.isfinite(value)


def _category(value: Any) -> Any:
    """A value Optuna can hold as a category: None, bool, int, float or str (others as JSON)."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    return json.dumps(value, sort_keys=True, default=str)


def _as_param(spec: ParamSpec, value: Any) -> Any:
    """A trial's value as the distribution holds it."""
    if spec.kind == "float":
        return float(value)
    if spec.kind == "int":
        return int(value)
    category = _category(value)
    return json.dumps(category, sort_keys=True) if spec.json_choices else category


def _spec(name: str, values: list[Any], domain: tuple[str, Any] | None) -> ParamSpec | None:
    """The parameter's distribution; None when every trial has the same value (a constant)."""
    listed = domain[1] if domain is not None and domain[0] in _CATEGORY_DOMAINS else None
    if all(_is_finite_number(v) for v in values):
        if min(values) == max(values):
            return None
        spec = _numeric_domain(name, values, *domain) if domain is not None else None
        if spec is not None or listed is not None:
            return spec or _categorical(name, values, listed)
        integers = all(isinstance(v, int) for v in values)
        return ParamSpec(
            name, "int" if integers else "float", min(values), max(values), _looks_log(values)
        )
    return _categorical(name, values, listed)


def _looks_log(values: list[float]) -> bool:
    """Whether numbers without a recorded domain were drawn on a log scale: all positive,
    spanning at least :data:`_LOG_RATIO`, and their median nearer the middle of the range on a
    log scale than on a linear one (loguniform(1e-4, 1e-1) has its median near 3e-3; a
    uniform(0, 1) whose smallest draw is 0.001 has its median near 0.5)."""
    low, high = min(values), max(values)
    if low <= 0 or high / low < _LOG_RATIO:
        return False
    ordered = sorted(values)
    middle = len(ordered) // 2
    median = (ordered[middle] + ordered[~middle]) / 2
    on_line = (median - low) / (high - low)
    on_log = math.log(median / low) / math.log(high / low)
    return abs(on_log - 0.5) < abs(on_line - 0.5)


def _numeric_domain(name: str, values: list[Any], kind: str, arg: Any) -> ParamSpec | None:
    """The distribution a numeric domain gives, widened to the values the trials took (a trial
    started by hand may lie outside it); None when the domain is not a numeric one."""
    if kind not in _FLOAT_DOMAINS and kind not in _INT_DOMAINS:
        return None  # randn, sample_from, choice of numbers...: the values decide
    if not (isinstance(arg, list | tuple) and len(arg) >= 2 and all(_is_number(a) for a in arg)):
        return None
    lower, upper = float(arg[0]), float(arg[1])
    integers = kind in _INT_DOMAINS and all(isinstance(v, int) for v in values)
    if kind in _INT_DOMAINS and integers:
        if kind in _UPPER_EXCLUSIVE:
            upper -= 1
        low, high = min(int(lower), *values), max(int(upper), *values)
        log = _INT_DOMAINS[kind] and low >= 1
        return ParamSpec(name, "int", low, high, log, from_search_space=True)
    low_f, high_f = min(lower, *values), max(upper, *values)
    log = (_FLOAT_DOMAINS.get(kind) or _INT_DOMAINS.get(kind, False)) and low_f > 0
    return ParamSpec(name, "float", low_f, high_f, bool(log), from_search_space=True)


def _categorical(name: str, values: list[Any], choices: Any) -> ParamSpec | None:
    """Categories: the domain's choices in their order, then the other values taken; None when
    the trials took one value. Values of several types (1, True and "1") become their JSON text,
    as Optuna would confuse 1 and True."""
    # Categories are hashable; their type keeps 1, 1.0 and True apart.
    taken = {(type(c).__name__, c) for c in map(_category, values)}
    if len(taken) < 2:
        return None
    listed = [_category(c) for c in choices] if isinstance(choices, list | tuple) else []
    ordered: list[Any] = []
    seen: set[tuple[str, Any]] = set()
    for value in [*listed, *sorted((c for _, c in taken), key=_sort_key)]:
        key = (type(value).__name__, value)
        if key not in seen:
            seen.add(key)
            ordered.append(value)
    mixed = len({type(v) for v in ordered}) > 1
    if mixed:
        ordered = [json.dumps(v, sort_keys=True) for v in ordered]
    return ParamSpec(
        name,
        "categorical",
        choices=tuple(ordered),
        from_search_space=bool(listed),
        json_choices=mixed,
    )


def _sort_key(value: Any) -> tuple[str, str]:
    return type(value).__name__, json.dumps(value, sort_keys=True)
