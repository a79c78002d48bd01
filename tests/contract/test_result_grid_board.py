"""ResultGrid answers every question through the run's board (issue 48, "one ranking model"):
another metric, scope="last", every status, other constraints. On the runs every screen checks
(tests/one_best_seed.py), on each backend, its answers are the ones it gave when it ranked in
Python, and each is the board's answer to the same question (TrialReader.board's options)."""

from __future__ import annotations

import pandas as pd
import pytest

from airflow_trials import ResultGrid
from airflow_trials.core.constraints import COUNTED_STATUSES, EVERY_STATUS, Constraints
from airflow_trials.core.goal import Goal
from tests.contract.conftest import POSTGRESQL, SQLITE_FILE
from tests.one_best_seed import CONSTRAINTS, TWO_FRONT, TWO_GOAL, seed_one, seed_two

# (metric, mode, scope, terminated_only, constraints judged) -> the best trial, as ranked in
# Python before: o-2 (ERROR) and o-3 (RUNNING) count when every status does; o-0's best loss
# (0.1) breaks the constraint, its last (0.4) meets it; o-4 (0.15) breaks it.
ONE_ANSWERS = [
    (None, None, "last", False, CONSTRAINTS, "o-2"),  # Ray Tune's defaults
    (None, None, "all", False, CONSTRAINTS, "o-2"),
    (None, None, "last", True, CONSTRAINTS, "o-1"),
    (None, None, "all", True, CONSTRAINTS, "o-1"),  # select_best's question
    (None, None, "all", True, [], "o-0"),  # no constraint: its best loss wins
    (None, None, "last", True, [], "o-4"),
    ("latency", "min", "last", True, CONSTRAINTS, "o-0"),  # another metric
    ("loss", "max", "all", False, CONSTRAINTS, "o-0"),  # another mode: o-0 at 0.5, feasible
]


def _board_best(store, run, metric, mode, scope, terminated_only, constraints) -> str | None:
    goal = Goal.of(metric or "loss", mode or "min")
    return store.reader.board(
        run,
        goal,
        judged="best" if scope == "all" else "last",
        counted=COUNTED_STATUSES if terminated_only else EVERY_STATUS,
        constraints=Constraints.parse(constraints),
    ).best_trial_id


class ResultGridBoardContract:
    @pytest.mark.parametrize(
        ("metric", "mode", "scope", "terminated_only", "constraints", "expected"), ONE_ANSWERS
    )
    def test_get_best_result_is_the_board_s_answer(
        self, store, monkeypatch, metric, mode, scope, terminated_only, constraints, expected
    ):
        seeded = seed_one(store)
        grid = ResultGrid.from_db(seeded.experiment, store=store, constraints=constraints)
        asked = []
        board = grid._store.board
        monkeypatch.setattr(
            grid._store, "board", lambda *a, **k: asked.append((a, k)) or board(*a, **k)
        )
        best = grid.get_best_result(metric, mode, scope=scope, terminated_only=terminated_only)
        # Only select_best's own question is answered by the board read when the grid was opened.
        own = (scope, terminated_only, constraints) == ("all", True, CONSTRAINTS) and metric is None
        assert len(asked) == (0 if own else 1)
        question = (metric, mode, scope, terminated_only, constraints)
        assert best.trial_id == expected == _board_best(store, seeded.run, *question)

    def test_get_best_result_of_an_infeasible_mode_is_judged_on_its_best_result(self, store):
        """max loss over every result: o-0's best (0.5, iteration 1) meets the constraint."""
        seeded = seed_one(store)
        grid = ResultGrid.from_db(seeded.experiment, store=store)
        assert grid.get_best_result("loss", "max", scope="all").metrics["loss"] == 0.4  # its last
        assert grid.get_best_result("loss", "max", scope="last").trial_id == "o-0"

    def test_the_front_and_pareto_ranks_of_other_questions_are_the_board_s(self, store):
        seeded = seed_two(store)
        grid = ResultGrid.from_db(seeded.experiment, store=store)
        every = grid.get_pareto_front(terminated_only=False)
        # q-3 (ERROR) beats every trial on both metrics once every status counts.
        assert [r.trial_id for r in every] == ["q-3"]
        assert sorted(r.trial_id for r in grid.get_pareto_front()) == TWO_FRONT
        reversed_goal = Goal.of(
            list(reversed(TWO_GOAL["metric"])), list(reversed(TWO_GOAL["mode"]))
        )
        board = store.reader.board(seeded.run, reversed_goal, counted=EVERY_STATUS)
        assert board.front_trial_ids == ["q-3"]
        frame = grid.get_dataframe(
            pareto_metric=list(reversed_goal.metrics), pareto_mode=list(reversed_goal.modes)
        ).set_index("trial_id")
        ranked = store.reader.board(seeded.run, reversed_goal)
        assert {t: (None if pd.isna(r) else int(r)) for t, r in frame["pareto_rank"].items()} == {
            r.trial_id: r.pareto_rank for r in ranked.rows
        }

    def test_the_board_refuses_a_result_it_cannot_judge(self, store):
        seeded = seed_one(store)
        with pytest.raises(ValueError, match="judged must be 'best' or 'last'"):
            store.reader.board(seeded.run, Goal.of("loss", "min"), judged="first")


class TestSQLiteFile(ResultGridBoardContract):
    backend = SQLITE_FILE


@pytest.mark.postgres
class TestPostgreSQL(ResultGridBoardContract):
    backend = POSTGRESQL
