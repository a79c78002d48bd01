"""The dashboard's reads and the chart, without a web server."""

from __future__ import annotations

import pytest

from airflow_trials.core.scheduler import Decision
from airflow_trials.core.stop_kind import StopKind
from airflow_trials.plugins.charts.curves import learning_curves_svg
from airflow_trials.plugins.charts.kit import nice_ticks
from airflow_trials.plugins.data.queries import (
    best_checkpoint,
    best_point,
    early_stopped,
    get_experiment_run,
    leaderboard_page,
)
from airflow_trials.plugins.datamodels.scheduler_steps import (
    AT_END,
    ConfigChange,
    config_changes,
    lineage_steps,
    rung_verdict,
)
from airflow_trials.schedulers.asha.asha_rungs import RungVerdict
from airflow_trials.store.records import CheckpointRecordRow
from tests.factories import add_results, update_trial
from tests.scheduler_writes import OneWriteEach


def _ckpt(iteration, deleted=False):
    return CheckpointRecordRow(
        path=f"/c/{iteration}", iteration=iteration, score=None, deleted=deleted
    )


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
    ranking = trials_store.reader.ranking(seeded.run, metric, mode)
    board = trials_store.reader.leaderboard(seeded.run, metric, mode)
    assert [
        (r.trial_id, r.status, r.num_failures, r.best_value, r.best_iteration) for r in ranking
    ] == [(b.trial_id, b.status, b.num_failures, b.best_value, b.best_iteration) for b in board]


def test_a_page_reads_configs_for_its_rows_only_and_shows_the_search_space_keys(
    trials_store, seeded
):
    reader = trials_store.reader
    run = get_experiment_run(reader, seeded.run)
    page = leaderboard_page(reader, run, "loss", "min", page=2, page_size=1)
    assert [(r.rank, r.trial.trial_id, r.config) for r in page.rows] == [
        (2, "mnist-01", {"lr": 0.05, "layers": 1})
    ]
    assert page.config_keys == ["layers", "lr"]  # lr from the search space, layers from the row


ASHA_STOP = (
    "stopped by ASHA at training_iteration=3 (rung 1 of 4): loss 0.41 above the rung's cutoff 0.35"
)


@pytest.mark.parametrize(
    ("stop_kind", "marked"),
    [
        (StopKind.SCHEDULER, True),
        ("scheduler", True),
        (StopKind.MAX_T, False),  # its whole budget
        (StopKind.CRITERION, False),
        (StopKind.FINISHED, False),
        (StopKind.EXPERIMENT, False),
        (StopKind.AIRFLOW, False),
        (None, False),
    ],
)
def test_only_a_scheduler_s_stop_is_an_early_stop(stop_kind, marked):
    assert early_stopped(stop_kind) is marked


def test_a_page_shows_why_its_trials_stopped(trials_store, seeded):
    reader = trials_store.reader
    update_trial(trials_store, "mnist-01", stop_reason=ASHA_STOP, stop_kind=StopKind.SCHEDULER)
    update_trial(
        trials_store,
        "mnist-02",
        stop_reason="it met its stopping criterion",
        stop_kind=StopKind.CRITERION,
    )
    run = get_experiment_run(reader, seeded.run)
    page = leaderboard_page(reader, run, "loss", "min", page_size=4)
    assert [(r.trial.trial_id, r.stop_reason, r.early_stopped) for r in page.rows] == [
        ("mnist-00", None, False),
        ("mnist-01", ASHA_STOP, True),
        ("mnist-02", "it met its stopping criterion", False),
        ("mnist-03", None, False),
    ]


def test_page_past_the_end_is_empty_but_keeps_the_totals(trials_store, seeded):
    reader = trials_store.reader
    run = get_experiment_run(reader, seeded.run)
    page = leaderboard_page(reader, run, "loss", "min", page=9, page_size=5)
    assert (page.rows, page.total, page.pages) == ([], 12, 3)
    assert page.leaders[:2] == ["mnist-00", "mnist-01"] and "mnist-11" not in page.leaders


def test_page_arguments_are_checked(trials_store, seeded):
    reader = trials_store.reader
    run = get_experiment_run(reader, seeded.run)
    with pytest.raises(ValueError, match="Cannot sort the leaderboard by 'x'"):
        leaderboard_page(reader, run, "loss", "min", sort="x")
    with pytest.raises(ValueError, match="page_size 1 to 500"):
        leaderboard_page(reader, run, "loss", "min", page_size=0)


MAX_T_STOP = "stopped by ASHA at training_iteration=10: it reached max_t=10"


def _stop_some(trials_store):
    """mnist-01 and mnist-04 stopped early by ASHA; mnist-02 stopped at max_t, which is no early
    stop."""
    for trial_id in ("mnist-01", "mnist-04"):
        update_trial(trials_store, trial_id, stop_reason=ASHA_STOP, stop_kind=StopKind.SCHEDULER)
    update_trial(trials_store, "mnist-02", stop_reason=MAX_T_STOP, stop_kind=StopKind.MAX_T)


def test_the_stopped_filter_keeps_the_ranks_of_the_full_ranking(trials_store, seeded):
    reader = trials_store.reader
    _stop_some(trials_store)
    run = get_experiment_run(reader, seeded.run)
    early = leaderboard_page(reader, run, "loss", "min", stopped="early")
    assert [(r.rank, r.trial.trial_id, r.early_stopped) for r in early.rows] == [
        (2, "mnist-01", True),
        (5, "mnist-04", True),
    ]
    assert (early.total, early.pages, early.num_trials, early.stopped) == (2, 1, 12, "early")
    others = leaderboard_page(reader, run, "loss", "min", stopped="not_early", page_size=5)
    assert [r.rank for r in others.rows] == [1, 3, 4, 6, 7] and "mnist-02" in [
        r.trial.trial_id for r in others.rows
    ]
    assert (others.total, others.pages, others.num_trials) == (10, 2, 12)
    everyone = leaderboard_page(reader, run, "loss", "min", page_size=50)
    assert (everyone.total, everyone.num_trials, everyone.stopped) == (12, 12, "all")
    # The run's summary, its best trial and its leaders are the whole run's, whatever the filter.
    assert early.status_counts == everyone.status_counts and sum(early.status_counts.values()) == 12
    assert (early.best_trial_id, early.leaders) == (everyone.best_trial_id, everyone.leaders)


def test_the_stopped_filter_sorts_and_pages_within_the_kept_trials(trials_store, seeded):
    reader = trials_store.reader
    _stop_some(trials_store)
    run = get_experiment_run(reader, seeded.run)
    reverse = leaderboard_page(reader, run, "loss", "min", stopped="early", descending=True)
    assert [(r.rank, r.trial.trial_id) for r in reverse.rows] == [(5, "mnist-04"), (2, "mnist-01")]
    by_id = leaderboard_page(
        reader,
        run,
        "loss",
        "min",
        stopped="not_early",
        sort="trial_id",
        descending=True,
        page=2,
        page_size=4,
    )
    assert [r.trial.trial_id for r in by_id.rows] == [
        "mnist-07",
        "mnist-06",
        "mnist-05",
        "mnist-03",
    ]
    past = leaderboard_page(reader, run, "loss", "min", stopped="early", page=2, page_size=2)
    assert (past.rows, past.total, past.pages) == ([], 2, 1)


def test_a_run_without_early_stops_has_an_empty_early_page(trials_store, seeded):
    reader = trials_store.reader
    run = get_experiment_run(reader, seeded.run)
    page = leaderboard_page(reader, run, "loss", "min", stopped="early")
    assert (page.rows, page.total, page.pages, page.num_trials) == ([], 0, 1, 12)
    with pytest.raises(ValueError, match="stopped='yes'; use one of all, early, not_early"):
        leaderboard_page(reader, run, "loss", "min", stopped="yes")


def test_a_trial_s_rungs_say_their_verdict_and_the_one_recorded_at_the_end(trials_store, seeded):
    def verdict(decision, reason=None):
        return lambda values: RungVerdict(decision=decision, cutoff=None, reason=reason)

    OneWriteEach(trials_store).record_rung(
        seeded.run,
        "mnist-05",
        bracket=0,
        milestone=1,
        value=0.3,
        iteration=1,
        decide=verdict(Decision.CONTINUE),
    )
    OneWriteEach(trials_store).record_rung(
        seeded.run,
        "mnist-05",
        bracket=0,
        milestone=4,
        value=0.2,
        iteration=4,
        decide=verdict(Decision.STOP, ASHA_STOP),
    )
    OneWriteEach(trials_store).record_rung(
        seeded.run,
        "mnist-05",
        bracket=0,
        milestone=16,
        value=0.1,
        iteration=10,
        at_end=True,
        decide=verdict(Decision.STOP, "would stop"),
    )
    assert [
        (r.milestone, r.iteration, rung_verdict(r), r.reason)
        for r in trials_store.reader.trial_rungs("mnist-05")
    ] == [(1.0, 1, "CONTINUE", None), (4.0, 4, "STOP", ASHA_STOP), (16.0, 10, AT_END, "would stop")]


def test_config_changes_name_nested_keys_with_dots_and_say_what_explore_did():
    old = {"lr": 0.01, "layers": 2, "opt": {"momentum": 0.9, "name": "sgd"}, "gone": 1}
    new = {"lr": 0.012, "layers": 2, "opt": {"momentum": 0.72, "name": "sgd"}, "added": [1, 2]}
    assert config_changes(
        old, new, {"lr": "0.01 * 1.2", "opt.momentum": "0.9 * 0.8", "layers": "2 (kept)"}
    ) == [
        ConfigChange("added", None, [1, 2]),
        ConfigChange("gone", 1, None),
        ConfigChange("lr", 0.01, 0.012, "0.01 * 1.2"),
        ConfigChange("opt.momentum", 0.9, 0.72, "0.9 * 0.8"),
    ]
    assert config_changes({"lr": 0.1}, {"lr": 0.1}, {"lr": "resampled"}) == []


def test_a_lineage_lists_each_exploit_with_the_keys_it_changed(trials_store, seeded):
    for trial_id, donor, iteration, new in (
        ("mnist-05", "mnist-00", 4, {"lr": 0.12, "layers": 0}),
        ("mnist-06", "mnist-05", 8, {"lr": 0.144, "layers": 0}),
    ):
        trials_store.record_exploit(
            trial_id,
            iteration=iteration,
            donor_trial_id=donor,
            donor_checkpoint=f"/ckpt/{donor}/{iteration}",
            old_config=trials_store.reader.get_trial(trial_id).config,
            new_config=new,
            operations={"lr": "x 1.2"},
        )
    steps = lineage_steps(trials_store.reader.lineage("mnist-06"))
    assert [(s.exploit.trial_id, s.exploit.donor_trial_id, s.exploit.iteration) for s in steps] == [
        ("mnist-05", "mnist-00", 4),
        ("mnist-06", "mnist-05", 8),
    ]
    assert [[(c.key, c.old, c.new, c.operation) for c in s.changes] for s in steps] == [
        [("layers", 2, 0, None), ("lr", 0.1 / 6, 0.12, "x 1.2")],
        [("lr", 0.1 / 7, 0.144, "x 1.2")],
    ]


def test_metric_curves_skip_values_that_are_not_numbers(trials_store, seeded):
    trials_store.upsert_trial(
        "odd",
        trainable="m:f",
        config={},
        resources={"cpu": 1},
        max_failures=0,
        experiment_run_id=seeded.run,
    )
    add_results(
        trials_store,
        "odd",
        [
            {"training_iteration": 1, "loss": "n/a"},
            {"training_iteration": 2, "loss": 0.2},
            {"training_iteration": 3, "loss": float("nan")},
            {"training_iteration": 4},
        ],
    )
    assert trials_store.reader.metric_curves(["odd", "mnist-11"], "loss") == {
        "odd": [(2, 0.2)],
        "mnist-11": [],
    }


def test_nice_ticks_are_round_and_cover_the_range():
    assert nice_ticks(0.0, 1.0) == [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]
    assert nice_ticks(1, 10) == [2, 4, 6, 8, 10]
    assert nice_ticks(3.0, 3.0) == [3.0]


def test_chart_draws_every_curve_and_the_best_last():
    svg = learning_curves_svg(
        {"b": [(1, 1.0), (2, 0.5)], "a": [(1, 0.9), (2, 0.2)], "c": []},
        metric="loss",
        best_trial_id="a",
    )
    assert svg.count("<polyline") == 2
    assert (
        svg.rindex('data-trial="a"') > svg.index('data-trial="b"')
        and 'class="curve best" data-trial="a"' in svg
    )
    assert "best: a" in svg


def test_chart_marks_a_curve_of_one_point():
    svg = learning_curves_svg({"a": [(1, 0.5)]}, metric="loss", best_trial_id="a")
    assert svg.count("<circle") == 1


def test_chart_without_values_says_so():
    assert "No results with metric loss yet." in learning_curves_svg({"a": []}, metric="loss")
