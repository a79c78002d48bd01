"""Choosing one trial among the trade-offs of several metrics: ``select_best``'s ``pick``.

With several metrics there is no single best trial, only a Pareto front (the trials no other
trial beats on every metric). A ``pick`` says which trial to hand on. It is a plain dict, so it
can be written in a DAG file, sent in a DAG run's conf, and recorded in XCom and an Asset event:

- ``{"weights": {"val_acc": 1.0, "latency": -0.01}}``: the trial of the front with the highest
  weighted sum of its values (``1.0 * val_acc - 0.01 * latency``). A higher sum wins, so a
  metric to maximise gets a weight >= 0 and one to minimise a weight <= 0; a metric left out
  weighs 0.
- ``{"metric": "val_acc", "bounds": {"latency": [None, 5.0]}}``: the trial with the best
  ``val_acc`` (in its mode) among the finished trials whose values lie within the bounds
  (``[low, high]``, inclusive, None for no bound). ``bounds`` may be left out.
- No pick: ``{"metric": <the first metric>}``, the front's best trial on the first metric.

Ties go to the lower Pareto rank, then to the smaller trial id, so a pick always chooses the
same trial from the same results.

Example::

    pick = Pick.of("Experiment mnist", {"metric": "val_acc", "bounds": {"latency": [None, 5]}},
                   ["val_acc", "latency"], ["max", "min"])
    candidates = rank_trials({"t0": {"val_acc": 0.9, "latency": 9.0},
                              "t1": {"val_acc": 0.8, "latency": 4.0}}, pick.metrics, pick.modes)
    pick.choose(candidates).trial_id   # "t1": t0 is better but over the latency bound
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

from airflow_trials.core.pareto import pareto_ranks

#: A pick as written: ``{"weights": {...}}`` or ``{"metric": ..., "bounds": {...}}``.
PickSpec = Mapping[str, Any]

WEIGHTS, METRIC, BOUNDS = "weights", "metric", "bounds"


@dataclasses.dataclass(frozen=True)
class Candidate:
    """A finished trial that reported every metric as a finite number.

    :param trial_id: the trial.
    :param values: its value of each metric (in its last result).
    :param pareto_rank: 0 on the front, k on the front left once ranks below k are removed.
    """

    trial_id: str
    values: dict[str, float]
    pareto_rank: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "trial_id": self.trial_id,
            "values": dict(self.values),
            "pareto_rank": self.pareto_rank,
        }


def rank_trials(
    results: Mapping[str, Mapping[str, Any] | None], metrics: Sequence[str], modes: Sequence[str]
) -> list[Candidate]:
    """The trials whose result has every metric as a finite number, with their Pareto ranks,
    ordered by rank, then trial id. Trials missing a metric, or with a NaN or infinite value,
    are left out (as ``ResultGrid.get_pareto_front`` leaves them out).

    :param results: trial id -> its (last) result.
    """
    ids = sorted(results)
    rows: list[list[Any]] = [[(results[i] or {}).get(m) for m in metrics] for i in ids]
    ranks = pareto_ranks(rows, list(modes))
    ranked = [
        Candidate(i, {m: float(v) for m, v in zip(metrics, row, strict=True)}, rank)
        for i, row, rank in zip(ids, rows, ranks, strict=True)
        if rank is not None
    ]
    return sorted(ranked, key=lambda c: (c.pareto_rank, c.trial_id))


@dataclasses.dataclass(frozen=True)
class Pick:
    """How one trial is chosen among several metrics (see the module docstring); build it with
    :meth:`of`, which checks it against the experiment's metrics.

    :param metrics: the experiment's metrics.
    :param modes: one ``"min"`` or ``"max"`` per metric.
    :param weights: metric -> weight, for a weighted pick; empty otherwise.
    :param metric: the metric ranked, for a bounded pick; None for a weighted one.
    :param bounds: metric -> (low, high), either None, for a bounded pick.
    """

    metrics: tuple[str, ...]
    modes: tuple[str, ...]
    weights: dict[str, float] = dataclasses.field(default_factory=dict)
    metric: str | None = None
    bounds: dict[str, tuple[float | None, float | None]] = dataclasses.field(default_factory=dict)

    @classmethod
    def of(
        cls, owner: str, pick: PickSpec | None, metrics: Sequence[str], modes: Sequence[str]
    ) -> Pick:
        """``pick`` checked against the experiment's metrics; no pick: the best trial on the
        first metric.

        :param owner: names the caller in messages (``"Experiment mnist"``).
        :raises ValueError: naming the pick, what is wrong and how to write it instead.
        """
        names, directions = tuple(metrics), tuple(modes)
        if pick is None:
            return cls(names, directions, metric=names[0])
        if not isinstance(pick, Mapping):
            raise ValueError(
                f"{owner}: pick={pick!r} is a {type(pick).__name__}, not a dict; write "
                f"{_examples(names)}."
            )
        unknown = sorted(set(pick) - {WEIGHTS, METRIC, BOUNDS})
        if unknown or (WEIGHTS in pick) == (METRIC in pick) or (BOUNDS in pick and WEIGHTS in pick):
            raise ValueError(
                f"{owner}: pick={dict(pick)!r} is not a pick; give either weights or a metric "
                f"(with bounds, optionally), e.g. {_examples(names)}."
            )
        if WEIGHTS in pick:
            return cls(names, directions, weights=_weights(owner, pick[WEIGHTS], names, directions))
        metric = pick[METRIC]
        if metric not in names:
            raise ValueError(
                f"{owner}: pick={dict(pick)!r} ranks by {metric!r}, which is not one of the "
                f"experiment's metrics {list(names)!r}; name one of them."
            )
        return cls(names, directions, metric=metric, bounds=_bounds(owner, pick.get(BOUNDS), names))

    def to_dict(self) -> dict[str, Any]:
        """The pick as it is written (JSON-serialisable), as recorded beside the chosen trial."""
        if self.metric is None:
            return {WEIGHTS: dict(self.weights)}
        return {
            METRIC: self.metric,
            BOUNDS: {m: [low, high] for m, (low, high) in self.bounds.items()},
        }

    def describe(self) -> str:
        """The pick in words, for logs and messages."""
        if self.metric is None:
            terms = " ".join(
                f"{'-' if w < 0 else '+'} {abs(w):g} * {m}" for m, w in self.weights.items()
            ).removeprefix("+ ")
            return f"the trial of the Pareto front with the highest {terms}"
        mode = self.modes[self.metrics.index(self.metric)]
        best = f"the {'highest' if mode == 'max' else 'lowest'} {self.metric}"
        if not self.bounds:
            return best
        within = ", ".join(_bound_text(m, low, high) for m, (low, high) in self.bounds.items())
        return f"{best} among the trials with {within}"

    def score(self, candidate: Candidate) -> float:
        """What the pick maximises: the weighted sum, or the metric's value turned so that
        higher is better."""
        if self.metric is None:
            return math.fsum(w * candidate.values[m] for m, w in self.weights.items())
        value = candidate.values[self.metric]
        return value if self.modes[self.metrics.index(self.metric)] == "max" else -value

    def choose(self, candidates: Sequence[Candidate]) -> Candidate | None:
        """The chosen trial; None when no candidate is within the bounds (or there is none)."""
        if self.metric is None:
            eligible = [c for c in candidates if c.pareto_rank == 0]
        else:
            eligible = [c for c in candidates if self._within(c)]
        if not eligible:
            return None
        return min(eligible, key=lambda c: (-self.score(c), c.pareto_rank, c.trial_id))

    def _within(self, candidate: Candidate) -> bool:
        for metric, (low, high) in self.bounds.items():
            value = candidate.values[metric]
            if (low is not None and value < low) or (high is not None and value > high):
                return False
        return True


def _examples(metrics: Sequence[str]) -> str:
    first, other = metrics[0], metrics[1] if len(metrics) > 1 else metrics[0]
    return (
        f"pick={{'weights': {{{first!r}: 1.0, {other!r}: -0.01}}}} or "
        f"pick={{'metric': {first!r}, 'bounds': {{{other!r}: [None, 5.0]}}}}"
    )


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _weights(
    owner: str, weights: Any, metrics: Sequence[str], modes: Sequence[str]
) -> dict[str, float]:
    if not isinstance(weights, Mapping) or not weights:
        raise ValueError(
            f"{owner}: pick weights={weights!r} must be a non-empty dict of metric -> weight, "
            f"e.g. {{{metrics[0]!r}: 1.0}}."
        )
    checked: dict[str, float] = {}
    for metric, weight in weights.items():
        if metric not in metrics:
            raise ValueError(
                f"{owner}: pick weights name {metric!r}, which is not one of the experiment's "
                f"metrics {list(metrics)!r}; weigh only those."
            )
        if not _number(weight):
            raise ValueError(
                f"{owner}: pick weights give {metric!r} the weight {weight!r}; a weight must be "
                "a finite number."
            )
        mode = modes[list(metrics).index(metric)]
        if (mode == "max" and weight < 0) or (mode == "min" and weight > 0):
            sign = "<= 0" if mode == "min" else ">= 0"
            raise ValueError(
                f"{owner}: pick weights give {metric!r} (mode {mode!r}) the weight {weight:g}, "
                f"which rewards what the experiment avoids: the highest weighted sum wins, so "
                f"give a metric to {'minimise' if mode == 'min' else 'maximise'} a weight {sign}, "
                f"e.g. {-weight:g}."
            )
        checked[metric] = float(weight)
    if not any(checked.values()):
        raise ValueError(
            f"{owner}: pick weights {dict(weights)!r} are all 0, so they choose nothing; give "
            "one metric a non-zero weight."
        )
    return checked


def _bounds(
    owner: str, bounds: Any, metrics: Sequence[str]
) -> dict[str, tuple[float | None, float | None]]:
    if bounds is None:
        return {}
    if not isinstance(bounds, Mapping):
        raise ValueError(
            f"{owner}: pick bounds={bounds!r} must be a dict of metric -> [low, high], e.g. "
            f"{{{metrics[-1]!r}: [None, 5.0]}}."
        )
    checked: dict[str, tuple[float | None, float | None]] = {}
    for metric, pair in bounds.items():
        if metric not in metrics:
            raise ValueError(
                f"{owner}: pick bounds name {metric!r}, which is not one of the experiment's "
                f"metrics {list(metrics)!r}; bound only those."
            )
        if (
            not isinstance(pair, list | tuple)
            or len(pair) != 2
            or not all(v is None or _number(v) for v in pair)
            or tuple(pair) == (None, None)
        ):
            raise ValueError(
                f"{owner}: pick bounds give {metric!r} {pair!r}; give [low, high], two finite "
                "numbers or None for no bound (not both None), e.g. [None, 5.0]."
            )
        low, high = (None if v is None else float(v) for v in pair)
        if low is not None and high is not None and low > high:
            raise ValueError(
                f"{owner}: pick bounds give {metric!r} [{low:g}, {high:g}], whose low is above "
                "its high, so no trial can meet them; swap them."
            )
        checked[metric] = (low, high)
    return checked


def _bound_text(metric: str, low: float | None, high: float | None) -> str:
    if low is None:
        return f"{metric} <= {high:g}"
    if high is None:
        return f"{metric} >= {low:g}"
    return f"{low:g} <= {metric} <= {high:g}"
