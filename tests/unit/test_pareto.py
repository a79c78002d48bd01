"""core/pareto.py: Pareto ranks against the definition, the metric/mode check, and the
experiment's metrics as the trials DB stores them."""

from __future__ import annotations

import math
import random

import pytest

from airflow_trials.core.pareto import (
    STORED_METRIC_LENGTH,
    check_metrics,
    decode_metrics,
    encode_metrics,
    pareto_ranks,
    rankable,
)

NAN, INF = float("nan"), float("inf")


def _peeled_ranks(rows, modes, finite_only=True):
    """The definition, by brute force: rank 0 is the rows no other row dominates; rank k the rows
    no remaining row dominates once ranks < k are removed. Rows with a missing, NaN (or, with
    ``finite_only``, infinite) value get None."""

    def usable(value):
        return (
            isinstance(value, int | float)
            and not isinstance(value, bool)
            and not math.isnan(value)
            and (math.isfinite(value) or not finite_only)
        )

    def better_or_equal(a, b, mode):
        return a <= b if mode == "min" else a >= b

    def dominates(a, b):
        return all(better_or_equal(x, y, m) for x, y, m in zip(a, b, modes, strict=True)) and any(
            x != y for x, y in zip(a, b, strict=True)
        )

    ranks = [None] * len(rows)
    remaining = {i for i, row in enumerate(rows) if all(usable(v) for v in row)}
    rank = 0
    while remaining:
        front = {
            i for i in remaining if not any(dominates(rows[j], rows[i]) for j in remaining - {i})
        }
        for i in front:
            ranks[i] = rank
        remaining -= front
        rank += 1
    return ranks


def _random_rows(rng, count, metrics):
    """Values from a small set, so that ties are common, with some NaN, infinities, None and a
    bool sprinkled in."""
    specials = [NAN, INF, -INF, None, True]
    rows = []
    for _ in range(count):
        row = []
        for _ in range(metrics):
            if rng.random() < 0.06:
                row.append(rng.choice(specials))
            else:
                row.append(rng.choice([0, 1, 2, 2.5, 3, 4, -1.5]))
        rows.append(row)
    return rows


@pytest.mark.parametrize("seed", range(40))
def test_ranks_match_the_definition_on_random_rows_with_ties_nan_and_infinities(seed):
    rng = random.Random(seed)
    metrics = 1 + seed % 3
    modes = [rng.choice(["min", "max"]) for _ in range(metrics)]
    rows = _random_rows(rng, rng.randint(0, 60), metrics)
    assert pareto_ranks(rows, modes) == _peeled_ranks(rows, modes)
    assert pareto_ranks(rows, modes, finite_only=False) == _peeled_ranks(
        rows, modes, finite_only=False
    )


def test_ranks_match_the_definition_on_continuous_values_in_three_metrics():
    rng = random.Random(7)
    rows = [[rng.random(), rng.random(), rng.random()] for _ in range(300)]
    ranks = pareto_ranks(rows, ["min", "max", "min"])
    assert ranks == _peeled_ranks(rows, ["min", "max", "min"])
    assert max(ranks) >= 3  # several fronts, not just one


def test_the_module_example_and_what_gets_no_rank():
    rows = [[0.9, 30.0], [0.8, 10.0], [0.7, 40.0], [0.9, NAN]]
    assert pareto_ranks(rows, ["max", "min"]) == [0, 0, 1, None]
    # equal rows share a rank; an infinity is skipped unless finite_only=False, where it is the
    # worst latency (yet the best accuracy keeps it on the front)
    rows = [[0.5, 1.0], [0.5, 1.0], [0.99, INF], [0.4, 2.0], [0.6, "fast"], [0.6, None]]
    assert pareto_ranks(rows, ["max", "min"]) == [0, 0, None, 1, None, None]
    assert pareto_ranks(rows, ["max", "min"], finite_only=False) == [0, 0, 0, 1, None, None]
    assert pareto_ranks([], ["min"]) == []
    assert pareto_ranks([[3], [1], [2], [1]], ["min"]) == [2, 0, 1, 0]  # one metric: by value
    assert rankable([1, 2.5]) and not rankable([1, True]) and not rankable([INF])
    assert rankable([INF, -INF], finite_only=False) and not rankable([NAN], finite_only=False)


def test_bad_modes_or_rows_are_refused():
    with pytest.raises(ValueError, match=r"modes=\['min', 'best'\]; give one 'min' or 'max'"):
        pareto_ranks([[1, 2]], ["min", "best"])
    with pytest.raises(ValueError, match="modes=\\[\\]"):
        pareto_ranks([[1]], [])
    with pytest.raises(ValueError, match="row 1 has 1 values for 2 modes"):
        pareto_ranks([[1, 2], [1]], ["min", "min"])


@pytest.mark.parametrize("modes", [["min", "max"], ["max", "max"], ["min", "min"]])
def test_two_metric_ranks_match_the_definition_on_continuous_values(modes):
    """Two metrics take the binary-search path: checked against peeling fronts."""
    rng = random.Random(len(modes[0]) * 10 + len(modes[1]))
    rows = [[rng.random(), rng.random()] for _ in range(400)]
    rows += [[rng.randint(0, 6), rng.randint(0, 6)] for _ in range(100)]  # ties on one metric
    ranks = pareto_ranks(rows, modes)
    assert ranks == _peeled_ranks(rows, modes)
    assert max(ranks) >= 5


def test_ten_thousand_trials_are_ranked_even_as_ten_thousand_fronts():
    """Not cubic: a chain (each row dominates the next) is 10,000 fronts, which peeling one
    front at a time would take ~10^12 comparisons for (its speed: bench/pareto_rank.py)."""
    rng = random.Random(3)
    spread = [[rng.random(), rng.random()] for _ in range(10_000)]
    chain = [[float(i), float(i)] for i in range(10_000)]
    spread_ranks = pareto_ranks(spread, ["min", "max"])
    chain_ranks = pareto_ranks(chain, ["min", "min"])
    assert chain_ranks == list(range(10_000))
    front = [row for row, rank in zip(spread, spread_ranks, strict=True) if rank == 0]
    assert front and all(  # none of the front is dominated by any row
        not any(o[0] <= f[0] and o[1] >= f[1] and o != f for o in spread) for f in front
    )


# -- check_metrics ---------------------------------------------------------------------------


def test_one_metric_is_left_exactly_as_it_is():
    assert check_metrics("X", "loss", "min") == ("loss", "min")
    assert check_metrics("X", None, None) == (None, None)
    # its mode is the caller's own check, with the caller's own message, as before
    assert check_metrics("X", "loss", "minimize") == ("loss", "minimize")


def test_several_metrics_come_back_as_lists():
    assert check_metrics("X", ("val_acc", "latency"), ("max", "min")) == (
        ["val_acc", "latency"],
        ["max", "min"],
    )
    assert check_metrics("X", ["loss"], ["min"]) == (["loss"], ["min"])  # a list, even of one


@pytest.mark.parametrize(
    ("metric", "mode", "message"),
    [
        (
            ["val_acc", "latency"],
            ["max"],
            r"X: metric=\['val_acc', 'latency'\] has 2 metrics but mode=\['max'\] has 1 modes; "
            r"give one 'min' or 'max' per metric, in the same order",
        ),
        ([], [], r"X: metric=\[\] names no metric; give at least one"),
        (
            ["val_acc", "val_acc"],
            ["max", "max"],
            r"names 'val_acc' more than once; give each metric once",
        ),
        (
            ["val_acc", "latency"],
            ["max", "minimize"],
            r"gives metric 'latency' the mode 'minimize'; each mode must be 'min' .* or 'max'",
        ),
        (
            ["val_acc", "latency"],
            "max",
            r"metric=\['val_acc', 'latency'\] is a list but mode='max' is not; give mode as a "
            r"list of 2",
        ),
        (["val_acc", "latency"], None, r"is a list but mode=None is not"),
        ("val_acc", ["max", "min"], r"mode=\['max', 'min'\] is a list but metric='val_acc' is not"),
        (["val_acc", 3], ["max", "min"], r"holds 3, which is not a result key"),
        (["val_acc", ""], ["max", "min"], r"holds '', which is not a result key"),
    ],
)
def test_metrics_and_modes_that_do_not_pair_up_are_refused_naming_the_fix(metric, mode, message):
    with pytest.raises(ValueError, match=message):
        check_metrics("X", metric, mode)


# -- encode_metrics / decode_metrics ---------------------------------------------------------


def test_one_metric_is_stored_as_the_same_strings_as_always():
    assert encode_metrics("val_loss", "min") == ("val_loss", "min")
    assert encode_metrics(None, None) == (None, None)
    assert decode_metrics("val_loss", "min") == ("val_loss", "min")
    assert decode_metrics(None, None) == (None, None)
    # names a single metric may have today, even ones that start like JSON, stay one metric
    for name in ("{abc", "{}", "{1: 2}", "[1, 2]"):
        assert decode_metrics(name, "max") == (name, "max")


def test_several_metrics_round_trip_through_the_metric_column():
    stored = encode_metrics(["val_acc", "latency", "val/loss"], ["max", "min", "min"])
    assert stored == ('{"val_acc":"max","latency":"min","val/loss":"min"}', None)
    assert decode_metrics(*stored) == (
        ["val_acc", "latency", "val/loss"],
        ["max", "min", "min"],
    )
    # the mode column is ignored beside several metrics (it cannot hold their modes)
    assert decode_metrics(stored[0], "max") == decode_metrics(*stored)
    # a JSON object that is not several metrics is not read as several
    assert decode_metrics('{"a":"best"}', "min") == ('{"a":"best"}', "min")


def test_stored_metrics_fit_the_trials_db_column():
    from airflow_trials.store.models import ExperimentRow

    assert ExperimentRow.__table__.c.metric.type.length == STORED_METRIC_LENGTH
    assert ExperimentRow.__table__.c.mode.type.length == 8  # why the modes go with the metrics
    with pytest.raises(ValueError, match=r"take 2\d\d characters together .* holds 250"):
        encode_metrics(["m" * 120, "n" * 120], ["min", "max"])
    with pytest.raises(ValueError, match="has 2 metrics but mode"):
        encode_metrics(["a", "b"], ["min"])
    with pytest.raises(ValueError, match="is a list but metric='a' is not"):
        encode_metrics("a", ["min"])
