"""Contract of TrialStore, run unchanged against in-memory SQLite, a SQLite file and PostgreSQL."""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import random
import string
import subprocess
import sys
import threading
import warnings
from collections.abc import Callable
from datetime import UTC
from typing import Any

import numpy as np
import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import event, func, select, text
from sqlalchemy.exc import DataError, SQLAlchemyError

from airflow_trials import InvalidTransitionError, StoreError, TrialNotFoundError, TrialStatus
from airflow_trials.core.end import TrialEnd
from airflow_trials.core.fate import Transition, after_failure
from airflow_trials.core.update import TrialUpdate
from airflow_trials.experiment import run_seed
from airflow_trials.store import (
    RestartFromScratch,
    StopForTry,
    TrialStore,
    default_store_url,
    migrate,
)
from airflow_trials.store.__main__ import main as store_cli
from airflow_trials.store.engine import WRITE_OPTION, create_store_engine
from airflow_trials.store.experiments import RunAlreadyEndedError
from airflow_trials.store.leaderboard import metric_index_name
from airflow_trials.store.migration import (
    VERSION_TABLE,
    alembic_config,
    current_revision,
    include_object,
    upgrade_engine,
)
from airflow_trials.store.models import Base, CheckpointRow, ResultRow, TrialRow
from tests.contract.conftest import (
    MEMORY,
    POSTGRESQL,
    SQLITE_FILE,
    fail_setting_last_result,
    new_postgres_schema,
)
from tests.factories import add_checkpoint, add_results, ensure_metric_index, update_trial

HEAD_REVISION = "0021"


def register(store: TrialStore, trial_id: str, run: int | None = None, **kwargs: Any) -> None:
    store.upsert_trial(
        trial_id,
        trainable="tests.trainables:quadratic",
        config=kwargs.pop("config", {"x": 1}),
        resources={"cpu": 1},
        max_failures=kwargs.pop("max_failures", 2),
        experiment_run_id=run,
        **kwargs,
    )


def results(iterations, **metrics: Any) -> list[dict[str, Any]]:
    return [
        {"training_iteration": i, "timestamp": 1_700_000_000.0 + i, "loss": 10.0 - i, **metrics}
        for i in iterations
    ]


def count(store: TrialStore, model: Any, **where: Any) -> int:
    query = select(func.count()).select_from(model)
    for column, value in where.items():
        query = query.where(getattr(model, column) == value)
    with store._engine.connect() as connection:
        return connection.execute(query).scalar_one()


def run_in_threads(
    targets: list[Callable[[], None]], timeout_seconds: float = 240
) -> list[BaseException]:
    """Run each target in a thread of its own, all at once; returns what they raised."""
    errors: list[BaseException] = []

    def guarded(target: Callable[[], None]) -> None:
        try:
            target()
        except BaseException as e:  # noqa: BLE001 - returned to the test
            errors.append(e)

    threads = [threading.Thread(target=guarded, args=(target,)) for target in targets]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=timeout_seconds)
    return errors


def random_run_id(rng: random.Random) -> str:
    """An Airflow-like run id, or now and then any printable text (run ids are user input)."""
    if rng.random() < 0.2:
        alphabet = string.printable + "äöüßéè漢字🙂"
        return "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 80)))
    kind = rng.choice(["manual", "scheduled", "backfill", "asset_triggered"])
    stamp = f"{rng.randint(2020, 2030)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
    clock = f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:00+00:00"
    return f"{kind}__{stamp}T{clock}_{rng.getrandbits(32):x}"


def retry_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "airflow_trials.store.database"
        and r.levelno == logging.WARNING
        and "retrying in" in r.getMessage()
    ]


def schema_differences(store: TrialStore) -> list[Any]:
    with store._engine.connect() as connection, warnings.catch_warnings():
        # SQLAlchemy cannot reflect SQLite's expression indexes (the metric indexes) and says so.
        warnings.filterwarnings(
            "ignore", "Skipped unsupported reflection of expression-based index"
        )
        context = MigrationContext.configure(
            connection,
            opts={
                "version_table": VERSION_TABLE,
                "include_object": include_object,
                "compare_type": True,
                "compare_server_default": True,
            },
        )
        return compare_metadata(context, Base.metadata)


def _old_run(engine: Any, revision: str, run_key: str, seed: int) -> None:
    """Migrate the empty database to ``revision`` and add experiment 1 ('old') and its run 7."""
    with engine.execution_options(**{WRITE_OPTION: True}).begin() as connection:
        command.upgrade(alembic_config(connection), revision)
    with engine.begin() as connection:
        connection.execute(
            text(
                "INSERT INTO at_experiments (id, name, created_at) VALUES (1, 'old', "
                "CURRENT_TIMESTAMP)"
            )
        )
        connection.execute(
            text(
                "INSERT INTO at_experiment_runs (id, experiment_id, run_key, seed, status, "
                "created_at) VALUES (7, 1, :key, :seed, 'RUNNING', CURRENT_TIMESTAMP)"
            ),
            {"key": run_key, "seed": seed},
        )


class StoreContract:
    """Every backend must pass these; subclasses name the backend for the ``store`` fixture."""

    backend: str
    concurrent_writers = True

    # -- schema and migrations ---------------------------------------------------------

    def test_migrating_twice_keeps_schema_and_rows(self, store, store_url):
        experiment_id = store.ensure_experiment("mnist")
        upgrade_engine(store._engine)
        if self.backend != MEMORY:  # sqlite:// would be a new, empty database per engine
            migrate(store_url)
            migrate(store_url)
        assert current_revision(store._engine) == HEAD_REVISION
        assert store.ensure_experiment("mnist") == experiment_id
        assert [e.name for e in store.reader.list_experiments()] == ["mnist"]

    def test_migrated_schema_matches_the_models(self, store):
        assert schema_differences(store) == []

    def test_metric_index_is_left_out_of_the_schema_comparison_only(self, store):
        store.ensure_experiment("mnist", metric="val/loss", mode="min")
        with store._engine.connect() as connection:
            if self.backend == POSTGRESQL:
                exists = connection.execute(
                    text("SELECT to_regclass(:name) IS NOT NULL"),
                    {"name": metric_index_name("val/loss")},
                ).scalar_one()
            else:
                exists = connection.execute(
                    text("SELECT count(*) FROM sqlite_master WHERE name = :name"),
                    {"name": metric_index_name("val/loss")},
                ).scalar_one()
        assert exists
        assert schema_differences(store) == []

    def _leaderboard_statements(self, store: TrialStore, *args: Any, **kwargs: Any) -> list[Any]:
        """The statements (with parameters) that ``store.reader.leaderboard(*args, **kwargs)``
        runs."""
        statements: list[tuple[str, Any]] = []

        def capture(conn, cursor, statement, parameters, context, executemany):
            statements.append((statement, parameters))

        event.listen(store._engine, "before_cursor_execute", capture)
        try:
            store.reader.leaderboard(*args, **kwargs)
        finally:
            event.remove(store._engine, "before_cursor_execute", capture)
        return statements

    def _plan(self, store: TrialStore, statement: str, parameters: Any) -> list[str]:
        with store._engine.connect() as connection:
            if self.backend == POSTGRESQL:
                # Few rows: without this PostgreSQL would rightly prefer a sequential scan. A
                # table that no index can serve still shows a Seq Scan.
                connection.exec_driver_sql("SET enable_seqscan = off")
                return (
                    connection.exec_driver_sql("EXPLAIN " + statement, parameters).scalars().all()
                )
            return [
                row[-1]
                for row in connection.exec_driver_sql("EXPLAIN QUERY PLAN " + statement, parameters)
            ]

    def _full_scans(self, plan: list[str], table: str) -> list[str]:
        if self.backend == POSTGRESQL:
            return [line for line in plan if f"Seq Scan on {table}" in line]
        return [line for line in plan if line.startswith(f"SCAN {table}")]

    @pytest.mark.parametrize(("metric", "mode"), [("acc", "max"), ("acc", "min"), ("loss", "min")])
    @pytest.mark.parametrize("limit", [None, 2])
    def test_leaderboard_reads_results_through_indexes_and_checkpoints_once(
        self, store, metric, mode, limit
    ):
        """The guard on the ranking's cost (docs/benchmarks.md, bench/store_ingest.py --check):
        no full scan of at_results in any statement; the experiment's metric (``acc``, ranked by
        max) in either mode reads the maintained bests and no result; the probe path (``loss``,
        not the experiment's metric) reads each trial's best through the metric index in index
        order; the checkpoints are one statement of their own, never a lookup per ranked trial."""
        run = self._leaderboard_run(store)
        ensure_metric_index(store, "loss")
        statements = self._leaderboard_statements(store, run, metric, mode, limit=limit)
        [(rank_sql, rank_parameters)] = [
            (s, p) for s, p in statements if "ORDER BY" in s and "best_value" in s
        ]
        assert "at_checkpoints" not in rank_sql
        [(ckpt_sql, ckpt_parameters)] = [(s, p) for s, p in statements if "at_checkpoints" in s]
        for statement, parameters in statements:
            if not statement.lstrip().startswith("SELECT"):
                continue  # PostgreSQL's SET LOCAL jit
            plan = self._plan(store, statement, parameters)
            assert self._full_scans(plan, "at_results") == [], (statement, plan)
        checkpoint_plan = self._plan(store, ckpt_sql, ckpt_parameters)
        assert self._full_scans(checkpoint_plan, "at_checkpoints") == [], checkpoint_plan
        plan = self._plan(store, rank_sql, rank_parameters)
        if metric == "acc":  # the experiment's metric: maintained bests in either mode
            assert "at_results" not in rank_sql
            column = "best_value" if mode == "max" else "other_mode_best_value"
            assert f"at_trials.{column}" in rank_sql
            return
        # The metric is part of the SQL text, as in the index: a PostgreSQL generic plan could
        # not match an index expression that holds a parameter.
        values = rank_parameters.values() if isinstance(rank_parameters, dict) else rank_parameters
        assert metric not in [str(value) for value in values] and metric in rank_sql
        assert any(metric_index_name(metric) in line for line in plan), plan
        if self.backend != POSTGRESQL:
            # The probe's ORDER BY is the index order: the only sort is the final ranking.
            assert sum("TEMP B-TREE" in line for line in plan) == 1, plan

    @pytest.mark.parametrize(("metric", "mode"), [("acc", "max"), ("acc", "min"), ("loss", "min")])
    @pytest.mark.parametrize(
        ("sort", "descending", "stopped"),
        [
            ("metric", False, "all"),
            ("metric", True, "all"),
            ("trial_id", True, "all"),
            ("status", False, "early"),
            ("failures", True, "not_early"),
        ],
    )
    def test_a_leaderboard_page_is_ranked_and_sliced_in_sql(
        self, store, metric, mode, sort, descending, stopped
    ):
        """The guard on the run page's cost (docs/benchmarks.md, issue 33): every statement of
        ``ranked_page`` that reads trials returns a page (LIMIT), counts, or the ranks of the
        page's own trials; none scans at_results in full; the maintained bests read no result;
        the probe path goes through the metric index; a page in the ranking's order (by metric,
        every trial) needs no window function. At 3a63532 the page read every trial of the run
        (``TrialReader.ranking``) and ranked it in Python."""
        run = self._leaderboard_run(store)
        ensure_metric_index(store, "loss")
        statements: list[tuple[str, Any]] = []

        def capture(conn, cursor, statement, parameters, context, executemany):
            statements.append((statement, parameters))

        event.listen(store._engine, "before_cursor_execute", capture)
        try:
            page = store.reader.ranked_page(
                run, metric, mode, sort=sort, descending=descending, stopped=stopped, limit=2
            )
        finally:
            event.remove(store._engine, "before_cursor_execute", capture)
        assert len(page.rows) <= 2 and page.num_trials == 5
        reads = [(s, p) for s, p in statements if "FROM at_trials" in " ".join(s.split())]
        assert reads
        for statement, parameters in reads:
            flat = " ".join(statement.split())
            paged = "LIMIT" in flat or "count(" in flat or ".trial_id IN (" in flat
            assert paged, statement  # never every trial's row
            assert self._full_scans(self._plan(store, statement, parameters), "at_results") == []
            if metric == "acc":  # the experiment's metric: maintained bests in either mode
                assert "at_results" not in flat, statement
        in_rank_order = sort == "metric" and not descending and stopped == "all"
        windows = [s for s, _ in statements if "row_number" in s]
        # The experiment's metric in its own mode is the order of ix_at_trials_run_best: on
        # SQLite a page off it counts its ranks in the index (store/page_ranks.py), no window.
        index_order = (metric, mode) == ("acc", "max") and self.backend != POSTGRESQL
        assert windows == [] if in_rank_order or index_order else len(windows) <= 1
        if index_order and in_rank_order:
            # Its page and leaders are read in the index's order: no sort of the run's trials.
            # (The best trial, looked for past the leaders among the trials that count only when
            # none of them counts, as here, sorts those.)
            ordered = [(s, p) for s, p in reads if "ORDER BY" in s and "status IN" not in s]
            plans = [self._plan(store, s, p) for s, p in ordered]
            # (max: the index read backwards, its ties by trial id sorted: "RIGHT PART OF").
            full_sorts = [line for p in plans for line in p if line.endswith("B-TREE FOR ORDER BY")]
            assert plans and full_sorts == [], plans
        if metric == "loss":  # not the experiment's: each result read through the metric index
            plans = [self._plan(store, s, p) for s, p in reads]
            probing = [plan for plan in plans if any("at_results" in line for line in plan)]
            assert probing
            for plan in probing:
                assert any(metric_index_name(metric) in line for line in plan), plan

    def test_upgrade_from_0002_keeps_runs_and_then_takes_seeds_past_int32(self, store_url):
        if self.backend == MEMORY:
            pytest.skip("sqlite:// is a new, empty database per engine: nothing to upgrade")
        engine = create_store_engine(store_url)
        try:
            _old_run(engine, "0002", "before-0003", 2147483647)
            with engine.begin() as connection:
                connection.execute(
                    text(
                        "INSERT INTO at_trials (trial_id, experiment_run_id, trainable, config, "
                        "resources, "
                        "status, max_failures, created_at, updated_at) VALUES ('t-old', 7, 'm:f', "
                        "'{}', '{}', "
                        "'PENDING', 0, CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)"
                    )
                )
            if self.backend == POSTGRESQL:
                # The defect this revision fixes: at 0002 PostgreSQL refuses such a seed.
                with pytest.raises(DataError, match="out of range"), engine.begin() as connection:
                    connection.execute(text("UPDATE at_experiment_runs SET seed = 4294967295"))
            upgrade_engine(engine)
            assert current_revision(engine) == HEAD_REVISION
        finally:
            engine.dispose()
        store = TrialStore(store_url)
        try:
            [old] = store.reader.list_experiment_runs("old")
            assert (old.id, old.run_key, old.seed) == (7, "before-0003", 2**31 - 1)
            assert store.reader.get_trial("t-old").experiment_run_id == 7
            new = store.create_experiment_run("old", "after-0003", seed=2**32 - 1)
            assert {r.run_key: r.seed for r in store.reader.list_experiment_runs("old")} == {
                "before-0003": 2**31 - 1,
                "after-0003": 2**32 - 1,
            }
            assert new != 7
            assert schema_differences(store) == []
        finally:
            store.dispose()

    def test_upgrade_to_0015_backfills_each_kept_best_in_the_other_mode(self, store_url):
        if self.backend == MEMORY:
            pytest.skip("sqlite:// is a new, empty database per engine: nothing to upgrade")
        engine = create_store_engine(store_url)
        json = "CAST(:m AS JSONB)" if self.backend == POSTGRESQL else ":m"
        # Per trial: (best_metric, best_mode, its results' metrics by iteration).
        trials: dict[str, tuple[str | None, str | None, list[str]]] = {
            # min kept: the highest acc, earliest on ties; a string, a bool, a null do not count.
            "lo": ("acc", "min", ['{"acc": 0.2}', '{"acc": 0.7}', '{"acc": "9"}', '{"acc": 0.7}']),
            "hi": ("acc", "max", ['{"acc": 3}', '{"acc": true}', '{"acc": null}', '{"acc": 1.5}']),
            "none": ("acc", "max", ['{"loss": 1.0}', '{"acc": "n/a"}']),
            "unkept": (None, None, ['{"acc": 0.5}']),
            "key": ("val/acc", "min", ['{"val/acc": -1}', '{"val/acc": -2.5}']),
        }
        try:
            _old_run(engine, "0013", "r", 1)
            with engine.begin() as connection:
                result_id = 0
                for trial_id, (metric, mode, metrics) in trials.items():
                    connection.execute(
                        text(
                            "INSERT INTO at_trials (trial_id, experiment_run_id, trainable, "
                            "config, resources, status, max_failures, created_at, updated_at, "
                            "best_metric, best_mode) VALUES (:t, 7, 'm:f', '{}', '{}', "
                            "'PENDING', 0, CURRENT_TIMESTAMP, CURRENT_TIMESTAMP, :metric, :mode)"
                        ),
                        {"t": trial_id, "metric": metric, "mode": mode},
                    )
                    for iteration, m in enumerate(metrics, start=1):
                        result_id += 1
                        connection.execute(
                            text(
                                "INSERT INTO at_results (id, trial_id, iteration, timestamp, "
                                f"metrics) VALUES (:id, :t, :i, 0, {json})"
                            ),
                            {"id": result_id, "t": trial_id, "i": iteration, "m": m},
                        )
            upgrade_engine(engine)
            assert current_revision(engine) == HEAD_REVISION
            columns = TrialRow.__table__.c
            with engine.connect() as connection:
                backfilled = {
                    trial_id: (value, iteration)
                    for trial_id, value, iteration in connection.execute(
                        select(
                            columns.trial_id,
                            columns.other_mode_best_value,
                            columns.other_mode_best_iteration,
                        )
                    )
                }
        finally:
            engine.dispose()
        assert backfilled == {
            "lo": (0.7, 2),
            "hi": (1.5, 4),
            "none": (None, None),
            "unkept": (None, None),
            "key": (-1.0, 1),
        }

    def test_unmigrated_database_raises_store_error_naming_the_upgrade(self, store_url):
        bare = TrialStore(store_url)
        try:
            with pytest.raises(StoreError, match="airflow_trials.store upgrade") as raised:
                bare.reader.list_experiments()
            assert isinstance(raised.value.__cause__, SQLAlchemyError)
        finally:
            bare.dispose()

    # -- experiments and runs ----------------------------------------------------------

    def test_ensure_experiment_is_idempotent_and_updates_metric_and_mode_when_given(self, store):
        first = store.ensure_experiment("mnist")
        assert store.ensure_experiment("mnist", metric="loss", mode="min") == first
        assert store.ensure_experiment("mnist") == first
        [experiment] = store.reader.list_experiments()
        assert (experiment.id, experiment.metric, experiment.mode) == (first, "loss", "min")
        store.ensure_experiment("mnist", mode="max")
        assert store.reader.list_experiments()[0].mode == "max"
        assert store.reader.list_experiments()[0].metric == "loss"
        with pytest.raises(ValueError, match="'min' or 'max'"):
            store.ensure_experiment("mnist", mode="lowest")

    def test_experiment_runs_are_idempotent_per_experiment_and_run_key(self, store):
        run = store.create_experiment_run(
            "mnist",
            "manual__2026",
            dag_id="tune",
            run_id="manual__2026",
            search_space={"lr": {"loguniform": [1e-4, 1e-1]}},
            seed=7,
            num_samples=16,
        )
        again = store.create_experiment_run(
            "mnist", "manual__2026", seed=99, search_space={"other": 1}
        )
        other_key = store.create_experiment_run("mnist", "manual__2027")
        other_experiment = store.create_experiment_run("cifar", "manual__2026")
        assert again == run
        assert len({run, other_key, other_experiment}) == 3
        records = store.reader.list_experiment_runs("mnist")
        assert [r.run_key for r in records] == ["manual__2026", "manual__2027"]
        first = records[0]
        assert (first.dag_id, first.run_id, first.seed, first.num_samples) == (
            "tune",
            "manual__2026",
            7,
            16,
        )
        assert first.search_space == {"lr": {"loguniform": [1e-4, 1e-1]}}
        assert first.status == "RUNNING" and first.ended_at is None
        assert len(store.reader.list_experiment_runs()) == 3

    def test_seeds_of_many_runs_are_stored_exactly(self, store):
        rng = random.Random(20261122)
        expected = {}
        while len(expected) < 300:
            run_id = random_run_id(rng)
            expected[run_id] = run_seed("mnist", "tune_mnist", run_id)
        assert max(expected.values()) >= 2**31, "the hashed seeds should reach past int32"
        edges = [0, 1, -1, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**40, 2**63 - 1, -(2**63)]
        expected |= {f"edge {seed}": seed for seed in edges}
        ids = {
            run_key: store.create_experiment_run("mnist", run_key, seed=seed)
            for run_key, seed in expected.items()
        }
        assert len(set(ids.values())) == len(expected)
        stored = {r.run_key: r.seed for r in store.reader.list_experiment_runs("mnist")}
        assert stored == expected
        assert {type(seed) for seed in stored.values()} == {int}

    @pytest.mark.parametrize("seed", [2**63, -(2**63) - 1, 2**64, True, 1.5, "7"])
    def test_seed_that_is_no_64_bit_integer_is_refused_naming_the_run(self, store, seed):
        with pytest.raises(
            ValueError, match=r"Seed .* of run r-big of experiment mnist .*nothing was written"
        ):
            store.create_experiment_run("mnist", "r-big", seed=seed)
        assert store.reader.list_experiment_runs() == []

    def test_numpy_seed_is_stored_as_an_int(self, store):
        store.create_experiment_run("mnist", "r1", seed=np.uint32(2**32 - 1))
        store.create_experiment_run("mnist", "r2", seed=np.int64(-(2**63)))
        assert [r.seed for r in store.reader.list_experiment_runs("mnist")] == [2**32 - 1, -(2**63)]

    def test_finishing_a_run_twice_keeps_its_end_time(self, store):
        run = store.create_experiment_run("mnist", "r1")
        store.finish_experiment_run(run, "FAILED")
        ended = store.reader.list_experiment_runs("mnist")[0].ended_at
        store.finish_experiment_run(run, "FAILED")
        assert store.reader.list_experiment_runs("mnist")[0].ended_at == ended
        store.finish_experiment_run(run, "SUCCESS")
        assert store.reader.list_experiment_runs("mnist")[0].ended_at >= ended

    def test_finish_experiment_run_sets_status_and_end_time(self, store):
        run = store.create_experiment_run("mnist", "r1")
        store.finish_experiment_run(run, "SUCCESS")
        [record] = store.reader.list_experiment_runs("mnist")
        assert record.status == "SUCCESS" and record.ended_at is not None
        store.finish_experiment_run(run, "RUNNING")
        assert store.reader.list_experiment_runs("mnist")[0].ended_at is None
        with pytest.raises(ValueError, match="RUNNING, SUCCESS, FAILED"):
            store.finish_experiment_run(run, "DONE")
        with pytest.raises(StoreError, match="experiment run 4242 .*create_experiment_run first"):
            store.finish_experiment_run(4242, "FAILED")

    def test_a_run_ended_by_hand_keeps_its_reason_until_its_next_end(self, store):
        run = store.create_experiment_run("mnist", "r1")
        store.finish_experiment_run(run, "FAILED", reason="marked failed", if_running=True)
        [record] = store.reader.list_experiment_runs("mnist")
        assert (record.status, record.end_reason) == ("FAILED", "marked failed")
        assert record.ended_at is not None
        # Ended already: refused under the row lock, and nothing changes.
        with pytest.raises(
            RunAlreadyEndedError,
            match=rf"Run r1 \(id {run}\) of experiment mnist has already ended: it is FAILED at "
            r"\d{4}-.* UTC, so nothing was changed",
        ):
            store.finish_experiment_run(run, "SUCCESS", reason="again", if_running=True)
        assert store.reader.list_experiment_runs("mnist") == [record]
        # An end that gives no reason (select_best's) replaces it; so does running again.
        store.finish_experiment_run(run, "SUCCESS")
        assert store.reader.list_experiment_runs("mnist")[0].end_reason is None
        store.finish_experiment_run(run, "FAILED", reason="by hand")
        store.finish_experiment_run(run, "RUNNING")
        assert store.reader.list_experiment_runs("mnist")[0].end_reason is None
        with pytest.raises(ValueError, match="a reason goes with an end .*nothing was written"):
            store.finish_experiment_run(run, "RUNNING", reason="x")

    # -- trials ------------------------------------------------------------------------

    def test_upsert_trial_registers_then_only_refreshes_airflow_ids(self, store):
        run = store.create_experiment_run("mnist", "r1")
        register(
            store, "t1", run, dag_id="tune", run_id="r1", task_id="trial", map_index=3, try_number=1
        )
        store.record_transition("t1", Transition.PLACED)
        update_trial(store, "t1", num_failures=1, error_msg="Traceback ...")
        add_results(store, "t1", results([1, 2]))
        before = store.reader.get_trial("t1")

        register(store, "t1", None, config={"x": 99}, max_failures=0, try_number=2)
        after = store.reader.get_trial("t1")
        assert after.try_number == 2
        assert (after.dag_id, after.run_id, after.task_id, after.map_index) == (
            "tune",
            "r1",
            "trial",
            3,
        )
        assert after.status is TrialStatus.RUNNING
        assert (after.num_failures, after.error_msg) == (1, "Traceback ...")
        assert after.last_result == before.last_result
        assert (after.config, after.max_failures, after.experiment_run_id) == ({"x": 1}, 2, run)
        assert len(store.reader.get_results("t1")) == 2

        register(store, "t1", run, task_id="trial_retry", map_index=5)
        moved = store.reader.get_trial("t1")
        assert (moved.task_id, moved.map_index, moved.try_number) == ("trial_retry", 5, 2)

    def test_trial_record_has_every_column(self, store):
        run = store.create_experiment_run("mnist", "r1")
        register(
            store,
            "t1",
            run,
            config={"lr": 0.1, "layers": [1, 2]},
            dag_id="d",
            run_id="r",
            task_id="t",
        )
        record = store.reader.get_trial("t1")
        assert record.status is TrialStatus.PENDING
        assert (record.trainable, record.config, record.resources) == (
            "tests.trainables:quadratic",
            {"lr": 0.1, "layers": [1, 2]},
            {"cpu": 1},
        )
        assert (record.num_failures, record.max_failures, record.map_index) == (0, 2, -1)
        assert record.experiment_run_id == run
        assert record.started_at is None and record.ended_at is None and record.last_result is None
        assert record.stop_reason is None
        assert (
            record.created_at.tzinfo is not None
            and record.created_at.utcoffset() == UTC.utcoffset(None)
        )
        with pytest.raises(dataclasses.FrozenInstanceError):
            record.status = TrialStatus.ERROR  # type: ignore[misc]

    def test_status_changes_set_start_and_end_times(self, store):
        register(store, "t1")
        store.record_transition("t1", Transition.PLACED)
        started = store.reader.get_trial("t1").started_at
        assert started is not None
        store.record_transition("t1", Transition.QUEUED)  # waiting again, as a paused trial waits
        store.record_transition("t1", Transition.PLACED)
        assert store.reader.get_trial("t1").started_at == started
        traceback = "Traceback (most recent call last): ..."
        store.record_transition("t1", Transition.ABANDONED, why=traceback)
        update_trial(store, "t1", num_failures=3)
        errored = store.reader.get_trial("t1")
        assert errored.ended_at is not None and errored.num_failures == 3
        assert errored.error_msg.startswith("Traceback")
        store.record_transition("t1", Transition.QUEUED)
        assert store.reader.get_trial("t1").ended_at is None

    def test_a_trial_that_finishes_after_a_retry_no_longer_shows_the_old_failure(self, store):
        register(store, "t1")
        store.record_transition("t1", Transition.PLACED)
        store.record_transition("t1", Transition.QUEUED)
        update_trial(store, "t1", num_failures=1, error_msg="Traceback ...: boom")
        store.record_transition("t1", Transition.PLACED)
        assert (
            store.reader.get_trial("t1").error_msg == "Traceback ...: boom"
        )  # still retrying: kept
        store.record_end(TrialEnd("t1", "exp", TrialStatus.TERMINATED))
        finished = store.reader.get_trial("t1")
        assert finished.error_msg is None and finished.num_failures == 1
        # An end that gives its own reason keeps it (a trial stopped because its task was cleared).
        store.record_transition("t1", Transition.QUEUED)
        store.record_transition("t1", Transition.STOPPED, why="Stopped from Airflow.")
        assert store.reader.get_trial("t1").error_msg == "Stopped from Airflow."

    def test_record_end_writes_what_the_fate_decided_in_one_call(self, store):
        register(store, "t1", try_number=1)
        queued = store.record_transition("t1", Transition.QUEUED, try_number=1)
        assert queued.status is TrialStatus.PENDING
        placed = store.record_transition("t1", Transition.PLACED, try_number=1)
        assert placed.status is TrialStatus.RUNNING
        lost = TrialEnd.lost("t1", "exp", "its Ray actor died (boom)")
        retry = after_failure("t1", 0, 2)
        assert store.record_end(lost, retry) is TrialStatus.PENDING
        record = store.reader.get_trial("t1")
        assert (record.num_failures, record.error_msg) == (1, lost.error)
        store.record_transition("t1", Transition.PLACED)
        finished = TrialUpdate(
            "t1",
            status=TrialStatus.TERMINATED,
            last_result={"training_iteration": 3},
            best_checkpoint="/c/3",
            num_results=3,
        ).end("exp", released=True)
        assert store.record_end(finished) is TrialStatus.TERMINATED
        record = store.reader.get_trial("t1")
        assert (record.status, record.num_failures, record.error_msg) == (
            TrialStatus.TERMINATED,
            1,
            None,
        )
        assert record.last_result == {"training_iteration": 3} and record.ended_at is not None
        with pytest.raises(ValueError, match="after_failure"):
            store.record_end(lost)  # an ERROR end needs its fate decided first
        assert store.reader.get_trial("t1").status is TrialStatus.TERMINATED

    def test_record_end_of_a_trial_failed_for_good_is_error_and_reset_gives_a_fresh_budget(
        self, store
    ):
        register(store, "t1")
        store.record_transition("t1", Transition.PLACED)
        fail = after_failure("t1", 2, 2)
        assert store.record_end(TrialEnd.lost("t1", "exp", "boom"), fail) is TrialStatus.ERROR
        assert store.reader.get_trial("t1").num_failures == 3
        assert store.record_transition("t1", Transition.RESET).status is TrialStatus.PENDING
        assert store.reader.get_trial("t1").num_failures == 0
        store.record_transition("t1", Transition.PLACED)
        store.record_transition(
            "t1", Transition.ABANDONED, why="its task ended without recording it"
        )
        abandoned = store.reader.get_trial("t1")
        assert (abandoned.status, abandoned.error_msg) == (
            TrialStatus.ERROR,
            "its task ended without recording it",
        )

    def test_a_stop_by_an_old_try_is_fenced_by_the_try_that_registered_the_trial(self, store):
        register(store, "t1", try_number=1)
        store.record_transition("t1", Transition.PLACED)
        register(store, "t1", try_number=2)  # the cleared task's next try registered first
        assert store.record_transition("t1", StopForTry("stopped by try 1", 1)).applied is False
        assert store.reader.get_trial("t1").status is TrialStatus.RUNNING
        assert store.record_transition("t1", StopForTry("stopped by try 2", 2)).applied is True
        stopped = store.reader.get_trial("t1")
        assert (stopped.status, stopped.error_msg) == (TrialStatus.TERMINATED, "stopped by try 2")
        # No try: unconditional, and idempotent.
        again = store.record_transition("t1", StopForTry("again", None))
        assert again.applied is True and again.status is TrialStatus.TERMINATED
        with pytest.raises(ValueError, match="StopForTry of trial t1 with why= .*carries its own"):
            store.record_transition("t1", StopForTry("late", 3), why="twice")
        assert store.reader.get_trial("t1").error_msg == "stopped by try 2"

    def test_restart_trial_starts_a_finished_trial_over_and_refuses_a_live_one(self, store):
        store.ensure_experiment("exp", metric="loss", mode="min")
        run = store.create_experiment_run("exp", "r1")
        register(store, "t1", run=run, try_number=1)
        register(store, "t2", run=run)
        store.record_transition("t1", Transition.PLACED)
        add_results(store, "t1", results(range(1, 4)))
        add_checkpoint(store, "t1", "/ckpt/t1/checkpoint_000002", 2)
        add_checkpoint(store, "t1", "/ckpt/t1/checkpoint_000003", 3)
        store.record_transition("t1", Transition.ABANDONED, why="boom")
        update_trial(store, "t1", num_failures=2)
        store.record_transition("t1", Transition.STOPPED)
        add_results(store, "t2", results(range(1, 3)))

        restarted = store.record_transition("t1", RestartFromScratch(try_number=2))

        assert restarted.status is TrialStatus.PENDING
        assert sorted(restarted.dropped_checkpoints) == [
            "/ckpt/t1/checkpoint_000002",
            "/ckpt/t1/checkpoint_000003",
        ]
        again = store.reader.get_trial("t1")
        assert (again.status, again.num_failures, again.error_msg, again.last_result) == (
            TrialStatus.PENDING,
            0,
            None,
            None,
        )
        assert (again.started_at, again.ended_at, again.try_number) == (None, None, 2)
        assert store.reader.get_results("t1") == [] and store.reader.latest_checkpoint("t1") is None
        for mode in ("min", "max"):  # t1 has no best now, in either mode
            assert [row.trial_id for row in store.reader.leaderboard(run, "loss", mode)] == [
                "t2",
                "t1",
            ]
        assert len(store.reader.get_results("t2")) == 2  # other trials keep theirs
        # It runs again as new: iteration 1 is new again, and is its best in both modes.
        assert add_results(store, "t1", results([1])) == 1
        for mode in ("min", "max"):
            [again_best] = [
                r for r in store.reader.leaderboard(run, "loss", mode) if r.trial_id == "t1"
            ]
            assert again_best.best_iteration == 1
        with pytest.raises(
            InvalidTransitionError, match="restart trial t2 from scratch: it is PENDING"
        ):
            store.record_transition("t2", RestartFromScratch())
        assert len(store.reader.get_results("t2")) == 2

    def test_invalid_transition_raises_and_writes_nothing(self, store):
        register(store, "t1")
        store.record_transition("t1", Transition.STOPPED)
        before = store.reader.get_trial("t1")
        with pytest.raises(InvalidTransitionError, match="t1 cannot go from TERMINATED to RUNNING"):
            store.record_transition("t1", Transition.PLACED, why="boom", try_number=9)
        assert store.reader.get_trial("t1") == before
        allowed = "QUEUED, PLACED, RESET, STOPPED, ABANDONED"
        with pytest.raises(ValueError, match=f"not one of {allowed}"):
            store.record_transition("t1", "DONE")
        with pytest.raises(
            TypeError,
            match="a Transition, a StopForTry, a RestartFromScratch or a ContinueWithRaisedStop",
        ):
            store.record_transition("t1", 42)  # type: ignore[arg-type]
        with pytest.raises(TypeError):  # a status changes only by a transition or an end
            update_trial(store, "t1", status="RUNNING")  # type: ignore[call-arg]
        assert store.reader.get_trial("t1") == before

    def test_list_trials_orders_and_filters(self, store):
        run_a = store.create_experiment_run("mnist", "a")
        run_b = store.create_experiment_run("cifar", "b")
        for trial_id, run in [("t3", run_a), ("t1", run_b), ("t2", run_a), ("solo", None)]:
            register(store, trial_id, run)
        assert [t.trial_id for t in store.reader.list_trials()] == ["t3", "t1", "t2", "solo"]
        assert [t.trial_id for t in store.reader.list_trials(experiment_run_id=run_a)] == [
            "t3",
            "t2",
        ]
        assert [t.trial_id for t in store.reader.list_trials(experiment_name="cifar")] == ["t1"]
        assert store.reader.list_trials(experiment_name="cifar", experiment_run_id=run_a) == []

    # -- results -----------------------------------------------------------------------

    def test_same_batch_twice_is_stored_once(self, store):
        register(store, "t1")
        batch = results(range(1, 6))
        assert add_results(store, "t1", batch) == 5
        assert add_results(store, "t1", batch) == 0
        assert add_results(store, "t1", results(range(4, 9))) == 3
        assert add_results(store, "t1", results([9, 9, 10])) == 2
        assert count(store, ResultRow, trial_id="t1") == 10
        assert [r["training_iteration"] for r in store.reader.get_results("t1")] == list(
            range(1, 11)
        )

    def test_last_result_follows_the_highest_iteration(self, store):
        register(store, "t1")
        add_results(store, "t1", results([4, 3]))
        assert store.reader.get_trial("t1").last_result["training_iteration"] == 4
        add_results(store, "t1", results([1, 2]))
        assert store.reader.get_trial("t1").last_result["training_iteration"] == 4
        add_results(store, "t1", results([7, 5, 6]))
        last = store.reader.get_trial("t1").last_result
        assert last["training_iteration"] == 7 and last["loss"] == 3.0
        assert add_results(store, "t1", []) == 0

    def test_result_without_training_iteration_rejects_the_whole_batch(self, store):
        register(store, "t1")
        batch = results([1, 2]) + [{"loss": 0.3}] + results([4])
        with pytest.raises(
            ValueError,
            match=r"Result 2 of the batch for trial t1 has no integer training_iteration",
        ):
            add_results(store, "t1", batch)
        with pytest.raises(ValueError, match="Result 0 of the batch for trial t1"):
            add_results(store, "t1", [{"training_iteration": 1.5}])
        assert store.reader.get_results("t1") == []
        assert store.reader.get_trial("t1").last_result is None

    def test_numpy_nan_and_inf_values_are_stored_as_json(self, store):
        register(store, "t1", config={"lr": np.float64(0.01), "units": np.int64(64)})
        result = {
            "training_iteration": np.int64(1),
            "timestamp": np.float64(1_700_000_000.5),
            "loss": np.float32(0.25),
            "accuracy": float("nan"),
            "grad_norm": float("inf"),
            "per_class": np.array([0.5, np.nan]),
            "flag": np.bool_(True),
            "nested": {"neg": -math.inf, 3: "three"},
        }
        assert add_results(store, "t1", [result]) == 1
        [stored] = store.reader.get_results("t1")
        assert stored == {
            "training_iteration": 1,
            "timestamp": 1_700_000_000.5,
            "loss": 0.25,
            "accuracy": None,
            "grad_norm": None,
            "per_class": [0.5, None],
            "flag": True,
            "nested": {"neg": None, "3": "three"},
        }
        assert store.reader.get_trial("t1").last_result == stored
        assert store.reader.get_trial("t1").config == {"lr": 0.01, "units": 64}

    # -- checkpoints -------------------------------------------------------------------

    def test_checkpoints_are_idempotent_and_deletion_is_marked(self, store):
        register(store, "t1")
        assert store.reader.latest_checkpoint("t1") is None
        add_checkpoint(store, "t1", "/ckpt/t1/1", 1, score=0.5)
        add_checkpoint(store, "t1", "/ckpt/t1/1", 1, score=0.5)
        add_checkpoint(store, "t1", "/ckpt/t1/3", 3, score=float("nan"))
        add_checkpoint(store, "t1", "/ckpt/t1/2", 2)
        assert count(store, CheckpointRow, trial_id="t1") == 3
        latest = store.reader.latest_checkpoint("t1")
        assert (latest.path, latest.iteration, latest.score, latest.deleted) == (
            "/ckpt/t1/3",
            3,
            None,
            False,
        )
        store.mark_checkpoint_deleted("t1", "/ckpt/t1/3")
        store.mark_checkpoint_deleted("t1", "/ckpt/t1/3")
        assert store.reader.latest_checkpoint("t1").path == "/ckpt/t1/2"
        add_checkpoint(store, "t1", "/ckpt/t1/3", 3)  # saved again where the dropped one was
        assert store.reader.latest_checkpoint("t1").path == "/ckpt/t1/3"
        assert count(store, CheckpointRow, trial_id="t1") == 3
        with pytest.raises(StoreError, match="no checkpoint at /ckpt/t1/9 .*add_checkpoint first"):
            store.mark_checkpoint_deleted("t1", "/ckpt/t1/9")

    # -- leaderboard -------------------------------------------------------------------

    def _leaderboard_run(self, store: TrialStore) -> int:
        run = store.create_experiment_run("mnist", "r1")
        store.ensure_experiment("mnist", metric="acc", mode="max")
        register(store, "a", run, config={"lr": 0.1})
        register(store, "b", run, config={"lr": 0.01})
        register(store, "c", run)
        register(store, "d", run)
        register(store, "e", run)
        other = store.create_experiment_run("mnist", "r2")
        register(store, "other", other)
        add_results(
            store,
            "a",
            [{"training_iteration": i, "acc": v} for i, v in [(1, 0.5), (2, 0.9), (3, 0.7)]],
        )
        add_results(
            store,
            "b",
            [{"training_iteration": i, "acc": v} for i, v in [(1, 0.2), (2, 0.95), (3, 0.95)]],
        )
        add_results(store, "c", [{"training_iteration": 1, "loss": 1.0}])  # never reports acc
        add_results(
            store,
            "d",
            [{"training_iteration": 1, "acc": "n/a"}, {"training_iteration": 2, "acc": None}],
        )
        add_results(
            store,
            "e",
            [{"training_iteration": 1, "acc": 0.1}, {"training_iteration": 2, "acc": math.nan}],
        )
        add_results(store, "other", [{"training_iteration": 1, "acc": 0.99}])
        add_checkpoint(store, "a", "/ckpt/a/2", 2)
        add_checkpoint(store, "a", "/ckpt/a/3", 3)
        store.mark_checkpoint_deleted("a", "/ckpt/a/3")
        store.record_transition("b", Transition.PLACED)
        return run

    def test_leaderboard_max_ranks_best_first_and_missing_metric_last(self, store):
        run = self._leaderboard_run(store)
        rows = store.reader.leaderboard(run, "acc", "max")
        assert [(r.trial_id, r.best_value, r.best_iteration) for r in rows] == [
            ("b", 0.95, 2),
            ("a", 0.9, 2),
            ("e", 0.1, 1),
            ("c", None, None),
            ("d", None, None),
        ]
        assert rows[0].status is TrialStatus.RUNNING and rows[0].config == {"lr": 0.01}
        assert rows[1].best_checkpoint == rows[1].latest_checkpoint == "/ckpt/a/2"
        assert rows[0].best_checkpoint is None and rows[0].latest_checkpoint is None
        assert rows[0].num_failures == 0

    def test_best_checkpoint_is_the_kept_one_that_scored_best_not_the_latest(self, store):
        run = store.create_experiment_run("ckpt", "r1")
        store.ensure_experiment("ckpt", metric="loss", mode="min")
        register(store, "t", run)
        losses = [(1, 0.9), (2, 0.3), (3, 0.1), (4, 0.4), (5, 0.6)]
        add_results(store, "t", [{"training_iteration": i, "loss": v} for i, v in losses])
        for i in (1, 3, 5):
            add_checkpoint(store, "t", f"/ckpt/t/{i}", i)
        maintained = store.reader.leaderboard(run, "loss", "min")[
            0
        ]  # the experiment's metric: kept bests
        scanned = store.reader.leaderboard(run, "loss", "max")[0]  # any other goal: scanned results
        assert (
            maintained.best_iteration,
            maintained.best_checkpoint,
            maintained.latest_checkpoint,
        ) == (3, "/ckpt/t/3", "/ckpt/t/5")
        assert (scanned.best_checkpoint, scanned.latest_checkpoint) == ("/ckpt/t/1", "/ckpt/t/5")
        assert store.reader.best_checkpoint_paths(["t", "nope"], "loss", "min") == {
            "t": "/ckpt/t/3"
        }
        # Dropped by the keep policy: the best of the kept ones, not the newest one before it.
        store.mark_checkpoint_deleted("t", "/ckpt/t/3")
        assert store.reader.leaderboard(run, "loss", "min")[0].best_checkpoint == "/ckpt/t/5"
        # No kept checkpoint has the metric at its iteration: the newest kept.
        assert store.reader.leaderboard(run, "acc", "min")[0].best_checkpoint == "/ckpt/t/5"

    def test_leaderboard_min_and_limit(self, store):
        run = self._leaderboard_run(store)
        rows = store.reader.leaderboard(run, "acc", "min")
        assert [(r.trial_id, r.best_value, r.best_iteration) for r in rows] == [
            ("e", 0.1, 1),
            ("b", 0.2, 1),
            ("a", 0.5, 1),
            ("c", None, None),
            ("d", None, None),
        ]
        assert [r.trial_id for r in store.reader.leaderboard(run, "acc", "min", limit=2)] == [
            "e",
            "b",
        ]
        assert [r.best_value for r in store.reader.leaderboard(run, "loss")] == [
            1.0,
            None,
            None,
            None,
            None,
        ]

    def test_best_value_is_maintained_on_write_and_matches_a_full_scan(self, store):
        run = self._leaderboard_run(store)
        maintained = store.reader.leaderboard(
            run, "acc", "max"
        )  # the experiment's metric: maintained bests
        b = next(r for r in maintained if r.trial_id == "b")
        assert (b.best_value, b.best_iteration) == (0.95, 2)  # a tie keeps the earliest iteration
        # Out-of-order and repeated batches keep the best; a full recompute agrees.
        add_results(
            store,
            "a",
            [{"training_iteration": 5, "acc": 0.96}, {"training_iteration": 4, "acc": 0.96}],
        )
        add_results(store, "a", [{"training_iteration": 5, "acc": 0.96}])
        top = store.reader.leaderboard(run, "acc", "max")[0]
        assert (top.trial_id, top.best_value, top.best_iteration) == ("a", 0.96, 4)
        before = store.reader.leaderboard(run, "acc", "max")
        assert store.recompute_best(run) == 5
        assert store.reader.leaderboard(run, "acc", "max") == before

    def _maintained(self, store: TrialStore, run: int) -> dict[str, tuple[Any, ...]]:
        """Per trial of the run: best_metric, best_mode, the best in that mode and in the other
        (each value and iteration), as at_trials holds them."""
        trials = TrialRow.__table__.c
        with store._engine.connect() as connection:
            return {
                row[0]: tuple(row[1:])
                for row in connection.execute(
                    select(
                        trials.trial_id,
                        trials.best_metric,
                        trials.best_mode,
                        trials.best_value,
                        trials.best_iteration,
                        trials.other_mode_best_value,
                        trials.other_mode_best_iteration,
                    ).where(trials.experiment_run_id == run)
                )
            }

    def test_other_mode_best_is_maintained_on_write_and_matches_the_probe(self, store):
        run = self._leaderboard_run(store)
        # NaN and inf are stored as None: neither is a best in either mode. A string or a bool
        # is not a number.
        add_results(
            store,
            "e",
            [
                {"training_iteration": 3, "acc": -math.inf},
                {"training_iteration": 4, "acc": math.inf},
                {"training_iteration": 5, "acc": True},
                {"training_iteration": 6, "acc": "0.0"},
            ],
        )
        # Out of order, with a tie: the earliest iteration keeps it.
        add_results(
            store,
            "a",
            [{"training_iteration": 6, "acc": 0.4}, {"training_iteration": 4, "acc": 0.4}],
        )
        expected = [("e", 0.1, 1), ("b", 0.2, 1), ("a", 0.4, 4), ("c", None, None)]
        expected.append(("d", None, None))
        rows = store.reader.leaderboard(run, "acc", "min")
        assert [(r.trial_id, r.best_value, r.best_iteration) for r in rows] == expected
        maintained = self._maintained(store, run)
        assert maintained["a"] == ("acc", "max", 0.9, 2, 0.4, 4)
        assert maintained["c"] == ("acc", "max", None, None, None, None)
        # The probe of the results (the experiment's mode changed, so nothing is maintained)
        # ranks the same; recompute_best keeps the same values.
        store.ensure_experiment("mnist", metric="acc", mode="min")
        assert store.reader.leaderboard(run, "acc", "min") == rows
        store.ensure_experiment("mnist", metric="acc", mode="max")
        assert store.recompute_best(run) == 5
        assert self._maintained(store, run) == maintained
        assert store.reader.leaderboard(run, "acc", "min") == rows
        assert [r.trial_id for r in store.reader.ranking(run, "acc", "min")] == [
            r[0] for r in expected
        ]

    def test_changing_the_experiment_metric_falls_back_to_scanning_results(self, store):
        run = self._leaderboard_run(store)
        before = {mode: store.reader.leaderboard(run, "acc", mode) for mode in ("min", "max")}
        store.ensure_experiment("mnist", metric="acc", mode="min")
        rows = store.reader.leaderboard(run, "acc", "min")
        assert [r.trial_id for r in rows][:2] == ["e", "b"] and rows[0].best_value == 0.1
        assert (
            rows == before["min"] and store.reader.leaderboard(run, "acc", "max") == before["max"]
        )
        # A trial's new result after the change: its earlier results were kept for max, so its
        # bests in both modes are unknown until recomputed, as they are today for the mode's.
        add_results(store, "a", [{"training_iteration": 7, "acc": 0.05}])
        assert self._maintained(store, run)["a"] == (None,) * 6
        assert store.reader.leaderboard(run, "acc", "min")[0].trial_id == "a"
        store.recompute_best(run)
        assert self._maintained(store, run)["a"] == ("acc", "min", 0.05, 7, 0.9, 2)
        assert [r.trial_id for r in store.reader.leaderboard(run, "acc", "min")][:3] == [
            "a",
            "e",
            "b",
        ]
        assert [r.best_value for r in store.reader.leaderboard(run, "acc", "max")][:3] == [
            0.95,
            0.9,
            0.1,
        ]
        # Another metric: nothing is maintained for it.
        store.ensure_experiment("mnist", metric="loss", mode="min")
        store.recompute_best(run)
        assert self._maintained(store, run)["c"] == ("loss", "min", 1.0, 1, 1.0, 1)
        assert self._maintained(store, run)["a"] == ("loss", "min", None, None, None, None)

    def test_leaderboard_rejects_bad_arguments(self, store):
        run = self._leaderboard_run(store)
        with pytest.raises(ValueError, match="'min' or 'max'"):
            store.reader.leaderboard(run, "acc", "best")
        with pytest.raises(ValueError, match="limit must be at least 1"):
            store.reader.leaderboard(run, "acc", limit=0)
        with pytest.raises(StoreError, match="experiment run 4242"):
            store.reader.leaderboard(4242, "acc")

    # -- errors ------------------------------------------------------------------------

    @pytest.mark.parametrize(
        "call",
        [
            lambda s: s.reader.get_trial("ghost"),
            lambda s: s.record_transition("ghost", Transition.PLACED),
            lambda s: update_trial(s, "ghost", num_failures=1),
            lambda s: add_results(s, "ghost", results([1])),
            lambda s: s.reader.get_results("ghost"),
            lambda s: add_checkpoint(s, "ghost", "/ckpt", 1),
            lambda s: s.mark_checkpoint_deleted("ghost", "/ckpt"),
            lambda s: s.reader.latest_checkpoint("ghost"),
        ],
        ids=[
            "get_trial",
            "record_transition",
            "update_trial",
            "record_progress_results",
            "get_results",
            "record_progress_checkpoint",
            "mark_checkpoint_deleted",
            "latest_checkpoint",
        ],
    )
    def test_unknown_trial_raises_trial_not_found(self, store, call):
        with pytest.raises(
            TrialNotFoundError, match="ghost .*register it with upsert_trial first"
        ) as raised:
            call(store)
        assert isinstance(raised.value, KeyError) and raised.value.trial_id == "ghost"
        assert count(store, ResultRow) == 0 and count(store, CheckpointRow) == 0

    def test_foreign_key_violation_raises_chained_store_error_and_writes_nothing(self, store):
        with pytest.raises(StoreError, match="register trial t1 in experiment run 4242") as raised:
            register(store, "t1", 4242)
        assert isinstance(raised.value.__cause__, SQLAlchemyError)
        assert "IntegrityError" in type(raised.value.__cause__).__name__
        assert count(store, TrialRow) == 0

    @pytest.mark.parametrize(
        "unmigrated", [False, True], ids=["foreign-key-violation", "missing-table"]
    )
    def test_non_transient_error_fails_at_once_without_retrying(
        self, store_url, caplog, unmigrated
    ):
        # An integrity error, and a missing table (ProgrammingError on PostgreSQL, an
        # OperationalError that is no lock on SQLite): neither can succeed on a second attempt.
        trial_store = TrialStore(
            store_url, create=not unmigrated, retry_initial_backoff_seconds=0.001
        )
        inserts: list[str] = []

        def capture(conn, cursor, statement, parameters, context, executemany):
            if statement.lstrip().upper().startswith("INSERT INTO AT_TRIALS"):
                inserts.append(statement)

        event.listen(trial_store._engine, "before_cursor_execute", capture)
        caplog.set_level(logging.WARNING, logger="airflow_trials.store")
        try:
            with pytest.raises(
                StoreError, match="register trial t1 in experiment run 4242"
            ) as raised:
                register(trial_store, "t1", 4242)
        finally:
            event.remove(trial_store._engine, "before_cursor_execute", capture)
            trial_store.dispose()
        assert isinstance(raised.value.__cause__, SQLAlchemyError)
        assert "retried" not in str(raised.value) and "attempts" not in str(raised.value)
        assert len(inserts) == 1
        assert retry_warnings(caplog) == []

    def test_failure_late_in_a_write_rolls_back_all_of_it(self, store):
        register(store, "t1")
        add_results(store, "t1", results([1]))
        # Fails the last statement of record_progress (setting last_result) after its INSERT
        # succeeded.
        fail_setting_last_result(store, self.backend)
        with pytest.raises(
            StoreError, match=r"progress of 1 trials \(3 results\).*forced failure"
        ) as raised:
            add_results(store, "t1", results([2, 3, 4]))
        assert isinstance(raised.value.__cause__, SQLAlchemyError)
        assert [r["training_iteration"] for r in store.reader.get_results("t1")] == [1]
        assert store.reader.get_trial("t1").last_result["training_iteration"] == 1

    # -- concurrency -------------------------------------------------------------------

    @pytest.mark.parametrize(
        "shared_store", [True, False], ids=["one-shared-store", "store-per-thread"]
    )
    def test_32_concurrent_writers_lose_nothing_and_duplicate_nothing(
        self, store, store_url, shared_store
    ):
        if not self.concurrent_writers:
            pytest.skip(
                "in-memory SQLite shares one connection; concurrency runs on the file and "
                "PostgreSQL"
            )
        writers, per_writer, batch_size = 32, 200, 50
        register(store, "shared")
        for w in range(writers):
            register(store, f"own-{w}")
        barrier = threading.Barrier(writers, timeout=60)
        new_shared: list[int] = []

        def write(w: int) -> None:
            writer_store = store if shared_store else TrialStore(store_url)
            try:
                barrier.wait()
                for start in range(1, per_writer + 1, batch_size):
                    add_results(writer_store, f"own-{w}", results(range(start, start + batch_size)))
                    # Writers overlap on the shared trial: writer w covers iterations w..w+9.
                    new_shared.append(
                        add_results(writer_store, "shared", results(range(w, w + 10)))
                    )
            finally:
                if not shared_store:
                    writer_store.dispose()

        assert (
            run_in_threads(
                [functools.partial(write, w) for w in range(writers)], timeout_seconds=120
            )
            == []
        )
        for w in range(writers):
            assert count(store, ResultRow, trial_id=f"own-{w}") == per_writer
            assert (
                store.reader.get_trial(f"own-{w}").last_result["training_iteration"] == per_writer
            )
        shared_iterations = set(range(0, writers + 9))
        assert count(store, ResultRow, trial_id="shared") == len(shared_iterations)
        assert sum(new_shared) == len(shared_iterations)
        assert count(store, ResultRow) == writers * per_writer + len(shared_iterations)
        assert store.reader.get_trial("shared").last_result["training_iteration"] == max(
            shared_iterations
        )


class TestInMemorySQLite(StoreContract):
    backend = MEMORY
    concurrent_writers = False


class TestSQLiteFile(StoreContract):
    backend = SQLITE_FILE

    def test_connections_use_wal_busy_timeout_and_foreign_keys(self, store):
        with store._engine.connect() as connection:
            assert connection.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
            assert connection.exec_driver_sql("PRAGMA synchronous").scalar() == 1  # NORMAL
            assert connection.exec_driver_sql("PRAGMA busy_timeout").scalar() == 30_000
            assert connection.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1


def postgres_schema_dump(url: str) -> dict[str, list[tuple[Any, ...]]]:
    """What makes up the schema behind ``url`` (its search path's first schema), with the schema's
    own name left out: columns, indexes, constraints, sequences and the Alembic version."""
    engine = create_store_engine(url)
    try:
        with engine.connect() as connection:
            schema = connection.execute(text("SELECT current_schema()")).scalar_one()

            def rows(sql: str) -> list[tuple[Any, ...]]:
                found = connection.execute(text(sql), {"schema": schema}).all()
                return sorted(
                    tuple(str(value).replace(schema, "<schema>") for value in row) for row in found
                )

            return {
                "columns": rows(
                    "SELECT table_name, column_name, data_type, is_nullable, column_default "
                    "FROM information_schema.columns WHERE table_schema = :schema"
                ),
                "indexes": rows(
                    "SELECT tablename, indexname, indexdef FROM pg_indexes "
                    "WHERE schemaname = :schema"
                ),
                "constraints": rows(
                    "SELECT conrelid::regclass::text, conname, pg_get_constraintdef(c.oid) "
                    "FROM pg_constraint c JOIN pg_namespace n ON n.oid = c.connamespace "
                    "WHERE n.nspname = :schema"
                ),
                "sequences": rows(
                    "SELECT sequence_name, data_type, start_value, increment "
                    "FROM information_schema.sequences WHERE sequence_schema = :schema"
                ),
                "version": [(current_revision(engine),)],
            }
    finally:
        engine.dispose()


@pytest.mark.postgres
class TestPostgreSQL(StoreContract):
    backend = POSTGRESQL

    def test_a_replayed_migration_makes_the_schema_a_migration_makes(
        self, store, store_url, postgres_migration_script
    ):
        """The ``store`` fixture replays the session's recorded migration instead of migrating:
        the schema it makes must be the one a migration makes."""
        with new_postgres_schema("at_migrated") as migrated_url:
            migrate(migrated_url)
            migrated = postgres_schema_dump(migrated_url)
        replayed = postgres_schema_dump(store_url)
        assert replayed["version"] == [(HEAD_REVISION,)]
        assert len(migrated["columns"]) > 50 and len(migrated["indexes"]) > 10
        assert replayed == migrated


# -- the command line and the default location ---------------------------------------------


def test_default_store_url_is_a_sqlite_file_under_airflow_trials_home(tmp_path, monkeypatch):
    home = tmp_path / "home" / "trials"
    monkeypatch.setenv("AIRFLOW_TRIALS_HOME", str(home))
    assert default_store_url() == f"sqlite:///{home / 'trials.db'}"
    assert home.is_dir()


def test_cli_upgrade_with_url_prints_one_line_and_is_repeatable(tmp_path):
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    for _ in range(2):
        done = subprocess.run(
            [sys.executable, "-m", "airflow_trials.store", "upgrade", "--url", url],
            capture_output=True,
            text=True,
            check=True,
        )
        assert done.stdout.splitlines() == [
            f"Trial store at {url} (from --url) is at the latest schema (revision {HEAD_REVISION})."
        ]
    TrialStore(url).ensure_experiment("works")


def test_cli_upgrade_reads_the_url_from_the_environment_then_the_default(
    tmp_path, monkeypatch, capsys
):
    from_env = f"sqlite:///{tmp_path / 'env.db'}"
    monkeypatch.setenv("AIRFLOW_TRIALS_DB_URL", from_env)
    assert store_cli(["upgrade"]) == 0
    assert from_env in capsys.readouterr().out
    monkeypatch.delenv("AIRFLOW_TRIALS_DB_URL")
    monkeypatch.setenv("AIRFLOW_TRIALS_HOME", str(tmp_path / "home"))
    assert store_cli(["upgrade"]) == 0
    assert str(tmp_path / "home" / "trials.db") in capsys.readouterr().out
    assert (tmp_path / "home" / "trials.db").exists()


def test_cli_upgrade_reports_an_unreachable_database(tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 'missing-dir' / 'x.db'}"
    assert store_cli(["upgrade", "--url", url]) == 1
    assert "Could not migrate the trial store" in capsys.readouterr().err
