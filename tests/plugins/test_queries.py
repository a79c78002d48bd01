"""The dashboard's reads and the chart, without a web server."""

from __future__ import annotations

import pytest

from airflow_trials.plugins.queries import best_checkpoint, best_point, leaderboard_page
from airflow_trials.plugins.svg import learning_curves_svg, nice_ticks
from airflow_trials.store.records import CheckpointRecordRow


def _ckpt(iteration, deleted=False):
    return CheckpointRecordRow(path=f"/c/{iteration}", iteration=iteration, score=None, deleted=deleted)


@pytest.mark.parametrize(
    ("checkpoints", "best_path", "expected"),
    [
        ([_ckpt(5), _ckpt(10)], "/c/5", 5),  # the record of the path the store picked
        ([_ckpt(5), _ckpt(10)], "/c/10", 10),
        ([_ckpt(5, deleted=True), _ckpt(10)], "/c/5", None),  # never a deleted one
        ([_ckpt(5)], None, None),  # none kept
        ([], "/c/3", None),
    ],
)
def test_best_checkpoint(checkpoints, best_path, expected):
    found = best_checkpoint(checkpoints, best_path)
    assert (found.iteration if found else None) == expected


def test_best_point_takes_the_earliest_of_equal_values():
    assert best_point([(1, 0.5), (2, 0.3), (3, 0.3)], "min") == (2, 0.3)
    assert best_point([(1, 0.5), (2, 0.3)], "max") == (1, 0.5)
    assert best_point([], "min") is None


@pytest.mark.parametrize(("metric", "mode"), [("loss", "min"), ("loss", "max"), ("acc", "max")])
def test_ranking_is_the_store_leaderboard_without_the_configs(trials_store, seeded, metric, mode):
    # loss/min reads the maintained bests; the others take the store's leaderboard path.
    ranking = trials_store.ranking(seeded.run, metric, mode)
    board = trials_store.leaderboard(seeded.run, metric, mode)
    assert [(r.trial_id, r.status, r.num_failures, r.best_value, r.best_iteration) for r in ranking] == [
        (b.trial_id, b.status, b.num_failures, b.best_value, b.best_iteration) for b in board]


def test_a_page_reads_configs_for_its_rows_only_and_shows_the_search_space_keys(trials_store, seeded):
    run = trials_store.get_experiment_run(seeded.run)
    page = leaderboard_page(trials_store, run, "loss", "min", page=2, page_size=1)
    assert [(r.rank, r.trial.trial_id, r.config) for r in page.rows] == [(2, "mnist-01", {"lr": 0.05, "layers": 1})]
    assert page.config_keys == ["layers", "lr"]  # lr from the search space, layers from the row


def test_page_past_the_end_is_empty_but_keeps_the_totals(trials_store, seeded):
    run = trials_store.get_experiment_run(seeded.run)
    page = leaderboard_page(trials_store, run, "loss", "min", page=9, page_size=5)
    assert (page.rows, page.total, page.pages) == ([], 12, 3)
    assert page.leaders[:2] == ["mnist-00", "mnist-01"] and "mnist-11" not in page.leaders


def test_page_arguments_are_checked(trials_store, seeded):
    run = trials_store.get_experiment_run(seeded.run)
    with pytest.raises(ValueError, match="Cannot sort the leaderboard by 'x'"):
        leaderboard_page(trials_store, run, "loss", "min", sort="x")
    with pytest.raises(ValueError, match="page_size 1 to 500"):
        leaderboard_page(trials_store, run, "loss", "min", page_size=0)


def test_metric_curves_skip_values_that_are_not_numbers(trials_store, seeded):
    trials_store.upsert_trial("odd", trainable="m:f", config={}, resources={"cpu": 1}, max_failures=0,
                              experiment_run_id=seeded.run)
    trials_store.add_results("odd", [{"training_iteration": 1, "loss": "n/a"}, {"training_iteration": 2, "loss": 0.2},
                                     {"training_iteration": 3, "loss": float("nan")}, {"training_iteration": 4}])
    assert trials_store.metric_curves(["odd", "mnist-11"], "loss") == {"odd": [(2, 0.2)], "mnist-11": []}


def test_nice_ticks_are_round_and_cover_the_range():
    assert nice_ticks(0.0, 1.0) == [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]
    assert nice_ticks(1, 10) == [2, 4, 6, 8, 10]
    assert nice_ticks(3.0, 3.0) == [3.0]


def test_chart_draws_every_curve_and_the_best_last():
    svg = learning_curves_svg({"b": [(1, 1.0), (2, 0.5)], "a": [(1, 0.9), (2, 0.2)], "c": []},
                              metric="loss", best_trial_id="a")
    assert svg.count("<polyline") == 2
    assert svg.rindex('data-trial="a"') > svg.index('data-trial="b"') and 'class="curve best" data-trial="a"' in svg
    assert "best: a" in svg


def test_chart_marks_a_curve_of_one_point():
    svg = learning_curves_svg({"a": [(1, 0.5)]}, metric="loss", best_trial_id="a")
    assert svg.count("<circle") == 1


def test_chart_without_values_says_so():
    assert "No results with metric loss yet." in learning_curves_svg({"a": []}, metric="loss")
