"""Contract of an experiment's constraints in the trials DB, on every backend: stored by
``ensure_experiment(constraints=...)`` (migration 0011), read back on the experiment record, and
judged on each trial's last result by both leaderboards, which rank feasible trials first."""

from __future__ import annotations

import pytest

from airflow_trials.core.end import TrialEnd
from airflow_trials.core.fate import Transition
from airflow_trials.core.status import TrialStatus
from tests.contract.conftest import MEMORY, POSTGRESQL, SQLITE_FILE
from tests.factories import add_results
from tests.pareto_seed import EXPERIMENT, METRICS, MODES, seed_pareto_store

# Of the seeded trials' last results only p-1 (latency 10) and p-8 (latency 1) meet it.
FAST = ["latency <= 20"]
FAST_KEY = "latency <= 20.0"


def one_metric_run(store, constraints: list[str] | None) -> int:
    """An experiment of one metric (min loss) whose trials' bests the store maintains."""
    store.ensure_experiment("one", metric="loss", mode="min", constraints=constraints)
    run = store.create_experiment_run("one", "r1")
    lasts = {
        "o-0": {"loss": 0.1, "latency": 9.0},  # the best loss, but too slow
        "o-1": {"loss": 0.3, "latency": 2.0},
        "o-2": {"loss": 0.2, "latency": 4.0},
        "o-3": {"loss": 0.05},  # the lowest loss, no latency: not known to be feasible
    }
    for trial_id, last in lasts.items():
        store.upsert_trial(
            trial_id,
            trainable="pkg.train:fn",
            config={"x": trial_id},
            resources={"cpu": 1},
            max_failures=0,
            experiment_run_id=run,
        )
        store.record_transition(trial_id, Transition.PLACED)
        add_results(store, trial_id, [{"training_iteration": 1, **last}])
        store.record_end(TrialEnd(trial_id, "one", TrialStatus.TERMINATED))
    return run


class ConstraintsContract:
    """Every backend must pass these; subclasses name the backend for the ``store`` fixture."""

    backend: str

    def test_constraints_are_stored_canonical_and_kept_until_given_again(self, store):
        store.ensure_experiment(
            "c", metric="loss", mode="min", constraints=["latency<=5", "acc >= .8"]
        )
        record = store.reader.get_experiment("c")
        assert record.constraint_spec == ["latency <= 5.0", "acc >= 0.8"]
        assert record.parsed_constraints().feasible({"latency": 5.0, "acc": 0.9})
        store.ensure_experiment("c", metric="loss", mode="min")  # None: left as it was
        assert store.reader.get_experiment("c").constraint_spec == ["latency <= 5.0", "acc >= 0.8"]
        store.ensure_experiment("c", constraints=[])  # empty: cleared
        cleared = store.reader.get_experiment("c")
        assert (cleared.constraints, cleared.constraint_spec) == (None, [])
        assert not cleared.parsed_constraints()

    def test_a_bad_constraint_is_refused_and_nothing_is_written(self, store):
        with pytest.raises(ValueError, match=r"Experiment bad: constraints\[0\]='latency < 5'"):
            store.ensure_experiment("bad", metric="loss", mode="min", constraints=["latency < 5"])
        assert [e.name for e in store.reader.list_experiments()] == []

    def test_the_one_metric_board_ranks_feasible_trials_first(self, store):
        run = one_metric_run(store, ["latency <= 5"])
        board = store.reader.leaderboard(run, "loss", "min")
        assert [(r.trial_id, r.feasible) for r in board] == [
            ("o-2", True),
            ("o-1", True),
            ("o-3", False),
            ("o-0", False),
        ]
        rows = {r.trial_id: r for r in board}
        assert rows["o-0"].violations == {"latency <= 5.0": 4.0}
        assert rows["o-3"].violations == {"latency <= 5.0": None}  # not reported
        assert rows["o-2"].violations == {}
        # The cut is made after feasibility: the best of two is still feasible.
        assert [r.trial_id for r in store.reader.leaderboard(run, "loss", "min", limit=2)] == [
            "o-2",
            "o-1",
        ]
        # The dashboard's ranking (the maintained bests' fast path) agrees.
        ranking = store.reader.ranking(run, "loss", "min")
        assert [(t.trial_id, t.feasible) for t in ranking] == [
            (r.trial_id, r.feasible) for r in board
        ]
        assert ranking[3].violations == {"latency <= 5.0": 4.0}

    def test_without_constraints_the_one_metric_board_is_as_before(self, store):
        run = one_metric_run(store, None)
        board = store.reader.leaderboard(run, "loss", "min")
        assert [r.trial_id for r in board] == ["o-3", "o-0", "o-2", "o-1"]
        assert {(r.feasible, r.violations) for r in board} == {(None, None)}
        assert [t.feasible for t in store.reader.ranking(run, "loss", "min")] == [None] * 4
        assert [r.trial_id for r in store.reader.leaderboard(run, "loss", "min", limit=1)] == [
            "o-3"
        ]

    def test_the_pareto_board_ranks_the_feasible_front_first(self, store):
        run = seed_pareto_store(store)
        store.ensure_experiment(EXPERIMENT, constraints=FAST)
        board = store.reader.pareto_leaderboard(run, METRICS, MODES)
        assert board.constraints == [FAST_KEY]
        assert board.front_trial_ids == ["p-1"]  # p-0 and p-3 beat it, but are too slow
        assert [(r.trial_id, r.pareto_rank, r.feasible) for r in board.rows] == [
            ("p-1", 0, True),
            ("p-0", 1, False),
            ("p-3", 1, False),
            ("p-2", 2, False),
            ("p-4", 3, False),
            ("p-5", None, False),
            ("p-6", None, False),
            ("p-7", None, False),
            ("p-8", None, True),  # feasible, but its val_acc is no number: no rank
        ]
        rows = {r.trial_id: r for r in board.rows}
        assert rows["p-0"].violations == {FAST_KEY: 10.0}
        assert rows["p-6"].violations == {FAST_KEY: None}  # NaN latency is not reported
        assert rows["p-1"].violations == {}

    def test_the_one_metric_board_of_the_pareto_run_judges_the_best_result(self, store):
        run = seed_pareto_store(store)
        store.ensure_experiment(EXPERIMENT, constraints=FAST)
        board = store.reader.leaderboard(run, "val_acc", "max")
        # p-4's best val_acc (0.99) came with latency 5: feasible, though its last result is too
        # slow. It is judged on the result whose value is ranked (store/feasibility.py).
        assert [r.trial_id for r in board] == [
            "p-4",
            "p-1",
            "p-8",
            "p-5",
            "p-6",
            "p-0",
            "p-3",
            "p-2",
            "p-7",
        ]


class TestInMemorySQLite(ConstraintsContract):
    backend = MEMORY


class TestSQLiteFile(ConstraintsContract):
    backend = SQLITE_FILE


@pytest.mark.postgres
class TestPostgreSQL(ConstraintsContract):
    backend = POSTGRESQL
