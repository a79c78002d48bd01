"""Contract of the leaderboard of several metrics (``TrialReader.pareto_leaderboard``), on every
backend: trials by Pareto rank over their last results, then the first metric in its mode, then
trial id; those without a rankable value of every metric last."""

from __future__ import annotations

import pytest

from airflow_trials.core.fate import Transition
from airflow_trials.exceptions import StoreError
from airflow_trials.store import ParetoBoard, TrialStore
from tests.contract.conftest import MEMORY, POSTGRESQL, SQLITE_FILE
from tests.factories import add_results
from tests.pareto_seed import FRONT, METRICS, MODES, ORDER, RANKS, seed_pareto_store


class ParetoBoardContract:
    """Every backend must pass these; subclasses name the backend for the ``store`` fixture."""

    backend: str

    def test_trials_are_ordered_by_pareto_rank_then_the_first_metric_then_trial_id(self, store):
        run = seed_pareto_store(store)
        board = store.reader.pareto_leaderboard(run, METRICS, MODES)
        assert isinstance(board, ParetoBoard)
        assert (board.metrics, board.modes, board.front_trial_ids) == (METRICS, MODES, FRONT)
        assert [r.trial_id for r in board.rows] == ORDER
        assert {r.trial_id: r.pareto_rank for r in board.rows} == {t: RANKS.get(t) for t in ORDER}
        assert [r.trial_id for r in board.rows if r.on_front] == ["p-0", "p-3", "p-1"]
        rows = {r.trial_id: r for r in board.rows}
        assert rows["p-0"].values == {"val_acc": 0.9, "latency": 30.0}
        assert (rows["p-0"].iteration, rows["p-0"].latest_checkpoint) == (2, "/ckpt/p-0/2")
        assert rows["p-8"].values == {"val_acc": None, "latency": 1.0}  # a string is no value
        assert (rows["p-7"].iteration, rows["p-7"].latest_checkpoint) == (None, None)

    def test_a_new_last_result_moves_the_trial(self, store):
        run = seed_pareto_store(store)
        # p-2's new last result beats every trial of the front on both metrics.
        add_results(store, "p-2", [{"training_iteration": 2, "val_acc": 0.97, "latency": 4.0}])
        board = store.reader.pareto_leaderboard(run, METRICS, MODES)
        assert board.front_trial_ids == ["p-2"]
        assert [(r.trial_id, r.pareto_rank) for r in board.rows[:4]] == [
            ("p-2", 0),
            ("p-0", 1),
            ("p-3", 1),
            ("p-1", 1),
        ]

    def test_the_modes_decide_who_is_on_the_front(self, store):
        run = seed_pareto_store(store)
        # Lower val_acc and higher latency are now better: p-4 (0.6, 50) beats everyone.
        board = store.reader.pareto_leaderboard(run, METRICS, ["min", "max"])
        assert board.front_trial_ids == ["p-4"] and board.rows[0].trial_id == "p-4"
        # One metric alone, as a list of one: a plain ranking by its last values.
        latency = store.reader.pareto_leaderboard(run, ["latency"], ["min"])
        assert [r.trial_id for r in latency.rows[:3]] == ["p-8", "p-1", "p-0"]
        assert latency.front_trial_ids == ["p-8"]

    def test_a_limit_cuts_the_rows_but_not_the_front(self, store):
        run = seed_pareto_store(store)
        board = store.reader.pareto_leaderboard(run, METRICS, MODES, limit=1)
        assert [r.trial_id for r in board.rows] == ["p-0"]
        assert board.front_trial_ids == FRONT

    def test_a_run_without_trials_or_results_has_an_empty_front(self, store):
        store.ensure_experiment("empty")
        run = store.create_experiment_run("empty", "r1")
        assert store.reader.pareto_leaderboard(run, METRICS, MODES) == ParetoBoard(
            METRICS, MODES, [], []
        )
        store.upsert_trial(
            "e-0",
            trainable="pkg.train:fn",
            config={},
            resources={"cpu": 1},
            max_failures=0,
            experiment_run_id=run,
        )
        store.record_transition("e-0", Transition.PLACED)
        (row,) = store.reader.pareto_leaderboard(run, METRICS, MODES).rows
        assert (row.trial_id, row.pareto_rank, row.on_front) == ("e-0", None, False)

    @pytest.mark.parametrize(
        ("metrics", "modes", "limit", "message"),
        [
            (["val_acc", "latency"], ["max"], None, "has 2 metrics but mode"),
            (["val_acc", "val_acc"], ["max", "max"], None, "more than once"),
            (["val_acc", 'la"tency'], ["max", "min"], None, "cannot be ranked by"),
            (["val_acc", "latency"], ["max", "best"], None, "must be 'min'"),
            (["val_acc", "latency"], ["max", "min"], 0, "limit must be at least 1"),
        ],
    )
    def test_bad_arguments_are_refused_naming_the_fix(self, store, metrics, modes, limit, message):
        run = seed_pareto_store(store)
        with pytest.raises(ValueError, match=message):
            store.reader.pareto_leaderboard(run, metrics, modes, limit=limit)

    def test_an_unknown_run_is_a_store_error_naming_it(self, store):
        with pytest.raises(StoreError, match="experiment run 999 is not in the trial store"):
            store.reader.pareto_leaderboard(999, METRICS, MODES)


class TestInMemorySQLite(ParetoBoardContract):
    backend = MEMORY


class TestSQLiteFile(ParetoBoardContract):
    backend = SQLITE_FILE


@pytest.mark.postgres
class TestPostgreSQL(ParetoBoardContract):
    backend = POSTGRESQL


def test_the_store_hands_out_the_reader_s_leaderboard(tmp_path):
    store = TrialStore(f"sqlite:///{tmp_path / 'trials.db'}", create=True)
    try:
        run = seed_pareto_store(store)
        assert store.reader.pareto_leaderboard(
            run, METRICS, MODES
        ) == store.reader.pareto_leaderboard(run, METRICS, MODES)
    finally:
        store.dispose()
