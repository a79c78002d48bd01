"""Contract of the run-level reads of scheduler decisions (store/run_decisions.py): run_rungs,
run_exploits and run_decision_counts, each one query for the whole run, run unchanged against
in-memory SQLite, a SQLite file and PostgreSQL."""

from __future__ import annotations

import math
from typing import Any

import pytest
from sqlalchemy import event

from airflow_trials import Decision
from airflow_trials.schedulers.asha.asha_rungs import RungVerdict
from airflow_trials.store import TrialStore
from airflow_trials.store.run_decisions import RunDecisionCounts
from tests.contract.conftest import MEMORY, POSTGRESQL, SQLITE_FILE
from tests.contract.test_store import register
from tests.plugins.decisions_seed import asha_run, pbt_run
from tests.scheduler_writes import OneWriteEach


def _verdict(decision: Decision, reason: str | None = None):
    return lambda values: RungVerdict(decision, None, reason)


def _statements(store: TrialStore, read: Any) -> tuple[Any, int]:
    """What ``read()`` returns, and how many queries (SELECTs) it ran."""
    seen: list[str] = []

    def capture(conn, cursor, statement, parameters, context, executemany):
        if statement.lstrip().upper().startswith("SELECT"):  # not the driver's BEGIN
            seen.append(statement)

    event.listen(store._engine, "before_cursor_execute", capture)
    try:
        return read(), len(seen)
    finally:
        event.remove(store._engine, "before_cursor_execute", capture)


class RunDecisionsContract:
    backend: str

    def test_run_rungs_are_every_trial_s_rungs_of_the_run_in_one_query(self, store):
        seeded = asha_run(store, "asha", 12, brackets=2)
        other = asha_run(store, "other", 3)
        reader = store.reader
        rungs, statements = _statements(store, lambda: reader.run_rungs(seeded.run))
        assert statements == 1
        assert {r.trial_id for r in rungs} == set(seeded.trials)
        assert not {r.trial_id for r in rungs} & set(other.trials)
        # The same records the trial-level read gives, one trial at a time.
        per_trial = sorted(
            (r.trial_id, r.bracket, r.milestone, r.iteration, r.decision, r.reason, r.at_end)
            for t in seeded.trials
            for r in store.reader.trial_rungs(t)
        )
        assert per_trial == sorted(
            (r.trial_id, r.bracket, r.milestone, r.iteration, r.decision, r.reason, r.at_end)
            for r in rungs
        )
        values = {
            (r.trial_id, r.milestone): r.value
            for t in seeded.trials
            for r in store.reader.trial_rungs(t)
        }
        assert all(values[(r.trial_id, r.milestone)] == r.value for r in rungs)
        assert [(r.bracket, r.milestone) for r in rungs] == sorted(
            (r.bracket, r.milestone) for r in rungs
        )
        assert all(r.values is None for r in rungs)
        stops = {r.trial_id for r in rungs if r.stopped}
        assert stops and all(
            not r.at_end and r.decision is Decision.STOP for r in rungs if r.stopped
        )

    def test_a_rung_s_records_come_in_the_order_recorded_with_nan_and_vectors(self, store):
        store.ensure_experiment("asha", metric="loss", mode="min")
        run = store.create_experiment_run("asha", "r1")
        for trial_id in ("c", "a", "b", "v"):
            register(store, trial_id, run)
        for trial_id, value, decision in (
            ("c", 0.5, Decision.CONTINUE),
            ("a", math.nan, Decision.CONTINUE),
            ("b", 0.9, Decision.STOP),
        ):
            OneWriteEach(store).record_rung(
                run,
                trial_id,
                bracket=0,
                milestone=3,
                value=value,
                iteration=3,
                decide=_verdict(
                    decision, "the rung's cutoff 0.7" if decision is Decision.STOP else None
                ),
            )
        OneWriteEach(store).record_rung(
            run,
            "c",
            bracket=0,
            milestone=1,
            value=0.8,
            iteration=1,
            decide=_verdict(Decision.CONTINUE),
        )
        OneWriteEach(store).record_vector_rung(
            run,
            "v",
            bracket=1,
            milestone=1,
            values=[math.nan, 2.5],
            iteration=1,
            at_end=True,
            decide=_verdict(Decision.STOP),
        )
        rungs = store.reader.run_rungs(run)
        assert [(r.bracket, r.milestone, r.trial_id) for r in rungs] == [
            (0, 1.0, "c"),
            (0, 3.0, "c"),
            (0, 3.0, "a"),
            (0, 3.0, "b"),
            (1, 1.0, "v"),
        ]
        assert math.isnan(rungs[2].value) and rungs[3].reason == "the rung's cutoff 0.7"
        assert rungs[3].stopped and not rungs[4].stopped  # a verdict at the end stops nothing
        vector = rungs[4]
        assert vector.values is not None and math.isnan(vector.values[0])
        assert vector.values[1] == 2.5 and math.isnan(vector.value)
        assert store.reader.run_decision_counts(run) == RunDecisionCounts(5, 1, 0)

    def test_run_exploits_are_the_run_s_in_the_order_recorded_in_one_query(self, store):
        seeded = pbt_run(store, "pbt", 12, generations=3)
        other = pbt_run(store, "other", 4, generations=1)
        reader = store.reader
        exploits, statements = _statements(store, lambda: reader.run_exploits(seeded.run))
        assert statements == 1
        assert [(e.trial_id, e.donor_trial_id, e.iteration) for e in exploits] == seeded.exploits
        assert [e.id for e in exploits] == sorted(e.id for e in exploits)
        assert not {e.trial_id for e in exploits} & set(other.trials)
        first = exploits[0]
        [stored] = [e for e in store.reader.trial_exploits(first.trial_id) if e.id == first.id]
        assert (first.old_config, first.new_config, first.operations, first.donor_checkpoint) == (
            stored.old_config,
            stored.new_config,
            stored.operations,
            stored.donor_checkpoint,
        )
        assert first.created_at == stored.created_at

    def test_the_counts_are_one_query_and_say_when_a_run_has_nothing(self, store):
        asha = asha_run(store, "asha", 9)
        pbt = pbt_run(store, "pbt", 8, generations=2)
        reader = store.reader
        counts, statements = _statements(store, lambda: reader.run_decision_counts(asha.run))
        assert statements == 1
        rungs = reader.run_rungs(asha.run)
        assert counts == RunDecisionCounts(len(rungs), sum(r.stopped for r in rungs), 0)
        assert counts and counts.stopped > 0
        assert reader.run_decision_counts(pbt.run) == RunDecisionCounts(0, 0, len(pbt.exploits))
        store.ensure_experiment("fifo", metric="loss", mode="min")
        quiet = store.create_experiment_run("fifo", "r1")
        register(store, "quiet-0", quiet)
        for run in (quiet, 999_999):  # no decisions, and no such run: nothing, no error
            assert not reader.run_decision_counts(run)
            assert reader.run_rungs(run) == [] and reader.run_exploits(run) == []

    def test_a_read_only_reader_on_the_url_reads_them(self, store):
        if self.backend == MEMORY:
            pytest.skip("an in-memory database is the store's own connection's only")
        from airflow_trials.store import TrialReader

        seeded = asha_run(store, "asha", 5)
        reader = TrialReader(store.url)
        try:
            assert len(reader.run_rungs(seeded.run)) == len(store.reader.run_rungs(seeded.run))
        finally:
            reader.dispose()


class TestInMemorySQLite(RunDecisionsContract):
    backend = MEMORY


class TestSQLiteFile(RunDecisionsContract):
    backend = SQLITE_FILE


class TestPostgreSQL(RunDecisionsContract):
    backend = POSTGRESQL
