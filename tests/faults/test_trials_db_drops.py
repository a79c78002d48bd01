"""Case 5: the trials DB (PostgreSQL) drops every connection, every 0.4 s, for most of a run.

The experiment runs in a database of its own; a thread in the test runs ``pg_terminate_backend``
on every backend of that database from the trigger until every trial has trained to its end.
With ``max_failures=0`` no task may fail and no result may be lost.

SQLite's side of the issue (32 concurrent writers lose and duplicate nothing) is the store's
contract test
``tests/contract/test_store.py::test_32_concurrent_writers_lose_nothing_and_duplicate_nothing``,
which runs on a SQLite file and on PostgreSQL; it is not repeated here.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from tests.contract.conftest import new_postgres_database, postgres_url
from tests.faults.trainables import read_journal

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(900)]

KILL_EVERY_S = 0.4


@pytest.fixture(scope="module")
def trials_db_url() -> Iterator[str]:
    """A new, migrated PostgreSQL database for the module's trials DB, dropped afterwards."""
    from airflow_trials.store import migrate

    with new_postgres_database("at_faults") as database:
        migrate(database.url)
        yield database.url


@pytest.fixture(scope="module")
def stack(own_stack):
    """A stack of this module's own, on the PostgreSQL trials DB above."""
    return own_stack


class BackendKiller:
    """Terminates every backend of one database every ``KILL_EVERY_S`` until stopped, from a
    connection to another database; counts what it terminated."""

    def __init__(self, url: str) -> None:
        from sqlalchemy import create_engine, make_url

        target = make_url(url)
        self.database = target.database
        self.engine = create_engine(make_url(postgres_url()), isolation_level="AUTOCOMMIT")
        self.terminated = 0
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="backend-killer", daemon=True)

    def _run(self) -> None:
        from sqlalchemy import text

        terminate = text(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = :db AND pid <> pg_backend_pid()"
        )
        try:
            with self.engine.connect() as connection:
                while not self._stop.wait(KILL_EVERY_S):
                    self.terminated += connection.execute(
                        terminate, {"db": self.database}
                    ).scalar_one()
        except BaseException as e:  # noqa: BLE001 - raised again by __exit__ in the test's thread
            self.error = e

    def __enter__(self) -> BackendKiller:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        self.engine.dispose()
        if self.error is not None:
            raise AssertionError(f"The backend killer failed: {self.error}") from self.error


def run_ended(stack, run) -> bool:
    from urllib.parse import quote

    from tests.faults.stack import TERMINAL_RUN_STATES

    return (
        stack.api("GET", f"/dags/{run.dag_id}/dagRuns/{quote(run.run_id, safe='')}")["state"]
        in TERMINAL_RUN_STATES
    )


def test_dropped_trials_db_connections_lose_no_result_and_fail_no_task(stack, experiment):
    run = experiment("faults_db_drops", trials=3, max_failures=0)
    with BackendKiller(stack.trials_db_url) as killer:
        run.trigger()
        # Under fire, the test reads Airflow's REST API and the journals, not the trials DB.
        stack.wait_for(
            lambda: (
                len(tis := run.trial_tis()) == run.trials
                and all(ti["state"] == "deferred" for ti in tis)
            ),
            300,
            "the trial tasks to defer",
        )
        run.open_gate()
        stack.wait_for(
            lambda: all(
                any(
                    inc.iterations[-1:] == [run.iterations]
                    for inc in read_journal(run.journal_dir, t)
                )
                for t in run.trial_ids
            ),
            300,
            "every trial to train to its end",
        )
        # The run's connections can all fall between two volleys while the trials train (they are
        # short): keep firing through the tasks' ends and select_best until one was dropped, never
        # past the run's end, rather than racing the trials.
        stack.wait_for(
            lambda: killer.terminated > 0 or run_ended(stack, run),
            300,
            "a trials DB connection of the run to be dropped, or the run to end",
        )
    assert killer.terminated > 0, "no connection was dropped: the test proved nothing"
    assert run.finish() == "success"

    run.assert_no_lost_results()
    run.assert_no_duplicate_trial()
    run.assert_trials_end("TERMINATED")
    run.assert_tasks_end()
    run.assert_experiment_run("SUCCESS")
    stack.assert_triggerer_responsive(since=run.triggered_at)
