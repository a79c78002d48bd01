"""The regression rule (core/regression_tolerance.py): the tolerance's spelling, one metric's
comparison in its mode, and the hypervolumes of two Pareto fronts against a common reference
point."""

from __future__ import annotations

import math

import pytest

from airflow_trials.core.regression_tolerance import (
    RegressionTolerance,
    compare_best,
    compare_fronts,
    reference_point,
)
from airflow_trials.experiment.regression_check import optuna_hypervolume


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        (None, None),
        ({"absolute": 0.01}, RegressionTolerance("absolute", 0.01)),
        ({"relative": 0.05}, RegressionTolerance("relative", 0.05)),
        ({"relative": 0}, RegressionTolerance("relative", 0.0)),
        ({"absolute": 3}, RegressionTolerance("absolute", 3.0)),
    ],
)
def test_a_tolerance_is_a_dict_of_one_kind(spec, expected):
    assert RegressionTolerance.of(spec) == expected


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (0.05, r"regression_tolerance=0.05 is not a tolerance: give a dict of one key"),
        ({"rel": 0.05}, r"is not a tolerance: give a dict of one key, \{\"relative\": 0.05\}"),
        ({"relative": 0.05, "absolute": 1}, r"is not a tolerance"),
        ({"absolute": -1}, r"the absolute tolerance must be a finite number >= 0, got -1"),
        ({"absolute": float("nan")}, r"must be a finite number >= 0, got nan"),
        ({"relative": True}, r"must be a finite number >= 0, got True"),
        ({"relative": "5%"}, r"must be a finite number >= 0, got '5%'"),
        ({"relative": 5}, r"at most 1; 5 % is \{'relative': 0.05\}"),
    ],
)
def test_a_bad_tolerance_is_refused_naming_the_value_and_the_spelling(spec, message):
    with pytest.raises(ValueError, match=message):
        RegressionTolerance.of(spec)


def test_an_absolute_tolerance_is_refused_with_several_metrics():
    RegressionTolerance("relative", 0.1).check_metrics(several_metrics=True)
    RegressionTolerance("absolute", 0.1).check_metrics(several_metrics=False)
    with pytest.raises(ValueError, match=r"compared by hypervolume.*give a relative tolerance"):
        RegressionTolerance("absolute", 0.1).check_metrics(several_metrics=True)


@pytest.mark.parametrize(
    ("current", "previous", "mode", "tolerance", "worse_by", "regressed"),
    [
        (0.52, 0.40, "min", {"absolute": 0.1}, 0.12, True),
        (0.48, 0.40, "min", {"absolute": 0.1}, 0.08, False),
        (0.30, 0.40, "min", {"absolute": 0.0}, 0.0, False),  # better
        (0.40, 0.40, "min", {"absolute": 0.0}, 0.0, False),  # as good
        (0.80, 0.90, "max", {"absolute": 0.05}, 0.10, True),
        (0.95, 0.90, "max", {"absolute": 0.0}, 0.0, False),
        (0.85, 0.90, "max", {"relative": 0.05}, 0.05, True),  # 0.05 > 5 % of 0.9 = 0.045
        (0.86, 0.90, "max", {"relative": 0.05}, 0.04, False),
        (-1.1, -1.0, "max", {"relative": 0.05}, 0.1, True),  # relative to |previous|
        (-1.04, -1.0, "max", {"relative": 0.05}, 0.04, False),
    ],
)
def test_one_metric_is_worse_in_its_mode_by_more_than_the_tolerance(
    current, previous, mode, tolerance, worse_by, regressed
):
    compared = compare_best(current, previous, mode, RegressionTolerance.of(tolerance))
    assert compared.worse_by == pytest.approx(worse_by)
    assert compared.regressed is regressed
    assert (compared.current, compared.previous) == (current, previous)


def test_the_reference_point_lies_beyond_both_fronts_by_a_tenth_of_each_range():
    # max accuracy (negated to a loss), min latency; latency's range over both fronts is 0
    point = reference_point([[[0.9, 5.0], [0.8, 5.0]], [[0.5, 5.0]]], ["max", "min"])
    assert point == pytest.approx([-0.5 + 0.04, 6.0])


def test_hypervolume_is_optunas_over_the_flipped_points():
    # min both: a 2x2 square with the corner (1, 1) cut out above (1, 1) -> 3
    assert optuna_hypervolume([[0, 1], [1, 0]], [2, 2]) == pytest.approx(3.0)
    # dominated points add nothing
    assert optuna_hypervolume([[0, 1], [1, 0], [1.5, 1.5]], [2, 2]) == pytest.approx(3.0)


def test_a_front_that_lost_a_corner_has_less_hypervolume():
    modes = ["max", "min"]  # accuracy, latency
    previous = [[0.9, 10.0], [0.8, 2.0]]
    current = [[0.9, 10.0]]  # the fast trial is gone
    tolerance = RegressionTolerance("relative", 0.05)
    compared = compare_fronts(current, previous, modes, tolerance, optuna_hypervolume)
    # reference: accuracy 0.8 - 0.01 (loss -0.79), latency 10 + 0.8 = 10.8
    assert compared.reference_point == pytest.approx([0.79, 10.8])
    whole = 0.11 * 0.8 + 0.01 * 8.0  # the accurate trial's box plus the fast one's extra
    assert compared.previous == pytest.approx(whole)
    assert compared.current == pytest.approx(0.11 * 0.8)
    assert compared.regressed and compared.allowed == pytest.approx(0.05 * whole)


def test_a_front_as_good_or_better_passes_and_a_small_loss_is_tolerated():
    modes = ["max", "min"]
    previous = [[0.9, 10.0], [0.8, 2.0]]
    same = compare_fronts(
        previous, previous, modes, RegressionTolerance("relative", 0), optuna_hypervolume
    )
    assert same.worse_by == 0 and not same.regressed
    better = [[0.95, 1.0]]  # dominates both
    assert not compare_fronts(
        better, previous, modes, RegressionTolerance("relative", 0), optuna_hypervolume
    ).regressed
    slightly = [[0.9, 10.0], [0.8, 2.1]]
    compared = compare_fronts(
        slightly, previous, modes, RegressionTolerance("relative", 0.05), optuna_hypervolume
    )
    assert 0 < compared.worse_by < compared.allowed and not compared.regressed


def test_the_ratio_of_hypervolumes_does_not_depend_on_the_metrics_units():
    modes = ["min", "max"]
    previous = [[1.0, 5.0], [2.0, 9.0]]
    current = [[1.5, 6.0], [2.0, 7.0]]
    tolerance = RegressionTolerance("relative", 0.0)
    base = compare_fronts(current, previous, modes, tolerance, optuna_hypervolume)
    scaled = compare_fronts(
        [[1000 * a + 7, b / 10 - 3] for a, b in current],
        [[1000 * a + 7, b / 10 - 3] for a, b in previous],
        modes,
        tolerance,
        optuna_hypervolume,
    )
    assert scaled.current / scaled.previous == pytest.approx(base.current / base.previous)


def test_an_empty_front_has_no_volume_and_bad_points_are_refused():
    modes = ["min", "min"]
    compared = compare_fronts(
        [], [[1.0, 1.0]], modes, RegressionTolerance("relative", 0.5), optuna_hypervolume
    )
    assert compared.current == 0.0 and compared.previous > 0 and compared.regressed
    with pytest.raises(ValueError, match="each point needs 2 finite values"):
        compare_fronts(
            [[1.0, math.nan]],
            [[1.0, 1.0]],
            modes,
            RegressionTolerance("relative", 0.5),
            optuna_hypervolume,
        )
