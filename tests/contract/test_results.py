"""ResultGrid read from the trials DB, unchanged on in-memory SQLite, a SQLite file and
PostgreSQL."""

from __future__ import annotations

import math

import pytest

from airflow_trials import ExperimentNotFoundError, ResultGrid, TrialStatus
from airflow_trials.core.end import TrialEnd
from airflow_trials.core.fate import after_failure
from tests.contract.conftest import MEMORY, POSTGRESQL, SQLITE_FILE
from tests.factories import add_checkpoint, add_results

EXPERIMENT = "grid-exp"


def _trial(store, run, trial_id, config, scores, checkpoints=(), deleted=()):
    """A trial that reported ``scores`` (iterations 1..n) and kept checkpoints at
    ``checkpoints``."""
    store.upsert_trial(
        trial_id,
        trainable="pkg.mod:fn",
        config=config,
        resources={"cpu": 1},
        max_failures=0,
        experiment_run_id=run,
    )
    add_results(
        store,
        trial_id,
        [
            {"training_iteration": i, "score": s, "aux": 10 * i}
            for i, s in enumerate(scores, start=1)
        ],
    )
    for iteration in checkpoints:
        add_checkpoint(store, trial_id, f"/ckpt/{trial_id}/{iteration}", iteration)
    for iteration in deleted:
        store.mark_checkpoint_deleted(trial_id, f"/ckpt/{trial_id}/{iteration}")


def _end(store, trial_id, status=TrialStatus.TERMINATED, error=None):
    end = TrialEnd(trial_id, EXPERIMENT, status, error=error)
    decision = None if status is TrialStatus.TERMINATED else after_failure(trial_id, 0, 0)
    store.record_end(end, decision)


@pytest.fixture
def run(store):
    """Run "night-2" of a max-score experiment: a peaks at 9 then falls to 2; b ends best at 5;
    c failed after one result; d never reported. An older run "night-1" exists too."""
    store.ensure_experiment(EXPERIMENT, metric="score", mode="max")
    old = store.create_experiment_run(EXPERIMENT, "night-1")
    _trial(store, old, "old-a", {"lr": 0.5}, [100.0])
    run = store.create_experiment_run(EXPERIMENT, "night-2")
    _trial(
        store,
        run,
        "a",
        {"lr": 0.1, "net": {"width": 8}},
        [1.0, 9.0, 4.0, 2.0],
        checkpoints=[1, 2, 4],
    )
    _trial(
        store,
        run,
        "b",
        {"lr": 0.2, "net": {"width": 16}},
        [3.0, 4.0, 5.0],
        checkpoints=[1, 3],
        deleted=[1],
    )
    _trial(store, run, "c", {"lr": 0.3, "net": {"width": 32}}, [float("nan")])
    _trial(store, run, "d", {"lr": 0.4, "net": {"width": 64}}, [])
    for trial_id in ("a", "b", "old-a"):
        _end(store, trial_id)
    _end(store, "c", TrialStatus.ERROR, "Trial c failed: boom")
    return run


class ResultGridContract:
    def test_opens_the_latest_run_by_default_and_any_run_by_key_or_id(self, store, run):
        grid = ResultGrid.from_db(EXPERIMENT, store=store)
        assert (grid.run_key, len(grid), [r.trial_id for r in grid]) == (
            "night-2",
            4,
            ["a", "b", "c", "d"],
        )
        assert (grid.metric, grid.mode) == ("score", "max")
        assert [r.trial_id for r in ResultGrid.from_db(EXPERIMENT, "night-1", store=store)] == [
            "old-a"
        ]
        assert ResultGrid.from_db(EXPERIMENT, run, store=store).run_key == "night-2"
        assert ResultGrid.from_db(EXPERIMENT, str(run), store=store).run_key == "night-2"

    def test_best_result_by_last_value_as_ray_tune_and_by_best_value_with_scope_all(
        self, store, run
    ):
        grid = ResultGrid.from_db(EXPERIMENT, store=store)
        assert grid.get_best_result().trial_id == "b"  # last values: a 2, b 5
        best_all = grid.get_best_result(scope="all")
        assert best_all.trial_id == "a"  # a reached 9
        assert best_all.config == {"lr": 0.1, "net": {"width": 8}}
        assert best_all.metrics["score"] == 2.0 and best_all.metrics["training_iteration"] == 4
        assert grid.get_best_result("score", "min").trial_id == "a"
        assert grid.get_best_result("aux", "max").trial_id == "a"  # another metric, its own mode

    def test_best_and_latest_checkpoints_differ_where_the_best_model_is_not_the_newest(
        self, store, run
    ):
        by_id = {r.trial_id: r for r in ResultGrid.from_db(EXPERIMENT, store=store)}
        assert (by_id["a"].best_checkpoint, by_id["a"].latest_checkpoint) == (
            "/ckpt/a/2",
            "/ckpt/a/4",
        )
        assert (by_id["b"].best_checkpoint, by_id["b"].latest_checkpoint) == (
            "/ckpt/b/3",
            "/ckpt/b/3",
        )
        assert (by_id["d"].best_checkpoint, by_id["d"].latest_checkpoint) == (None, None)

    def test_errors_and_counts(self, store, run):
        grid = ResultGrid.from_db(EXPERIMENT, store=store)
        assert (grid.num_terminated, grid.num_errors) == (2, 1)
        assert grid.errors == ["Trial c failed: boom"]
        assert {r.trial_id: r.status for r in grid}["d"] is TrialStatus.PENDING

    def test_dataframe_has_one_row_per_trial_with_config_columns(self, store, run):
        frame = ResultGrid.from_db(EXPERIMENT, store=store).get_dataframe()
        assert list(frame["trial_id"]) == ["a", "b", "c", "d"]
        assert list(frame["config/lr"]) == [0.1, 0.2, 0.3, 0.4]
        assert list(frame["config/net/width"]) == [8, 16, 32, 64]
        assert list(frame["score"][:2]) == [2.0, 5.0]
        assert list(frame["best_checkpoint"][:2]) == ["/ckpt/a/2", "/ckpt/b/3"]
        best_rows = ResultGrid.from_db(EXPERIMENT, store=store).get_dataframe("score", "max")
        assert list(best_rows["training_iteration"][:2]) == [2, 3]
        assert list(best_rows["score"][:2]) == [9.0, 5.0]

    def test_a_trials_history_is_a_dataframe(self, store, run):
        a = ResultGrid.from_db(EXPERIMENT, store=store)[0]
        history = a.metrics_dataframe
        assert list(history["training_iteration"]) == [1, 2, 3, 4]
        assert list(history["score"]) == [1.0, 9.0, 4.0, 2.0]

    def test_nan_is_skipped_and_a_metric_nobody_reported_names_the_reported_ones(self, store, run):
        grid = ResultGrid.from_db(EXPERIMENT, store=store)
        c = next(r for r in grid if r.trial_id == "c")
        assert c.metrics["score"] is None or math.isnan(c.metrics["score"])
        with pytest.raises(ValueError, match=r"metric 'los'.*report aux, score\. Pass metric="):
            grid.get_best_result("los", "min")
        with pytest.raises(ValueError, match="mode must be 'min' or 'max'"):
            grid.get_best_result("score", "best")
        with pytest.raises(ValueError, match=r"^metric='aux' is not a metric the experiment rec"):
            grid.get_best_result("aux")  # not the experiment's: no mode to keep (issue 48)

    def test_an_errored_or_unended_trial_can_be_ray_tunes_best_but_terminated_only_is_select_bests(
        self, store, run
    ):
        # e scored best, then failed for good; f scored better still and has not ended.
        _trial(store, run, "e", {"lr": 0.5, "net": {"width": 8}}, [20.0], checkpoints=[1])
        _end(store, "e", TrialStatus.ERROR, "Trial e failed: boom")
        _trial(store, run, "f", {"lr": 0.6, "net": {"width": 8}}, [30.0], checkpoints=[1])
        grid = ResultGrid.from_db(EXPERIMENT, store=store)
        assert grid.get_best_result(scope="all").trial_id == "f"  # as Ray Tune: any status
        best = grid.get_best_result(scope="all", terminated_only=True)
        # select_best's rule (experiment/plan.py): the leaderboard's first TERMINATED row with a
        # value.
        board = store.reader.leaderboard(run, "score", "max")
        top = next(
            r for r in board if r.status is TrialStatus.TERMINATED and r.best_value is not None
        )
        assert (
            (best.trial_id, best.best_checkpoint)
            == (top.trial_id, top.best_checkpoint)
            == ("a", "/ckpt/a/2")
        )
        assert grid.get_best_result(terminated_only=True).trial_id == "b"  # last values: a 2, b 5

    def test_terminated_only_names_the_statuses_when_no_trial_that_reported_ended_terminated(
        self, store
    ):
        store.ensure_experiment(EXPERIMENT, metric="score", mode="max")
        run = store.create_experiment_run(EXPERIMENT, "night-3")
        _trial(store, run, "x", {"lr": 0.1}, [1.0])
        _end(store, "x", TrialStatus.ERROR, "Trial x failed: boom")
        _trial(store, run, "y", {"lr": 0.2}, [2.0])
        grid = ResultGrid.from_db(EXPERIMENT, store=store)
        assert grid.get_best_result().trial_id == "y"
        with pytest.raises(
            ValueError,
            match=r"metric 'score' ended TERMINATED \(1 ERROR, 1 PENDING\); pass "
            r"terminated_only=False",
        ):
            grid.get_best_result(terminated_only=True)

    def test_unknown_experiment_or_run_is_a_clear_error(self, store, run):
        with pytest.raises(
            ExperimentNotFoundError, match=r"'nope' has no runs .*experiments: grid-exp"
        ):
            ResultGrid.from_db("nope", store=store)
        with pytest.raises(
            ExperimentNotFoundError, match=r"no run 'night-9'.*airflow-trials runs grid-exp"
        ):
            ResultGrid.from_db(EXPERIMENT, "night-9", store=store)


class TestInMemorySQLite(ResultGridContract):
    backend = MEMORY


class TestSQLiteFile(ResultGridContract):
    backend = SQLITE_FILE


@pytest.mark.postgres
class TestPostgreSQL(ResultGridContract):
    backend = POSTGRESQL
