"""select_best's pick among several metrics (core/pick.py), and what a scheduler judges when the
experiment has several (core/pareto.py scheduler_metric_and_mode)."""

from __future__ import annotations

import json
import math

import pytest

from airflow_trials import ASHAScheduler, MedianStoppingRule
from airflow_trials.core.pareto import scheduler_metric_and_mode
from airflow_trials.core.pick import Candidate, Pick, rank_trials

METRICS, MODES = ["val_acc", "latency"], ["max", "min"]
RESULTS = {
    "accurate": {"val_acc": 0.95, "latency": 12.0},
    "balanced": {"val_acc": 0.90, "latency": 5.0},
    "fast": {"val_acc": 0.80, "latency": 1.0},
    "dominated": {"val_acc": 0.85, "latency": 6.0},
    "worst": {"val_acc": 0.70, "latency": 20.0},
    "nan": {"val_acc": math.nan, "latency": 1.0},
    "missing": {"val_acc": 0.99},
    "never": None,
}


def ranked():
    return rank_trials(RESULTS, METRICS, MODES)


def test_rank_trials_ranks_the_trials_that_reported_every_metric_finite():
    candidates = ranked()
    assert [(c.trial_id, c.pareto_rank) for c in candidates] == [
        ("accurate", 0),
        ("balanced", 0),
        ("fast", 0),
        ("dominated", 1),
        ("worst", 2),
    ]
    assert candidates[0].values == {"val_acc": 0.95, "latency": 12.0}


@pytest.mark.parametrize(
    ("pick", "chosen"),
    [
        (None, "accurate"),  # default: the first metric's best
        ({"metric": "latency"}, "fast"),
        ({"metric": "val_acc", "bounds": {"latency": [None, 5.0]}}, "balanced"),  # inclusive
        ({"metric": "val_acc", "bounds": {"latency": [None, 4.9]}}, "fast"),
        ({"metric": "latency", "bounds": {"val_acc": [0.85, None]}}, "balanced"),
        ({"weights": {"val_acc": 1.0, "latency": -0.002}}, "accurate"),  # 0.926 > 0.89
        ({"weights": {"val_acc": 1.0, "latency": -0.01}}, "balanced"),  # 0.85 > 0.83
        ({"weights": {"val_acc": 1.0, "latency": -0.05}}, "fast"),  # 0.75 > 0.65
        ({"weights": {"latency": -1.0}}, "fast"),
    ],
)
def test_pick_chooses_from_the_candidates(pick, chosen):
    got = Pick.of("Experiment e", pick, METRICS, MODES).choose(ranked())
    assert got is not None and got.trial_id == chosen


def test_weights_choose_only_from_the_front_and_scores_are_the_weighted_sums():
    pick = Pick.of("e", {"weights": {"val_acc": 1.0}}, METRICS, MODES)
    tie = [
        Candidate("b", {"val_acc": 0.9, "latency": 9.0}, 1),
        Candidate("a", {"val_acc": 0.9, "latency": 5.0}, 0),
        Candidate("c", {"val_acc": 0.8, "latency": 1.0}, 0),
    ]
    assert pick.choose(tie).trial_id == "a"
    assert pick.score(tie[0]) == 0.9
    weighted = Pick.of("e", {"weights": {"val_acc": 2.0, "latency": -0.5}}, METRICS, MODES)
    assert weighted.score(tie[1]) == pytest.approx(2 * 0.9 - 0.5 * 5.0)
    assert weighted.describe() == (
        "the trial of the Pareto front with the highest 2 * val_acc - 0.5 * latency"
    )


def test_ties_go_to_the_lower_rank_then_the_smaller_trial_id():
    pick = Pick.of("e", {"metric": "val_acc"}, METRICS, MODES)
    same = [
        Candidate("z", {"val_acc": 0.9, "latency": 1.0}, 0),
        Candidate("y", {"val_acc": 0.9, "latency": 1.0}, 0),
        Candidate("a", {"val_acc": 0.9, "latency": 2.0}, 1),
    ]
    assert pick.choose(same).trial_id == "y"


def test_no_candidate_within_the_bounds_chooses_none():
    pick = Pick.of("e", {"metric": "val_acc", "bounds": {"latency": [None, 0.5]}}, METRICS, MODES)
    assert pick.choose(ranked()) is None
    assert pick.choose([]) is None
    assert pick.describe() == "the highest val_acc among the trials with latency <= 0.5"


def test_to_dict_is_the_json_spelling_and_reads_back_to_the_same_pick():
    for spec in (
        {"metric": "val_acc", "bounds": {"latency": [1.0, 5.0]}},
        {"weights": {"val_acc": 1.0, "latency": -0.01}},
    ):
        pick = Pick.of("e", spec, METRICS, MODES)
        written = json.loads(json.dumps(pick.to_dict()))
        assert written == spec
        assert Pick.of("e", written, METRICS, MODES) == pick
    assert Pick.of("e", None, METRICS, MODES).to_dict() == {"metric": "val_acc", "bounds": {}}
    assert Candidate("t", {"val_acc": 0.5}, 0).to_dict() == {
        "trial_id": "t",
        "values": {"val_acc": 0.5},
        "pareto_rank": 0,
    }


@pytest.mark.parametrize(
    ("pick", "message"),
    [
        ("val_acc", r"Experiment e: pick='val_acc' is a str, not a dict; write pick="),
        ({}, r"is not a pick; give either weights or a metric"),
        ({"metric": "val_acc", "limit": 3}, r"is not a pick"),
        ({"weights": {"val_acc": 1}, "bounds": {}}, r"is not a pick"),
        ({"metric": "acc"}, r"ranks by 'acc', which is not one of the experiment's metrics"),
        ({"weights": {}}, r"weights=\{\} must be a non-empty dict"),
        ({"weights": {"val_acc": "high"}}, r"the weight 'high'; a weight must be a finite number"),
        ({"weights": {"val_acc": math.inf}}, r"a weight must be a finite number"),
        ({"weights": {"val_acc": -1.0}}, r"'val_acc' \(mode 'max'\) the weight -1.*>= 0, e.g. 1"),
        ({"weights": {"val_acc": 0, "latency": 0}}, r"are all 0, so they choose nothing"),
        ({"metric": "val_acc", "bounds": [None, 5]}, r"bounds=\[None, 5\] must be a dict"),
        ({"metric": "val_acc", "bounds": {"size": [None, 5]}}, r"bounds name 'size'"),
        ({"metric": "val_acc", "bounds": {"latency": [None, None]}}, r"not both None"),
        ({"metric": "val_acc", "bounds": {"latency": [0, 1, 2]}}, r"give \[low, high\]"),
        ({"metric": "val_acc", "bounds": {"latency": [True, 2]}}, r"give \[low, high\]"),
        ({"metric": "val_acc", "bounds": {"latency": [5, 1]}}, r"low is above its high"),
    ],
)
def test_bad_picks_are_refused_naming_the_fix(pick, message):
    with pytest.raises(ValueError, match=message):
        Pick.of("Experiment e", pick, METRICS, MODES)


class SeveralMetricsScheduler:
    """Stands in for a scheduler that judges several metrics at once (MOASHA)."""

    takes_several_metrics = True
    metric = None
    mode = None


def test_a_scheduler_gets_one_metric_unless_it_takes_several():
    assert scheduler_metric_and_mode(ASHAScheduler(), "loss", "min") == ("loss", "min")
    assert scheduler_metric_and_mode(SeveralMetricsScheduler(), METRICS, MODES) == (
        METRICS,
        MODES,
    )
    assert scheduler_metric_and_mode(ASHAScheduler(metric="latency"), METRICS, MODES) == (
        "latency",
        "min",
    )
    assert scheduler_metric_and_mode(
        MedianStoppingRule(metric="val_acc", mode="max"), METRICS, MODES
    ) == ("val_acc", "max")
    with pytest.raises(ValueError, match="cannot take several, but the experiment has"):
        scheduler_metric_and_mode(MedianStoppingRule(), METRICS, MODES)
