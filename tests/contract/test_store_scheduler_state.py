"""Contract of the scheduler verdict in the write of the result it judges (issue 48, item 1;
store/scheduler_state.py), on every backend: ``record_progress`` with a trial's judge writes its
results and the scheduler's verdicts on them in one transaction, or neither; a write that runs
again after a transient error judges once; and a judge remembers only what a committed write
found, so a write that failed is judged again in full when it is sent again."""

from __future__ import annotations

import pytest
from sqlalchemy import event
from sqlalchemy.exc import OperationalError

from airflow_trials.core.scheduler import Decision
from airflow_trials.core.update import TrialUpdate
from airflow_trials.schedulers.asha.asha_judging import RungJudge
from airflow_trials.schedulers.asha.asha_rungs import AshaRungs
from tests.contract.conftest import MEMORY, POSTGRESQL, SQLITE_FILE
from tests.contract.test_store_rungs import new_run
from tests.scheduler_writes import write_judged

RUNGS = AshaRungs(metric="loss", mode="min", max_t=8, grace_period=1, reduction_factor=2)


def result(iteration: int, loss: float) -> dict[str, float]:
    return {"training_iteration": iteration, "loss": loss}


def _transient(dialect: str) -> OperationalError:
    """An error the store's retry policy runs the transaction again for."""
    if dialect == "postgresql":
        import psycopg

        cause: Exception = psycopg.errors.SerializationFailure("could not serialize access")
    else:
        import sqlite3

        cause = sqlite3.OperationalError("database is locked")
    return OperationalError("UPDATE at_experiment_runs", {}, cause)


class SchedulerStateContract:
    """Every backend must pass these; subclasses name the backend for the ``store`` fixture."""

    backend: str

    def test_a_refused_write_keeps_neither_the_results_nor_their_verdicts(self, store):
        run = new_run(store, "r1", ["best", "a", "b"])
        write_judged(store, RungJudge(RUNGS, 0, run, "best"), [result(1, 0.1)])
        judge = RungJudge(RUNGS, 0, run, "a")
        call = judge.call()
        # b drops a checkpoint the store never recorded: the whole batch is refused.
        batch = [
            TrialUpdate("a", results=[result(1, 9.0)]),
            TrialUpdate("b", dropped_checkpoints=["/nowhere/checkpoint_1"]),
        ]
        with pytest.raises(Exception, match="nowhere"):
            store.record_progress(batch, judges={"a": call})
        assert store.reader.get_results("a") == []
        assert store.reader.trial_rungs("a") == []
        # The poller settles no call of a refused write, so the judge remembers nothing of it;
        # the same result, sent again, is judged and written.
        assert judge.verdicts == {}
        assert write_judged(store, judge, [result(1, 9.0)]) == judge.verdict_for(1)
        assert judge.verdict_for(1).decision is Decision.STOP
        assert [(r.milestone, r.decision) for r in store.reader.trial_rungs("a")] == [
            (1.0, Decision.STOP)
        ]
        assert [r["loss"] for r in store.reader.get_results("a")] == [9.0]

    def test_a_write_run_again_after_a_transient_error_judges_once(self, store):
        run = new_run(store, "r1", ["best", "a"])
        write_judged(store, RungJudge(RUNGS, 0, run, "best"), [result(1, 0.1)])
        judge = RungJudge(RUNGS, 0, run, "a")
        failed: list[str] = []

        def fail_once_after_the_verdict(conn, cursor, statement, parameters, context, many):
            # The first statement after the first rung's insert (the second result's judging)
            # fails once, transiently: the whole write, judging included, runs again.
            if "INSERT INTO at_trial_rungs" in statement and not failed:
                failed.append("armed")
            elif failed == ["armed"]:
                failed.append("raised")
                raise _transient(store._write_engine.dialect.name)

        event.listen(store._write_engine, "before_cursor_execute", fail_once_after_the_verdict)
        try:
            stop = write_judged(store, judge, [result(1, 9.0), result(2, 9.5)])
        finally:
            event.remove(store._write_engine, "before_cursor_execute", fail_once_after_the_verdict)
        assert failed == ["armed", "raised"]
        assert stop is not None and stop.iteration == 1
        # Each result reached its rung once (ASHA records the second too, as in memory).
        assert [(r.milestone, r.decision) for r in store.reader.trial_rungs("a")] == [
            (1.0, Decision.STOP),
            (2.0, Decision.CONTINUE),
        ]
        assert [r["training_iteration"] for r in store.reader.get_results("a")] == [1, 2]
        assert sorted(judge.verdicts) == [1, 2]

    def test_a_judge_of_a_trial_not_in_the_batch_is_refused_and_nothing_is_written(self, store):
        run = new_run(store, "r1", ["a", "b"])
        call = RungJudge(RUNGS, 0, run, "b").call()
        with pytest.raises(ValueError, match=r"schedulers of trials \['b'\], which the batch"):
            store.record_progress([TrialUpdate("a", results=[result(1, 1.0)])], judges={"b": call})
        assert store.reader.get_results("a") == []


class TestInMemorySQLite(SchedulerStateContract):
    backend = MEMORY


class TestSQLiteFile(SchedulerStateContract):
    backend = SQLITE_FILE


@pytest.mark.postgres
class TestPostgreSQL(SchedulerStateContract):
    backend = POSTGRESQL
