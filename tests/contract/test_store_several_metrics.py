"""Contract of an experiment's several metrics in the trials store, on every backend: stored as
one JSON object with the mode NULL, read back decoded on the experiment record, and one metric
kept exactly as before."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from airflow_trials import Trial, TrialsDbCallback
from airflow_trials.exceptions import ExperimentNotFoundError
from tests.contract.conftest import MEMORY, POSTGRESQL, SQLITE_FILE


class SeveralMetricsContract:
    backend: str

    def test_several_metrics_are_stored_as_json_with_a_null_mode(self, store):
        experiment_id = store.ensure_experiment(
            "two", metric=["val_acc", "latency"], mode=["max", "min"]
        )
        with store._engine.connect() as connection:
            stored = connection.execute(
                text("SELECT metric, mode FROM at_experiments WHERE id = :id"),
                {"id": experiment_id},
            ).one()
        assert tuple(stored) == ('{"val_acc":"max","latency":"min"}', None)
        record = store.reader.get_experiment("two")
        assert (record.id, record.metrics, record.modes) == (
            experiment_id,
            ["val_acc", "latency"],
            ["max", "min"],
        )
        assert record.several_metrics
        assert record.metric_and_mode() == (["val_acc", "latency"], ["max", "min"])
        # Each metric gets its leaderboard index, so ranking by one of them stays fast.
        assert {"val_acc", "latency"} <= store._db.indexed_metrics

    def test_one_metric_is_stored_as_before_and_read_as_a_list_of_one(self, store):
        store.ensure_experiment("one", metric="loss", mode="min")
        [record] = store.reader.list_experiments()
        assert (record.metric, record.mode) == ("loss", "min")
        assert (record.metrics, record.modes, record.several_metrics) == (
            ["loss"],
            ["min"],
            False,
        )
        assert record.metric_and_mode() == ("loss", "min")
        store.ensure_experiment("bare")
        bare = store.reader.get_experiment("bare")
        assert (bare.metrics, bare.modes, bare.metric_and_mode()) == ([], [], (None, None))

    def test_switching_between_one_and_several_metrics(self, store):
        store.ensure_experiment("exp", metric="loss", mode="min")
        store.ensure_experiment("exp", metric=["acc", "loss"], mode=["max", "min"])
        record = store.reader.get_experiment("exp")
        assert (record.mode, record.metrics, record.modes) == (
            None,
            ["acc", "loss"],
            ["max", "min"],
        )
        store.ensure_experiment("exp", metric="acc", mode="max")
        record = store.reader.get_experiment("exp")
        assert (record.metric, record.mode, record.metrics) == ("acc", "max", ["acc"])

    @pytest.mark.parametrize(
        ("metric", "mode", "match"),
        [
            (["acc", "loss"], ["max"], "2 metrics but mode=\\['max'\\] has 1 modes"),
            (["acc", "loss"], "max", "is a list but mode='max' is not"),
            ("acc", ["max", "min"], "is a list but metric='acc' is not"),
            (["acc", "acc"], ["max", "max"], "more than once"),
            (["acc", "loss"], ["max", "lowest"], "'min' .* or 'max'"),
            (['say "hi"', "loss"], ["max", "min"], "cannot be ranked by"),
            ([], [], "names no metric"),
        ],
    )
    def test_bad_metric_lists_are_refused_and_nothing_is_written(self, store, metric, mode, match):
        with pytest.raises(ValueError, match=match) as raised:
            store.ensure_experiment("bad", metric=metric, mode=mode)
        assert "bad" in str(raised.value) or "Metric name" in str(raised.value)
        assert store.reader.list_experiments() == []

    def test_get_experiment_names_the_known_experiments_when_missing(self, store):
        store.ensure_experiment("mnist")
        with pytest.raises(ExperimentNotFoundError, match="'cifar' is not in .*mnist"):
            store.reader.get_experiment("cifar")

    def test_trials_db_callback_records_several_metrics_for_the_pareto_front(self, store):
        recorder = TrialsDbCallback(
            metric=["val_acc", "latency"], mode=["max", "min"], store=store, run_key="engine-1"
        )
        reported = {"fast": (0.8, 2.0), "good": (0.9, 9.0), "worse": (0.7, 9.5)}
        trials = [
            Trial("tests.trainables:quadratic", {"x": i}, trial_id=trial_id, experiment_name="two")
            for i, trial_id in enumerate(reported)
        ]
        for trial in trials:
            recorder.on_trial_start(trial)
            val_acc, latency = reported[trial.trial_id]
            trial.record_result({"training_iteration": 1, "val_acc": val_acc, "latency": latency})
            recorder.on_trial_result(trial, dict(trial.last_result))
        recorder.on_step_end(trials)
        for trial in trials:
            recorder.on_trial_complete(trial)
        recorder.on_experiment_end(trials)
        record = store.reader.get_experiment("two")
        assert (record.metrics, record.modes) == (["val_acc", "latency"], ["max", "min"])
        grid = recorder.result_grid()
        assert (grid.metric, grid.mode) == (["val_acc", "latency"], ["max", "min"])
        assert [r.trial_id for r in grid.get_pareto_front()] == ["fast", "good"]

    def test_trials_db_callback_refuses_metric_lists_that_do_not_pair_up(self, store):
        with pytest.raises(ValueError, match="TrialsDbCallback: metric=.* has 2 metrics"):
            TrialsDbCallback(metric=["val_acc", "latency"], mode=["max"], store=store)
        with pytest.raises(ValueError, match="TrialsDbCallback got mode='lowest'"):
            TrialsDbCallback(metric="loss", mode="lowest", store=store)


class TestInMemorySQLite(SeveralMetricsContract):
    backend = MEMORY


class TestSQLiteFile(SeveralMetricsContract):
    backend = SQLITE_FILE


@pytest.mark.postgres
class TestPostgreSQL(SeveralMetricsContract):
    backend = POSTGRESQL
