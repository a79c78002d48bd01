"""Contract of the reads that name a run's best trial and its front, on every backend (issue 48):
feasibility is judged on the result whose value is ranked and handed on; only the trials that
ended TERMINATED are best or on a front (docs/store.md "Which trials count"); the history's best
trial is select_best's. Seeded through record_progress and record_end (tests/one_best_seed.py)."""

from __future__ import annotations

import pytest

from airflow_trials.core.goal import Goal
from tests.contract.conftest import MEMORY, POSTGRESQL, SQLITE_FILE
from tests.one_best_seed import (
    ONE_BEST,
    ONE_GOAL,
    ONE_RUNS,
    STOPPED_EARLY,
    TWO_BEST,
    TWO_FRONT,
    TWO_GOAL,
    TWO_RUNS,
    seed_one,
    seed_two,
)


class OneBestContract:
    backend: str

    def test_feasibility_is_judged_on_the_best_result(self, store):
        seeded = seed_one(store)
        board = {r.trial_id: r for r in store.reader.leaderboard(seeded.run, "loss", "min")}
        # o-0's best loss (0.1) was at iteration 2, whose latency (9.0) breaks "latency <= 5".
        assert (board["o-0"].best_value, board["o-0"].best_iteration) == (0.1, 2)
        assert board["o-0"].feasible is False
        assert board["o-0"].violations == {"latency <= 5.0": 4.0}
        assert board["o-1"].feasible is True
        ranking = {r.trial_id: r.feasible for r in store.reader.ranking(seeded.run, "loss", "min")}
        assert ranking == {t: r.feasible for t, r in board.items()}
        page = store.reader.ranked_page(seeded.run, "loss", "min")
        assert {t.trial_id: t.feasible for _, t in page.rows} == ranking
        assert {t.trial_id: t.violations for _, t in page.rows}["o-0"] == {"latency <= 5.0": 4.0}
        # Every feasible trial ranks before o-0.
        order = [t.trial_id for _, t in page.rows]
        assert order.index("o-0") > max(order.index(t) for t in ("o-1", "o-2", "o-3"))

    def test_the_page_s_best_trial_is_the_first_that_ended_terminated(self, store):
        seeded = seed_one(store)
        page = store.reader.ranked_page(seeded.run, "loss", "min")
        assert page.rows[0][1].trial_id == "o-2"  # ERROR: listed first, not the best
        assert page.best_trial_id == ONE_BEST

    def test_the_history_s_best_trial_is_select_best_s(self, store):
        one, two = seed_one(store), seed_two(store)
        [line] = store.reader.experiment_history(one.experiment).runs
        assert (line.best_trial_id, line.best_value) == (ONE_BEST, 0.3)
        [line] = store.reader.experiment_history(two.experiment).runs
        assert (line.best_trial_id, line.best_value) == (TWO_BEST, 0.9)
        # The line stored when the run ends gives the same.
        store.finish_experiment_run(one.run, "SUCCESS")
        [line] = store.reader.experiment_history(one.experiment).runs
        assert line.best_trial_id == ONE_BEST
        assert [p.best_value for p in store.reader.experiment_trend(one.experiment)] == [0.3]

    def test_the_pareto_board_ranks_only_the_trials_that_ended_terminated(self, store):
        seeded = seed_two(store)
        board = store.reader.pareto_leaderboard(seeded.run, ["val_acc", "latency"], ["max", "min"])
        assert board.front_trial_ids == TWO_FRONT
        ranks = {r.trial_id: r.pareto_rank for r in board.rows}
        assert ranks == {"q-0": 0, "q-1": 0, "q-2": 1, "q-3": None, "q-4": None}

    def test_the_board_says_how_each_trial_ended(self, store):
        # BoardRow.stop_kind was always None: the board did not read the column.
        for seeded, goal, runs in (
            (seed_one(store), ONE_GOAL, ONE_RUNS),
            (seed_two(store), TWO_GOAL, TWO_RUNS),
        ):
            board = store.reader.board(seeded.run, Goal.of(goal["metric"], goal["mode"]))
            expected = {
                trial_id: None
                if status.value != "TERMINATED"
                else ("scheduler" if trial_id in STOPPED_EARLY else "finished")
                for trial_id, (status, _) in runs.items()
            }
            assert {r.trial_id: r.stop_kind for r in board.rows} == expected
            # The page reads the same column: its early-stopped filter keeps the same trials.
            if len(board.goal.metrics) == 1:
                page = store.reader.ranked_page(seeded.run, "loss", "min", stopped="early")
                assert {t.trial_id for _, t in page.rows} == STOPPED_EARLY & set(runs)
                every = store.reader.ranked_page(seeded.run, "loss", "min")
                assert {t.trial_id: t.stop_kind for _, t in every.rows} == expected


class TestInMemorySQLite(OneBestContract):
    backend = MEMORY


class TestSQLiteFile(OneBestContract):
    backend = SQLITE_FILE


@pytest.mark.postgres
class TestPostgreSQL(OneBestContract):
    backend = POSTGRESQL
