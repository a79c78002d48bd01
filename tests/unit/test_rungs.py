"""ASHA's pure rung rules (schedulers/asha/asha_rungs.py): what both the in-memory scheduler and the
store path judge with."""

from __future__ import annotations

import math
import random
import warnings

import numpy as np
import pytest

from airflow_trials import Decision
from airflow_trials.schedulers.asha.asha_rungs import (
    AshaRungs,
    ValueList,
    asha_rung_decision,
    nan_percentile,
    rung_cutoff,
    rung_milestones,
    rung_percent,
    rung_to_judge,
)


def test_milestones_are_highest_first_and_brackets_start_higher():
    assert rung_milestones(1, 81, 3) == (81, 27, 9, 3, 1)
    assert rung_milestones(1, 81, 3, bracket=2) == (81, 27, 9)
    assert rung_milestones(1, 100, 4) == (64, 16, 4, 1)
    assert rung_milestones(2, 10, 2.5) == (5.0, 2)


def test_a_result_is_judged_at_the_highest_rung_it_reached_without_a_value():
    milestones = (16, 8, 4, 2, 1)
    assert rung_to_judge(milestones, 0.5, set(), True) is None
    assert rung_to_judge(milestones, 5, set(), True) == 4  # skipped 1 and 2
    assert rung_to_judge(milestones, 5, {4}, False) is None  # judged at 4: never again below it
    # Ray Tune's quirk with stop_last_trials: the skipped rungs are judged on the next results.
    assert rung_to_judge(milestones, 5, {4}, True) == 2
    assert rung_to_judge(milestones, 5, {4, 2}, True) == 1
    assert rung_to_judge(milestones, 5, {4, 2, 1}, True) is None


def test_rung_cutoff_is_numpys_nanpercentile_of_the_scores_to_the_last_bit():
    rng = random.Random(3)
    for _ in range(500):
        values = [
            rng.choice([math.nan, math.inf, -math.inf, float(rng.randint(0, 3)), rng.gauss(0, 1)])
            for _ in range(rng.randint(1, 30))
        ]
        factor, mode = rng.choice([2, 2.5, 3, 4, 7]), rng.choice(["min", "max"])
        sign = 1.0 if mode == "max" else -1.0
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            expected = float(np.nanpercentile([sign * v for v in values], rung_percent(factor)))
        got = rung_cutoff(ValueList(values), factor, mode)
        assert got == expected or (math.isnan(got) and math.isnan(expected)), (values, factor, mode)
        assert nan_percentile(
            [sign * v for v in values], rung_percent(factor)
        ) == got or math.isnan(got)


def test_verdicts_ties_go_on_nans_stop_nothing_and_min_reads_the_other_way():
    assert asha_rung_decision([], -1e9, 2, "max").decision is Decision.CONTINUE
    assert asha_rung_decision([], -1e9, 2, "max").cutoff is None
    only_nans = asha_rung_decision([math.nan, math.nan], -1e9, 2, "max")
    assert only_nans.decision is Decision.CONTINUE and math.isnan(only_nans.cutoff)
    assert asha_rung_decision([1.0, 3.0], 2.0, 2, "max").decision is Decision.CONTINUE  # tie
    assert asha_rung_decision([1.0, 3.0], 1.9, 2, "max").decision is Decision.STOP
    stopped = asha_rung_decision([1.0, 3.0], 2.1, 2, "min")
    assert (stopped.decision, stopped.cutoff) == (Decision.STOP, 2.0)
    with pytest.raises(ValueError, match="mode must be 'min' or 'max'"):
        asha_rung_decision([1.0], 1.0, 2, "best")


def test_asha_rungs_say_why_and_refuse_what_asha_refuses():
    rungs = AshaRungs(
        metric="loss", mode="min", max_t=9, grace_period=1, reduction_factor=3, brackets=2
    )
    assert rungs.milestones(1) == (9, 3)
    assert rungs.stop_at_max_t(9) == "stopped by ASHA at training_iteration=9: it reached max_t=9"
    assert rungs.stop_at_max_t(8.5) is None
    verdict = rungs.decide(1, 4, 3, 0.9)(ValueList([0.1, 0.5]))
    assert verdict.reason == (
        "stopped by ASHA at training_iteration=4 (bracket 2 of 2, rung 1 of 2, milestone 3): loss "
        "0.9 above "
        "the rung's cutoff 0.2333"
    )
    at_end = rungs.decide(1, 4, 3, 0.9, at_end=True)(ValueList([0.1, 0.5]))
    assert at_end.decision is Decision.STOP and at_end.reason.startswith(
        "recorded when the trial ended"
    )
    assert rungs.decide(1, 4, 3, 0.0)(ValueList([0.1, 0.5])).reason is None
    with pytest.raises(ValueError, match="Bracket 2 is not one of ASHA's 2"):
        rungs.milestones(2)
    with pytest.raises(ValueError, match="reduction_factor=1"):
        AshaRungs(metric="loss", mode="min", reduction_factor=1)
    with pytest.raises(ValueError, match="mode must be"):
        AshaRungs(metric="loss", mode="lowest")
    assert {rungs.draw_bracket(u / 100) for u in range(100)} == {0, 1}


class Row:
    def __init__(self, milestone, iteration, at_end=False):
        self.milestone, self.iteration, self.at_end = milestone, iteration, at_end


def test_a_result_processed_again_reaches_the_rung_it_reached_the_first_time():
    rungs = AshaRungs(metric="loss", mode="min", max_t=16, grace_period=1, reduction_factor=2)
    # Results at iterations 1, 2 and 5 were judged at 1, 2 and 4, and 3 reached no new rung.
    stored = [Row(1, 1), Row(2, 2), Row(4, 5)]
    assert [rungs.milestone_for(0, i, i, stored) for i in (1, 2, 5)] == [1, 2, 4]
    assert rungs.milestone_for(0, 3, 3, stored) is None
    assert rungs.milestone_for(0, 9, 9, stored) == 8  # a new result
    # The trial skipped rung 2: its end records its last value there (stop_last_trials).
    skipped = [Row(1, 1), Row(4, 5)]
    assert rungs.milestone_for(0, 5, 5, skipped, at_end=True) == 2
    assert rungs.milestone_for(0, 5, 5, [*skipped, Row(2, 5, at_end=True)], at_end=True) == 2
    assert rungs.milestone_for(0, 5, 5, [*skipped, Row(2, 5, at_end=True)]) == 4
