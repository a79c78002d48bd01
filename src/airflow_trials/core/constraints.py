"""Constraints on a trial's reported metrics (``"latency <= 5.0"``): parsed once, checked the same
way by the searcher and by every reader.

A constraint is a string, so that an experiment's constraints are plain JSON: a result key,
``<=`` or ``>=``, and a finite number. A trial is feasible when its last result meets every one::

    from airflow_trials.core.constraints import Constraints

    constraints = Constraints.parse(["latency <= 5.0", "size <= 1e6"])
    constraints.values({"latency": 7.0, "size": 2e5})      # [2.0, -800000.0]: > 0 is violated
    constraints.violations({"latency": 7.0, "size": 2e5})  # {'latency <= 5.0': 2.0}
    constraints.feasible({"latency": 4.0, "size": 2e5})    # True

:meth:`Constraints.values` follows Optuna's convention (``Trial.set_constraint``): a value of 0
or less is met, a positive value is by how much it is missed, so ``OptunaSearch`` hands them to
the sampler as they are.
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

OPERATORS = ("<=", ">=")

_SPELLING = re.compile(r"^\s*(?P<metric>[A-Za-z_][\w./:-]*)\s*(?P<op><=|>=)\s*(?P<bound>\S+)\s*$")
_EXAMPLE = "constraints=['latency <= 5.0', 'val_acc >= 0.8']"


@dataclass(frozen=True)
class Constraint:
    """One constraint: ``metric`` ``op`` ``bound``.

    :param metric: the result key it bounds.
    :param op: ``"<="`` (the metric must be at most ``bound``) or ``">="`` (at least).
    :param bound: a finite number.
    """

    metric: str
    op: str
    bound: float

    @property
    def key(self) -> str:
        """Its canonical spelling (``"latency <= 5.0"``): its name in messages, in Optuna's
        ``FrozenTrial.constraints`` and in :meth:`Constraints.violations`."""
        return f"{self.metric} {self.op} {self.bound!r}"

    def value(self, result: Mapping[str, Any]) -> float | None:
        """By how much ``result`` misses it (> 0), or how far inside it is (<= 0); None when the
        result has no finite number for the metric."""
        reported = _number(result.get(self.metric))
        if reported is None:
            return None
        return reported - self.bound if self.op == "<=" else self.bound - reported


class Constraints(Sequence[Constraint]):
    """The constraints of an experiment, in the order given; a sequence of :class:`Constraint`.

    Build it with :meth:`parse`; :attr:`spec` gives the strings back (canonical), to store or to
    serialise.

    :param constraints: the parsed constraints; default none (every result is feasible).
    """

    def __init__(self, constraints: Sequence[Constraint] = ()) -> None:
        self._constraints = list(constraints)

    @classmethod
    def parse(
        cls, spec: Sequence[str] | Constraints | None, owner: str = "constraints"
    ) -> Constraints:
        """The constraints spelt in ``spec``: a list of strings ``"<metric> <= <number>"`` or
        ``"<metric> >= <number>"``; None or an empty list: none.

        :param owner: names the caller in messages (``"OptunaSearch"``).
        :raises ValueError: naming the string that is wrong and how to write it.
        """
        if spec is None:
            return cls()
        if isinstance(spec, Constraints):
            return spec
        if isinstance(spec, str) or not isinstance(spec, Sequence):
            raise ValueError(
                f"{owner}: constraints={spec!r} is not a list of strings; give a list, one "
                f"constraint each, e.g. {_EXAMPLE}."
            )
        parsed = [_parse_one(owner, i, text) for i, text in enumerate(spec)]
        keys = [c.key for c in parsed]
        twice = sorted({k for k in keys if keys.count(k) > 1})
        if twice:
            raise ValueError(
                f"{owner}: constraints={list(spec)!r} gives {', '.join(map(repr, twice))} more "
                "than once; give each constraint once."
            )
        return cls(parsed)

    # -- Sequence ----------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._constraints)

    def __getitem__(self, index: int) -> Constraint:  # type: ignore[override]
        return self._constraints[index]

    def __iter__(self) -> Iterator[Constraint]:
        return iter(self._constraints)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Constraints) and self._constraints == other._constraints

    def __hash__(self) -> int:
        return hash(tuple(self._constraints))

    def __repr__(self) -> str:
        return f"Constraints({self.spec!r})"

    @property
    def spec(self) -> list[str]:
        """The constraints as strings (canonical), which :meth:`parse` reads back."""
        return [c.key for c in self._constraints]

    @property
    def metrics(self) -> list[str]:
        """The result keys they bound, each once, in order."""
        return list(dict.fromkeys(c.metric for c in self._constraints))

    def values(self, result: Mapping[str, Any]) -> list[float]:
        """One value per constraint, in Optuna's convention: <= 0 met, > 0 missed by that much. A
        result without a finite number for a metric misses its constraint by ``inf``."""
        values = [c.value(result) for c in self._constraints]
        return [math.inf if v is None else v for v in values]

    def missing(self, result: Mapping[str, Any]) -> list[str]:
        """The metrics the constraints bound that ``result`` has no finite number for."""
        return [m for m in self.metrics if _number(result.get(m)) is None]

    def violations(self, result: Mapping[str, Any]) -> dict[str, float]:
        """The constraints ``result`` misses, each with by how much (``inf``: the metric is not
        reported as a finite number); empty when it is feasible."""
        return {
            c.key: value
            for c, value in zip(self._constraints, self.values(result), strict=True)
            if value > 0
        }

    def feasible(self, result: Mapping[str, Any] | None) -> bool:
        """Does ``result`` meet every constraint? A result that does not report a bounded metric
        (or None: no result) is not known to, so it is not feasible; with no constraints every
        result is."""
        if not self._constraints:
            return True
        return result is not None and not self.violations(result)

    def total_violation(self, result: Mapping[str, Any]) -> float:
        """The sum of the amounts by which ``result`` misses its constraints (0 when feasible), as
        Optuna ranks infeasible trials."""
        return sum(self.violations(result).values())


def _parse_one(owner: str, index: int, text: Any) -> Constraint:
    where = f"{owner}: constraints[{index}]={text!r}"
    if not isinstance(text, str):
        raise ValueError(
            f"{where} is not a string; write each constraint as '<metric> <= <number>' or "
            f"'<metric> >= <number>', e.g. {_EXAMPLE}."
        )
    match = _SPELLING.match(text)
    if match is None:
        raise ValueError(
            f"{where} is not '<metric> <= <number>' or '<metric> >= <number>'; write a result "
            f"key, then <= or >= (not <, >, == or !=), then a number, e.g. {_EXAMPLE}."
        )
    try:
        bound = float(match["bound"])
    except ValueError as e:
        raise ValueError(
            f"{where}: {match['bound']!r} is not a number; write the bound as a number such as "
            f"5.0 or 1e6, e.g. {_EXAMPLE}."
        ) from e
    if not math.isfinite(bound):
        raise ValueError(f"{where}: the bound must be a finite number, not {match['bound']!r}.")
    return Constraint(match["metric"], match["op"], bound)


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def constrained_ranks(
    rows: Sequence[Sequence[Any]],
    modes: Sequence[str],
    feasible: Sequence[bool],
    *,
    finite_only: bool = True,
) -> list[int | None]:
    """:func:`~airflow_trials.core.pareto.pareto_ranks` with feasibility first, as Optuna's
    constrained domination: the feasible rows are ranked among themselves (rank 0 is their
    front), and the infeasible ones among themselves after the last feasible rank, so no
    infeasible row is on the front while a feasible one is ranked. With no feasible row the
    infeasible rows' front is rank 0.

    :param rows: one sequence of values per row, in the order of ``modes``.
    :param modes: ``"min"`` or ``"max"``, one per metric.
    :param feasible: one flag per row.
    """
    from airflow_trials.core.pareto import pareto_ranks

    if len(feasible) != len(rows):
        raise ValueError(
            f"constrained_ranks: {len(rows)} rows but {len(feasible)} feasibility flags; give "
            "one flag per row."
        )
    ranks: list[int | None] = [None] * len(rows)
    offset = 0
    for wanted in (True, False):
        chosen = [i for i, ok in enumerate(feasible) if bool(ok) is wanted]
        group = pareto_ranks([rows[i] for i in chosen], modes, finite_only=finite_only)
        for i, rank in zip(chosen, group, strict=True):
            ranks[i] = None if rank is None else rank + offset
        offset = max((r for r in group if r is not None), default=-1) + 1 + offset
    return ranks


#: The statuses whose trials count for a run's best trial and its Pareto front, on every screen
#: (docs/store.md, "Which trials count"): a trial that ended TERMINATED. One that failed (ERROR)
#: or has not ended (PENDING, RUNNING, PAUSED) is listed, but is neither best nor on the front.
COUNTED_STATUSES = frozenset({"TERMINATED"})

#: Every status: what a reader that ranks every trial counts (Ray Tune's
#: ``ResultGrid.get_best_result`` default, ``terminated_only=False``).
EVERY_STATUS = frozenset({"PENDING", "RUNNING", "PAUSED", "TERMINATED", "ERROR"})


def is_counted(status: Any, counted: Collection[str] = COUNTED_STATUSES) -> bool:
    """Does a trial of ``status`` (a ``TrialStatus`` or its value) count for the best trial and
    the front (``counted``: default :data:`COUNTED_STATUSES`, the rule every screen follows)?"""
    return str(getattr(status, "value", status)) in counted


def counted_values(statuses: Sequence[Any], values: Sequence[float | None]) -> list[float | None]:
    """Each value whose trial's status :func:`is_counted`; None (as a trial without one) for the
    others: what the hyperparameter importances are computed from, as Optuna's
    ``optuna.importance`` takes the COMPLETE trials only."""
    return [
        value if is_counted(status) else None
        for status, value in zip(statuses, values, strict=True)
    ]


def front_ranks(
    rows: Sequence[Sequence[Any]],
    modes: Sequence[str],
    statuses: Sequence[Any],
    feasible: Sequence[bool] | None = None,
    *,
    finite_only: bool = True,
    counted: Collection[str] = COUNTED_STATUSES,
) -> list[int | None]:
    """The Pareto rank of each row, as every front reads it (``select_best``, the boards,
    ``ResultGrid``): the rows whose status :func:`is_counted` are ranked, feasible first with
    ``feasible`` (:func:`constrained_ranks`); the others have no rank (None).

    :param rows: one sequence of values per row, in the order of ``modes``.
    :param modes: ``"min"`` or ``"max"``, one per metric.
    :param statuses: one status per row.
    :param feasible: one flag per row; None: no constraints.
    :param counted: the statuses that count; default :data:`COUNTED_STATUSES`.
    """
    from airflow_trials.core.pareto import pareto_ranks

    if len(statuses) != len(rows):
        raise ValueError(
            f"front_ranks: {len(rows)} rows but {len(statuses)} statuses; give one status per row."
        )
    chosen = [i for i, status in enumerate(statuses) if is_counted(status, counted)]
    picked = [rows[i] for i in chosen]
    if feasible is None:
        ranked = pareto_ranks(picked, modes, finite_only=finite_only)
    else:
        flags = [feasible[i] for i in chosen]
        ranked = constrained_ranks(picked, modes, flags, finite_only=finite_only)
    ranks: list[int | None] = [None] * len(rows)
    for i, rank in zip(chosen, ranked, strict=True):
        ranks[i] = rank
    return ranks
