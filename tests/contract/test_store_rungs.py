"""Contract of TrialStore.record_rung and trial_rungs (ASHA's rungs on the Airflow path), run
unchanged against in-memory SQLite, a SQLite file and PostgreSQL."""

from __future__ import annotations

import functools
import math
import random
import threading
import warnings
from typing import Any

import numpy as np
import pytest
from alembic import command
from sqlalchemy import event, inspect

from airflow_trials import AsyncHyperBandScheduler, Decision, StoreError, Trial, TrialNotFoundError
from airflow_trials.core.fate import Transition
from airflow_trials.schedulers.asha.asha_judging import RungJudge
from airflow_trials.schedulers.asha.asha_rungs import (
    AshaRungs,
    RungVerdict,
    asha_rung_decision,
    rung_cutoff,
    rung_percent,
)
from airflow_trials.store import RestartFromScratch, TrialStore
from airflow_trials.store.migration import alembic_config
from airflow_trials.store.models import TrialRungRow
from tests.contract.conftest import MEMORY, POSTGRESQL, SQLITE_FILE
from tests.contract.test_store import count, register, run_in_threads
from tests.scheduler_writes import OneWriteEach, judge_end
from tests.scheduler_writes import judge as judge_results

#: Random streams per backend, and the fewest results judged and stops they make (seeded: the
#: same every run). In-memory SQLite replays the most; the file runs the same SQL on the same
#: dialect, so a sample of it; PostgreSQL, its own dialect, a third of the in-memory count.
STREAMS = {MEMORY: 300, SQLITE_FILE: 50, POSTGRESQL: 100}
AT_LEAST = {MEMORY: (1000, 50), SQLITE_FILE: (750, 80), POSTGRESQL: (1500, 150)}


def never(values):
    raise AssertionError(f"decide must not be called again, got {values}")


def new_run(store: TrialStore, name: str, trial_ids) -> int:
    run = store.create_experiment_run("asha", name)
    for trial_id in trial_ids:
        register(store, trial_id, run)
    return run


class StoreAsha:
    """The Airflow path's ASHA as the trials' triggers drive it: one RungJudge per trial and
    trigger, over the store's rungs."""

    def __init__(self, store: TrialStore, run: int, rungs: AshaRungs):
        self.store, self.run, self.rungs = store, run, rungs
        self.bracket: dict[str, int] = {}
        self.reasons: dict[str, str] = {}
        self._judges: dict[str, RungJudge] = {}

    def judge(self, trial_id: str, result: dict[str, Any], *, at_end: bool = False) -> Decision:
        """The decision on one result by the trial's trigger, then by a new trigger (as after a
        triggerer restart) processing it again: the same both times."""
        first = self._judge(self._judge_of(trial_id), result, at_end=at_end)
        again = self._judge(
            RungJudge(self.rungs, self.bracket[trial_id], self.run, trial_id),
            result,
            at_end=at_end,
        )
        assert again is first
        return first

    def _judge_of(self, trial_id: str) -> RungJudge:
        if trial_id not in self._judges:
            self._judges[trial_id] = RungJudge(
                self.rungs, self.bracket[trial_id], self.run, trial_id
            )
        return self._judges[trial_id]

    def _judge(self, judge: RungJudge, result: dict[str, Any], *, at_end: bool) -> Decision:
        if at_end:
            judge_end(self.store, judge, result)
            return Decision.CONTINUE
        judge_results(self.store, judge, [result])
        verdict = judge.verdict_for(result["training_iteration"])
        if verdict.decision is Decision.STOP:
            self.reasons[judge.trial_id] = verdict.reason
        return verdict.decision


def _value(rng: random.Random, level: float, step: int) -> float:
    roll = rng.random()
    if roll < 0.05:
        return math.nan
    if roll < 0.07:
        return rng.choice([math.inf, -math.inf])
    if roll < 0.3:
        return float(rng.randint(0, 4))  # ties between trials and with cutoffs
    return level * step + rng.gauss(0, 1)


def replay_stream(store: TrialStore, seed: int) -> int:
    """One random asynchronous stream through AsyncHyperBandScheduler and through the store;
    asserts every decision, reason and bracket agree; returns how many results it judged."""
    rng = random.Random(seed)
    max_t = rng.choice([4, 9, 10, 16, 27])
    settings = {
        "metric": "score",
        "mode": rng.choice(["min", "max"]),
        "time_attr": rng.choice(["training_iteration", "time_total_s"]),
        "max_t": max_t,
        "grace_period": rng.choice([1, 2]),
        "reduction_factor": rng.choice([2, 3, 2.5]),
        "brackets": rng.choice([1, 1, 2, 3]),
        "stop_last_trials": rng.random() < 0.6,
    }
    draws = random.Random(seed + 1)
    memory = AsyncHyperBandScheduler(rng=random.Random(seed + 1), **settings)
    ids = [f"s{seed}-t{i}" for i in range(rng.randint(2, 6))]
    ours = StoreAsha(store, new_run(store, f"stream-{seed}", ids), AshaRungs(**settings))
    step, clock = dict.fromkeys(ids, 0), dict.fromkeys(ids, 0.0)
    level, last = {t: rng.uniform(-1, 1) for t in ids}, {}
    for trial_id in ids:
        memory.on_trial_add(Trial("tests.trainables:counting", trial_id=trial_id))
        ours.bracket[trial_id] = ours.rungs.draw_bracket(draws.random())
    assert ours.bracket == memory._trial_bracket
    live, judged = list(ids), 0
    limit = {t: rng.randint(2, 14) for t in ids}
    while live:
        trial_id = rng.choice(live)
        step[trial_id] += rng.choice([1, 1, 2])
        clock[trial_id] += rng.choice([0.5, 1.0, 1.5, 3.0])
        result = {
            "training_iteration": step[trial_id],
            "time_total_s": clock[trial_id],
            "score": _value(rng, level[trial_id], step[trial_id]),
        }
        last[trial_id] = result
        trial = Trial("tests.trainables:counting", trial_id=trial_id)
        expected = memory.on_trial_result(trial, dict(result))
        assert ours.judge(trial_id, result) == expected, (seed, trial_id, result)
        judged += 1
        if expected is Decision.STOP or step[trial_id] >= limit[trial_id]:
            assert ours.reasons.get(trial_id) == memory.decision_reason(trial_id)
            live.remove(trial_id)
            memory.on_trial_complete(trial, dict(result))
            ours.judge(trial_id, result, at_end=True)
    _assert_same_rungs(store, memory, ours)
    return judged


def _assert_same_rungs(store: TrialStore, memory: AsyncHyperBandScheduler, ours: StoreAsha) -> None:
    """Every value the in-memory rungs hold is stored, at the same rung, and nothing else."""
    expected = {
        (trial_id, bracket, milestone): value
        for (bracket, milestone), recorded in memory.state._values.items()
        for trial_id, value in recorded.items()
    }
    stored = {
        (r.trial_id, r.bracket, r.milestone): r.value
        for trial_id in ours.bracket
        for r in store.reader.trial_rungs(trial_id)
    }
    assert stored.keys() == expected.keys()
    for key, value in expected.items():
        assert stored[key] == value or (math.isnan(stored[key]) and math.isnan(value)), key


class RungsContract:
    backend: str
    concurrent_writers = True

    def test_records_once_and_returns_the_first_verdict_again(self, store):
        run = new_run(store, "r1", ["a", "b"])
        rungs = AshaRungs(metric="loss", mode="min", max_t=9, grace_period=1, reduction_factor=3)
        first = OneWriteEach(store).record_rung(
            run,
            "a",
            bracket=0,
            milestone=1,
            value=0.2,
            iteration=1,
            decide=rungs.decide(0, 1, 1, 0.2),
        )
        assert (first.decision, first.reason, first.fresh) == (Decision.CONTINUE, None, True)
        worse = OneWriteEach(store).record_rung(
            run,
            "b",
            bracket=0,
            milestone=1,
            value=0.9,
            iteration=1,
            decide=rungs.decide(0, 1, 1, 0.9),
        )
        assert worse.decision is Decision.STOP and worse.fresh
        assert worse.reason == (
            "stopped by ASHA at training_iteration=1 (rung 1 of 3): loss 0.9 above the rung's "
            "cutoff 0.2"
        )
        # A triggerer restart processes the same result again: the same verdict, decide not asked.
        again = OneWriteEach(store).record_rung(
            run, "b", bracket=0, milestone=1, value=0.0, iteration=1, decide=never
        )
        assert dataclass_fields(again, fresh=False) == dataclass_fields(worse, fresh=False)
        assert again.value == 0.9 and not again.fresh
        assert count(store, TrialRungRow) == 2
        assert [r.milestone for r in store.reader.trial_rungs("b")] == [1.0]

    def test_trial_rungs_are_listed_lowest_milestone_first_with_their_values(self, store):
        run = new_run(store, "r1", ["a"])
        for milestone, value in ((9, 1.5), (1, 0.5), (3, math.inf)):
            OneWriteEach(store).record_rung(
                run,
                "a",
                bracket=0,
                milestone=milestone,
                value=value,
                decide=lambda values: RungVerdict(Decision.CONTINUE, None),
            )
        rungs = store.reader.trial_rungs("a")
        assert [(r.milestone, r.value, r.bracket, r.iteration) for r in rungs] == [
            (1.0, 0.5, 0, None),
            (3.0, math.inf, 0, None),
            (9.0, 1.5, 0, None),
        ]
        assert not any(r.at_end for r in rungs)
        assert all(r.created_at.tzinfo is not None for r in rungs)
        register(store, "idle", run)
        assert store.reader.trial_rungs("idle") == []

    def test_a_run_s_rungs_read_at_once_are_each_trial_s_rungs(self, store_url):
        store = TrialStore(store_url, create=True)
        try:
            run = new_run(store, "r1", ["a", "b", "idle"])
            other = new_run(store, "r2", ["x"])
            for trial_id, milestone, value in (
                ("b", 4, 0.3),
                ("a", 1, 0.5),
                ("b", 1, 0.4),
                ("x", 1, 0.1),
            ):
                OneWriteEach(store).record_rung(
                    run if trial_id != "x" else other,
                    trial_id,
                    bracket=0,
                    milestone=milestone,
                    value=value,
                    decide=lambda values: RungVerdict(Decision.CONTINUE, None),
                )
            of_run = store.reader.rungs_of_run(run)
            assert set(of_run) == {"a", "b"}
            assert {trial_id: of_run[trial_id] for trial_id in ("a", "b")} == {
                trial_id: store.reader.trial_rungs(trial_id) for trial_id in ("a", "b")
            }
            assert [r.milestone for r in of_run["b"]] == [1.0, 4.0]
        finally:
            store.dispose()

    def test_decide_sees_the_other_trials_values_of_that_rung_only(self, store):
        run = new_run(store, "r1", ["a", "b", "c", "d"])
        other = new_run(store, "r2", ["x"])
        seen: list[list[float]] = []

        def spy(values):
            seen.append(list(values.ranked(0, values.numeric - 1, descending=False)))
            return RungVerdict(Decision.CONTINUE, None)

        OneWriteEach(store).record_rung(other, "x", bracket=0, milestone=1, value=7.0, decide=spy)
        OneWriteEach(store).record_rung(run, "a", bracket=0, milestone=1, value=1.0, decide=spy)
        OneWriteEach(store).record_rung(
            run, "b", bracket=1, milestone=1, value=2.0, decide=spy
        )  # another bracket
        OneWriteEach(store).record_rung(run, "b", bracket=1, milestone=4, value=3.0, decide=spy)
        OneWriteEach(store).record_rung(
            run, "c", bracket=0, milestone=4, value=4.0, decide=spy
        )  # another rung
        OneWriteEach(store).record_rung(run, "d", bracket=0, milestone=1, value=5.0, decide=spy)
        assert seen == [[], [], [], [], [], [1.0]]

    def test_nan_is_recorded_as_null_and_left_out_of_the_cutoff(self, store):
        run = new_run(store, "r1", ["a", "b", "c", "d"])
        rungs = AshaRungs(metric="score", mode="max", max_t=4, grace_period=1, reduction_factor=2)

        def record(trial_id, value):
            return OneWriteEach(store).record_rung(
                run,
                trial_id,
                bracket=0,
                milestone=1,
                value=value,
                decide=rungs.decide(0, 1, 1, value),
            )

        assert record("a", math.nan).decision is Decision.CONTINUE  # the first at the rung
        assert record("b", math.nan).decision is Decision.CONTINUE  # only NaNs before: no cutoff
        assert record("c", -5.0).decision is Decision.CONTINUE
        stopped = record("d", -6.0)
        assert stopped.decision is Decision.STOP and "cutoff -5" in stopped.reason
        assert math.isnan(store.reader.trial_rungs("a")[0].value)
        with store._engine.connect() as connection:
            stored = connection.execute(
                TrialRungRow.__table__.select().where(TrialRungRow.trial_id == "a")
            ).one()
        assert stored.value is None

    @pytest.mark.parametrize("mode", ["min", "max"])
    def test_a_cutoff_read_from_the_index_is_nan_percentile_to_the_last_bit(self, store, mode):
        rng = random.Random(7)
        ids = [f"t{i}" for i in range(120)]
        run = new_run(store, f"big-{mode}", ids)
        values = [
            rng.choice(
                [math.nan, math.inf, -math.inf, float(rng.randint(0, 3)), rng.gauss(0, 1) / 3]
            )
            if rng.random() < 0.3
            else rng.gauss(0, 1)
            for _ in ids
        ]
        cutoffs: dict[float, float | None] = {}

        def keep(values_before):
            for factor in (2, 2.5, 3, 4, 7):
                cutoffs[factor] = rung_cutoff(values_before, factor, mode)
            return RungVerdict(Decision.CONTINUE, None)

        sign = 1.0 if mode == "max" else -1.0
        for count_before, (trial_id, value) in enumerate(zip(ids, values, strict=True)):
            OneWriteEach(store).record_rung(
                run, trial_id, bracket=0, milestone=1, value=value, decide=keep
            )
            for factor, cutoff in cutoffs.items():
                if count_before == 0:
                    assert cutoff is None
                    continue
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", RuntimeWarning)  # numpy on inf - inf, all-NaN
                    expected = float(
                        np.nanpercentile(
                            [sign * v for v in values[:count_before]], rung_percent(factor)
                        )
                    )
                assert cutoff == expected or (math.isnan(cutoff) and math.isnan(expected)), (
                    count_before,
                    factor,
                )

    def test_unknown_run_trial_or_wrong_arguments_are_refused_and_write_nothing(self, store):
        run = new_run(store, "r1", ["a"])
        other = new_run(store, "r2", ["x"])
        ok = functools.partial(
            OneWriteEach(store).record_rung,
            bracket=0,
            milestone=1,
            value=1.0,
            decide=lambda values: RungVerdict(Decision.CONTINUE, None),
        )
        with pytest.raises(TrialNotFoundError, match="trial ghost is not in the trial store"):
            ok(run, "ghost")
        with pytest.raises(StoreError, match="experiment run 999 is not in the trial store"):
            ok(999, "a")
        with pytest.raises(ValueError, match="belongs to experiment run"):
            ok(other, "a")
        with pytest.raises(TrialNotFoundError):
            store.reader.trial_rungs("ghost")
        for kwargs, match in (
            ({"bracket": -1}, "bracket"),
            ({"bracket": 1.5}, "bracket"),
            ({"milestone": 0}, "milestone"),
            ({"milestone": math.inf}, "milestone"),
            ({"value": "0.5"}, "value"),
            ({"value": True}, "value"),
            ({"iteration": -3}, "iteration"),
        ):
            with pytest.raises(ValueError, match=match):
                OneWriteEach(store).record_rung(
                    run,
                    "a",
                    **{"bracket": 0, "milestone": 1, "value": 1.0, "decide": never, **kwargs},
                )
        with pytest.raises(ValueError, match="not a RungVerdict"):
            OneWriteEach(store).record_rung(
                run, "a", bracket=0, milestone=1, value=1.0, decide=lambda values: "STOP"
            )
        with pytest.raises(ValueError, match="not a RungVerdict"):
            OneWriteEach(store).record_rung(
                run,
                "a",
                bracket=0,
                milestone=1,
                value=1.0,
                decide=lambda values: RungVerdict(Decision.PAUSE, None),
            )
        assert count(store, TrialRungRow) == 0
        ok(run, "a")
        with pytest.raises(ValueError, match="recorded there in bracket 0"):
            OneWriteEach(store).record_rung(
                run, "a", bracket=1, milestone=1, value=1.0, decide=never
            )

    def test_a_trial_restarted_from_scratch_is_judged_afresh(self, store):
        run = new_run(store, "r1", ["a", "b"])
        rungs = AshaRungs(metric="loss", mode="min", max_t=16, grace_period=1, reduction_factor=2)
        OneWriteEach(store).record_rung(
            run,
            "a",
            bracket=0,
            milestone=1,
            value=0.1,
            iteration=1,
            decide=rungs.decide(0, 1, 1, 0.1),
        )
        assert (
            OneWriteEach(store)
            .record_rung(
                run,
                "b",
                bracket=0,
                milestone=1,
                value=0.9,
                iteration=1,
                decide=rungs.decide(0, 1, 1, 0.9),
            )
            .decision
            is Decision.STOP
        )
        store.record_transition("b", Transition.STOPPED, why="stopped by ASHA")
        store.record_transition("b", RestartFromScratch())
        assert store.reader.trial_rungs("b") == [] and len(store.reader.trial_rungs("a")) == 1
        again = OneWriteEach(store).record_rung(
            run,
            "b",
            bracket=0,
            milestone=1,
            value=0.05,
            iteration=1,
            decide=rungs.decide(0, 1, 1, 0.05),
        )
        assert again.fresh and again.decision is Decision.CONTINUE

    def test_rungs_go_with_their_trial_and_run(self, store):
        run = new_run(store, "r1", ["a"])
        OneWriteEach(store).record_rung(
            run,
            "a",
            bracket=0,
            milestone=1,
            value=1.0,
            decide=lambda values: RungVerdict(Decision.CONTINUE, None),
        )
        with store._engine.begin() as connection:
            connection.exec_driver_sql("DELETE FROM at_trials WHERE trial_id = 'a'")
        assert count(store, TrialRungRow) == 0

    def test_random_streams_decide_exactly_as_the_in_memory_scheduler(self, store):
        judged = sum(replay_stream(store, seed) for seed in range(STREAMS[self.backend]))
        stops = count(store, TrialRungRow, decision="STOP")
        least_judged, least_stops = AT_LEAST[self.backend]
        assert judged > least_judged and stops > least_stops, (judged, stops)

    @pytest.mark.parametrize("direction", ["ASC", "DESC"])
    def test_a_decisions_queries_read_the_rung_index_alone_without_sorting(self, store, direction):
        rung = "FROM at_trial_rungs WHERE experiment_run_id = 1 AND bracket = 0 AND milestone = 1.0"
        statements = [
            f"SELECT count(*), count(value) {rung}",
            f"SELECT value {rung} AND value IS NOT NULL "
            f"ORDER BY value {direction} LIMIT 2 OFFSET 3",
        ]
        with store._engine.connect() as connection:
            for statement in statements:
                if self.backend == POSTGRESQL:
                    # Few rows: without this PostgreSQL would rightly prefer a sequential scan.
                    connection.exec_driver_sql("SET enable_seqscan = off")
                    plan = " ".join(connection.exec_driver_sql("EXPLAIN " + statement).scalars())
                    assert "Index Only Scan" in plan and "ix_at_trial_rungs_rung_values" in plan, (
                        plan
                    )
                    assert "Sort" not in plan, plan
                else:
                    plan = " ".join(
                        row[-1]
                        for row in connection.exec_driver_sql("EXPLAIN QUERY PLAN " + statement)
                    )
                    assert "COVERING INDEX ix_at_trial_rungs_rung_values" in plan, plan
                    assert "TEMP B-TREE" not in plan, plan

    def test_a_decision_reads_two_values_however_many_the_rung_holds(self, store):
        ids = [f"t{i}" for i in range(60)]
        run = new_run(store, "r1", ids)
        rungs = AshaRungs(metric="loss", mode="min", max_t=16, grace_period=1, reduction_factor=4)
        for i, trial_id in enumerate(ids[:-1]):
            OneWriteEach(store).record_rung(
                run,
                trial_id,
                bracket=0,
                milestone=1,
                value=float(i % 7),
                decide=rungs.decide(0, 1, 1, 0.0),
            )
        statements: list[str] = []

        def capture(conn, cursor, statement, parameters, context, executemany):
            statements.append(" ".join(statement.split()))

        event.listen(store._engine, "before_cursor_execute", capture)
        try:
            OneWriteEach(store).record_rung(
                run, ids[-1], bracket=0, milestone=1, value=5.5, decide=rungs.decide(0, 1, 1, 5.5)
            )
        finally:
            event.remove(store._engine, "before_cursor_execute", capture)
        reads = [s for s in statements if s.startswith("SELECT at_trial_rungs.value")]
        assert len(reads) == 1 and "LIMIT" in reads[0], statements
        # Of the write's statements (the trial's, the run's), the rung's: its stored row, the
        # count, the two values, the insert.
        work = [s for s in statements if "at_trial_rungs" in s]
        assert len(work) <= 4, work

    def test_downgrade_to_0003_drops_the_rungs_table_and_upgrade_brings_it_back(self, store):
        with store._write_engine.begin() as connection:
            command.downgrade(alembic_config(connection), "0003")
            assert "at_trial_rungs" not in inspect(connection).get_table_names()
            command.upgrade(alembic_config(connection), "head")
            assert "at_trial_rungs" in inspect(connection).get_table_names()

    @pytest.mark.parametrize(
        "shared_store", [True, False], ids=["one-shared-store", "store-per-thread"]
    )
    def test_32_concurrent_writers_lose_nothing_and_each_sees_every_value_before_it(
        self, store, store_url, shared_store
    ):
        if not self.concurrent_writers:
            pytest.skip(
                "in-memory SQLite shares one connection; concurrency runs on the file and "
                "PostgreSQL"
            )
        writers = 32
        ids = [f"w{w}" for w in range(writers)]
        run = new_run(store, "r1", ids)
        rungs = AshaRungs(metric="score", mode="max", max_t=16, grace_period=1, reduction_factor=2)
        barrier = threading.Barrier(writers, timeout=60)
        verdicts: dict[tuple[str, float], Decision] = {}

        def write(w: int) -> None:
            writer = store if shared_store else TrialStore(store_url)
            rng = random.Random(w)
            try:
                barrier.wait()
                for milestone in (1, 2, 4):
                    value = rng.choice([math.nan, float(rng.randint(0, 3)), rng.gauss(0, 1)])
                    for _ in range(2):  # the second is a retry: same verdict, no second row
                        got = OneWriteEach(writer).record_rung(
                            run,
                            f"w{w}",
                            bracket=0,
                            milestone=milestone,
                            value=value,
                            decide=rungs.decide(0, milestone, milestone, value),
                        )
                        assert (
                            verdicts.setdefault((f"w{w}", milestone), got.decision) is got.decision
                        )
            finally:
                if not shared_store:
                    writer.dispose()

        assert (
            run_in_threads(
                [functools.partial(write, w) for w in range(writers)], timeout_seconds=120
            )
            == []
        )
        assert count(store, TrialRungRow) == 3 * writers
        # Each verdict is the one the rung's values committed before it give: a serial history.
        with store._engine.connect() as connection:
            rows = connection.execute(
                TrialRungRow.__table__.select().order_by(TrialRungRow.id)
            ).all()
        for milestone in (1.0, 2.0, 4.0):
            before: list[float] = []
            for row in (r for r in rows if r.milestone == milestone):
                value = math.nan if row.value is None else row.value
                assert asha_rung_decision(before, value, 2, "max").decision.value == row.decision
                before.append(value)


def dataclass_fields(record: Any, **overrides: Any) -> dict[str, Any]:
    fields = {name: getattr(record, name) for name in record.__dataclass_fields__}
    return {**fields, **overrides}


class TestInMemorySQLite(RungsContract):
    backend = MEMORY
    concurrent_writers = False


class TestSQLiteFile(RungsContract):
    backend = SQLITE_FILE


@pytest.mark.postgres
class TestPostgreSQL(RungsContract):
    backend = POSTGRESQL
