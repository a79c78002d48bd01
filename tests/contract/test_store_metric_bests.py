"""Contract of the kept bests of an experiment of several metrics (migration 0021), on every
backend: each trial keeps its best of each metric in both modes as its results are written, a
ranking by one of the metrics reads them (no probe of the results) and agrees with the probe,
a run whose trials do not keep them (results from before the migration) is ranked by the probe
until ``recompute_best``, and the upgrade and downgrade leave the schema as the models say."""

from __future__ import annotations

import math
from typing import Any

import pytest
from sqlalchemy import select, text, update
from sqlalchemy.orm import Session

from airflow_trials.store.leaderboard import maintained_best_columns
from airflow_trials.store.migration import current_revision
from airflow_trials.store.models import ExperimentRunRow, TrialRow
from tests.contract.conftest import MEMORY, POSTGRESQL, SQLITE_FILE
from tests.contract.test_store import HEAD_REVISION, register, schema_differences
from tests.contract.test_store_stop_reason import _migrate
from tests.factories import add_results

#: (trial, [(iteration, loss, accuracy)]) of the run below; None: the metric not reported.
RESULTS: list[tuple[str, list[tuple[int, Any, Any]]]] = [
    ("a", [(1, 0.9, 0.5), (2, 0.3, 0.8), (3, 0.3, 0.8)]),  # ties: the earliest iteration
    ("b", [(1, 0.5, 0.9), (2, -math.inf, math.inf), (3, 0.6, "0.99")]),  # inf, a string
    ("c", [(1, None, 0.7), (2, True, 0.6)]),  # never a loss (a bool is not a number)
    ("d", [(1, 0.2, None)]),
]

#: (trial, best value, its iteration) in each ranking, as the probe of the results gives them.
EXPECTED = {
    ("loss", "min"): [("d", 0.2, 1), ("a", 0.3, 2), ("b", 0.5, 1), ("c", None, None)],
    ("loss", "max"): [("a", 0.9, 1), ("b", 0.6, 3), ("d", 0.2, 1), ("c", None, None)],
    ("accuracy", "max"): [("b", 0.9, 1), ("a", 0.8, 2), ("c", 0.7, 1), ("d", None, None)],
    ("accuracy", "min"): [("a", 0.5, 1), ("c", 0.6, 2), ("b", 0.9, 1), ("d", None, None)],
}


def _two_metric_run(store: Any) -> int:
    store.ensure_experiment("pareto", metric=["loss", "accuracy"], mode=["min", "max"])
    run = store.create_experiment_run("pareto", "r1")
    for trial_id, rows in RESULTS:
        register(store, trial_id, run)
        add_results(
            store,
            trial_id,
            [
                {
                    "training_iteration": i,
                    **({} if loss is None else {"loss": loss}),
                    **({} if accuracy is None else {"accuracy": accuracy}),
                }
                for i, loss, accuracy in rows
            ],
        )
    return run


def _ranked(store: Any, run: int, metric: str, mode: str) -> list[tuple[Any, ...]]:
    rows = store.reader.leaderboard(run, metric, mode)
    return [(r.trial_id, r.best_value, r.best_iteration) for r in rows]


def _kept(store: Any, run: int, metric: str, mode: str) -> bool:
    """Does the ranking read the trials' kept bests rather than probe their results?"""
    with Session(store._engine) as session:
        row = session.get(ExperimentRunRow, run)
        return maintained_best_columns(session, row, metric, mode) is not None


class MetricBestsContract:
    backend: str

    def test_each_metric_is_ranked_from_the_kept_bests_as_the_probe_ranks_it(self, store):
        run = _two_metric_run(store)
        for (metric, mode), expected in EXPECTED.items():
            assert _kept(store, run, metric, mode), (metric, mode)
            assert _ranked(store, run, metric, mode) == expected, (metric, mode)
            ranking = store.reader.ranking(run, metric, mode)
            assert [r.trial_id for r in ranking] == [t for t, _, _ in expected]
        with store._engine.connect() as connection:
            kept = dict(
                connection.execute(
                    select(TrialRow.trial_id, TrialRow.metric_bests).where(
                        TrialRow.trial_id.in_(["a", "c"])
                    )
                ).all()
            )
        assert kept["a"] == {
            "loss": {"min": [0.3, 2], "max": [0.9, 1]},
            "accuracy": {"min": [0.5, 1], "max": [0.8, 2]},
        }
        assert kept["c"] == {"loss": {}, "accuracy": {"min": [0.6, 2], "max": [0.7, 1]}}
        # A metric the experiment does not have is probed, as before.
        assert not _kept(store, run, "epoch_time", "min")

    def test_new_results_fold_in_and_a_later_better_one_takes_the_lead(self, store):
        run = _two_metric_run(store)
        add_results(store, "c", [{"training_iteration": 3, "loss": 0.1, "accuracy": 0.95}])
        assert _ranked(store, run, "loss", "min")[0] == ("c", 0.1, 3)
        assert _ranked(store, run, "accuracy", "max")[0] == ("c", 0.95, 3)
        assert _ranked(store, run, "accuracy", "min")[0] == ("a", 0.5, 1)

    def test_any_result_key_is_a_metric_whose_bests_are_kept(self, store):
        # A comma, a dot, a slash and a space in a metric's name: each a key of its own.
        names = ["loss,l1", "val.acc", "a/b c"]
        store.ensure_experiment("keys", metric=names, mode=["min", "max", "min"])
        run = store.create_experiment_run("keys", "r1")
        for trial_id, value in (("x", 1.0), ("y", 2.0)):
            register(store, trial_id, run)
            add_results(store, trial_id, [{"training_iteration": 1, **{n: value for n in names}}])
        x, y = ("x", 1.0, 1), ("y", 2.0, 1)
        for name, mode, ranked in (("loss,l1", "min", [x, y]), ("val.acc", "max", [y, x])):
            assert _kept(store, run, name, mode)
            assert _ranked(store, run, name, mode) == ranked
        assert _ranked(store, run, "a/b c", "max") == [y, x]

    def test_trials_without_kept_bests_are_probed_until_recompute_best(self, store):
        run = _two_metric_run(store)
        # As results written before migration 0021 leave them: nothing kept.
        with store._engine.begin() as connection:
            connection.execute(
                update(TrialRow)
                .where(TrialRow.trial_id == "b")
                .values(best_metric=None, metric_bests=None)
            )
        assert not _kept(store, run, "loss", "min")
        assert _ranked(store, run, "loss", "min") == EXPECTED[("loss", "min")]
        assert store.recompute_best(run) == 4
        for (metric, mode), expected in EXPECTED.items():
            assert _kept(store, run, metric, mode)
            assert _ranked(store, run, metric, mode) == expected

    def test_upgrade_from_0020_keeps_nothing_and_downgrade_drops_the_column(self, store):
        if self.backend == MEMORY:
            pytest.skip("sqlite:// is a new, empty database per engine: nothing to upgrade")
        run = _two_metric_run(store)
        engine = store._write_engine
        _migrate(engine, "0020", upgrade=False)
        with engine.connect() as connection:
            columns = connection.execute(text("SELECT * FROM at_trials")).keys()
        assert "metric_bests" not in columns
        _migrate(engine, "head", upgrade=True)
        assert current_revision(engine) == HEAD_REVISION
        assert schema_differences(store) == []
        # The upgrade keeps nothing: the probe ranks until the bests are recomputed.
        assert not _kept(store, run, "loss", "min")
        assert _ranked(store, run, "loss", "min") == EXPECTED[("loss", "min")]
        store.recompute_best(run)
        assert _kept(store, run, "loss", "min")
        assert _ranked(store, run, "loss", "min") == EXPECTED[("loss", "min")]


class TestInMemorySQLite(MetricBestsContract):
    backend = MEMORY


class TestSQLiteFile(MetricBestsContract):
    backend = SQLITE_FILE


@pytest.mark.postgres
class TestPostgreSQL(MetricBestsContract):
    backend = POSTGRESQL
