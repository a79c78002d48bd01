"""Database: the trials store's engines, transactions with retries, errors and row lookups, which
every component of the store shares (read-only for a reader)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

from sqlalchemy import Engine, Table, func, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from airflow_trials.exceptions import StoreError, TrialNotFoundError
from airflow_trials.store.engine import (
    WRITE_OPTION,
    create_store_engine,
    safe_url,
)
from airflow_trials.store.migration import upgrade_engine
from airflow_trials.store.models import (
    ID_LENGTH,
    ExperimentRunRow,
    TrialRow,
)
from airflow_trials.store.retry import RetryPolicy, is_transient
from airflow_trials.trials_db_url import trials_db_url

log = logging.getLogger(__name__)

_T = TypeVar("_T")


class Database:
    """One trials database as the store's components share it: its engines, one transaction helper
    that retries transient errors and turns the rest into StoreError, and the row lookups.

    Takes :class:`~airflow_trials.store.TrialStore`'s parameters, plus ``read_only``: a read-only
    database (what :class:`~airflow_trials.store.TrialReader` opens on its own) has no write engine,
    refuses write transactions and never migrates.
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        create: bool = False,
        read_only: bool = False,
        retry_max_attempts: int = RetryPolicy.max_attempts,
        retry_timeout_seconds: float = RetryPolicy.timeout_seconds,
        retry_initial_backoff_seconds: float = RetryPolicy.initial_backoff_seconds,
        retry_max_backoff_seconds: float = RetryPolicy.max_backoff_seconds,
    ) -> None:
        if create and read_only:
            raise ValueError(
                "A read-only trials database cannot migrate its schema; open a TrialStore with "
                "create=True (or run airflow_trials.store.migrate) first."
            )
        # No URL: the one every entry point finds (the trials_default connection, then
        # AIRFLOW_TRIALS_DB_URL, then the default SQLite file), never the default file alone.
        self._url = url if url is not None else trials_db_url()[0]
        self._retry_policy = RetryPolicy(
            max_attempts=retry_max_attempts,
            timeout_seconds=retry_timeout_seconds,
            initial_backoff_seconds=retry_initial_backoff_seconds,
            max_backoff_seconds=retry_max_backoff_seconds,
        )
        self._engine: Engine = create_store_engine(self._url)
        # Same pool; on SQLite its transactions start with BEGIN IMMEDIATE (see engine.py).
        self._write_engine: Engine | None = (
            None if read_only else self._engine.execution_options(**{WRITE_OPTION: True})
        )
        self.dialect = self._engine.dialect.name
        self.indexed_metrics: set[str] = set()
        if create:
            # On the store's own engine: a second engine on sqlite:// would be another database.
            upgrade_engine(self._engine)

    @property
    def read_only(self) -> bool:
        return self._write_engine is None

    @property
    def engine(self) -> Engine:
        """The engine reads use (and migrations: the schema is created on it)."""
        return self._engine

    @property
    def write_engine(self) -> Engine | None:
        """The same pool, SQLite's write transactions beginning IMMEDIATE; None when read-only."""
        return self._write_engine

    @property
    def url(self) -> str:
        return self._url

    def dispose(self) -> None:
        """Close every pooled connection; the store opens new ones if used again."""
        self._engine.dispose()

    def __repr__(self) -> str:
        return f"TrialStore({safe_url(self._url)!r})"

    def transaction(
        self, operation: str, work: Callable[[Session], _T], *, write: bool = True
    ) -> _T:
        """``work(session)`` in one transaction that commits; all of it runs again after a
        transient error (see :func:`~airflow_trials.store.retry.is_transient`), within the retry
        policy. Every public method goes through here, so every one must be safe to run twice.

        A database error that is not transient, or outlasts the policy, rolls back and becomes
        StoreError; any other exception (TrialNotFoundError, ValueError, ...) passes unchanged.
        """
        started = time.monotonic()
        attempt = 0
        while True:
            attempt += 1
            try:
                with self._session(write) as session, session.begin():
                    return work(session)
            except SQLAlchemyError as e:
                elapsed = time.monotonic() - started
                delay = (
                    self._retry_policy.delay_seconds(attempt, elapsed) if is_transient(e) else None
                )
                if delay is None:
                    raise self._store_error(operation, e, attempt, elapsed, write=write) from e
                log.warning(
                    "Trial store could not %s at attempt %d of %d (%s: %s); retrying in %.2f s",
                    operation,
                    attempt,
                    self._retry_policy.max_attempts,
                    type(e).__name__,
                    _cause(e),
                    delay,
                )
                time.sleep(delay)

    @contextmanager
    def session_scope(self, operation: str, *, write: bool = True) -> Iterator[Session]:
        """One attempt of a transaction (no retry), for the batch reads of pages."""
        try:
            with self._session(write) as session, session.begin():
                yield session
        except SQLAlchemyError as e:
            raise self._store_error(operation, e, 1, 0.0, write=write) from e

    def _session(self, write: bool) -> Session:
        if not write:
            return Session(bind=self._engine, expire_on_commit=False)
        if self._write_engine is None:
            raise StoreError(
                f"The trials database at {safe_url(self._url)} is open read-only (a TrialReader); "
                "write through a TrialStore."
            )
        return Session(bind=self._write_engine, expire_on_commit=False)

    def _store_error(
        self,
        operation: str,
        error: SQLAlchemyError,
        attempts: int,
        elapsed_seconds: float,
        *,
        write: bool = True,
    ) -> StoreError:
        """The error to raise; one line, so that a command that prints only the first line (the
        ``airflow-trials`` CLI) still shows what to do."""
        where = safe_url(self._url)
        upgrade = "airflow-trials db upgrade"
        if is_transient(error):
            return StoreError(
                f"Trial store could not {operation}: {type(error).__name__}: {_cause(error)}. The "
                f"database at {where} failed transiently (connection lost or refused, server "
                f"restarting, lock contention) at every attempt: {_attempts(attempts)} over "
                f"{elapsed_seconds:.1f} s. Check that the database is up and reachable, or give "
                f"the TrialStore a larger retry_timeout_seconds / retry_max_attempts; then repeat "
                f"the call, which is safe: every write is idempotent.",
                fix="The trials DB failed transiently at every attempt: check that it is up and "
                "reachable, then retry.",
            )
        if not write:
            return StoreError(
                f"Trial store could not {operation}: {type(error).__name__}: {_cause(error)}. "
                f"Check that {where} is reachable and migrated ({upgrade} "
                f"--db-url URL, or python -m airflow_trials.store upgrade --url URL), then retry.",
                fix=f"Check that the trials DB is reachable and migrated ({upgrade}), then retry.",
            )
        return StoreError(
            f"Trial store could not {operation}: {type(error).__name__}: {_cause(error)}. Nothing "
            f"of it was written. Check that {where} is reachable and migrated "
            f"(python -m airflow_trials.store upgrade --url URL) and that the ids exist, then "
            f"retry.",
            fix=f"Nothing was written. Check that the trials DB is reachable and migrated "
            f"({upgrade}) and that the ids exist, then retry.",
        )

    def find_trial(
        self, session: Session, trial_id: str, operation: str, *, lock: bool = False
    ) -> TrialRow:
        """The trial's row; with ``lock``, held until commit so writers of one trial take turns."""
        query = select(TrialRow).where(TrialRow.trial_id == trial_id)
        if lock:
            # FOR NO KEY UPDATE on PostgreSQL: still lets other transactions insert rows that
            # reference the trial. SQLite has no row locks; BEGIN IMMEDIATE serialises writers.
            query = query.with_for_update(key_share=True)
        row = session.execute(query).scalar_one_or_none()
        if row is None:
            raise self._trial_not_found(trial_id, operation)
        return row

    def find_trials(
        self, session: Session, trial_ids: Sequence[str], operation: str, *, lock: bool = False
    ) -> dict[str, TrialRow]:
        """The trials' rows by id, in one query; with ``lock``, held until commit and taken in
        trial_id order (so two writers of overlapping sets never deadlock), as
        :meth:`find_trial` holds one. The first unknown id, in order, raises."""
        ordered = sorted(set(trial_ids))
        query = select(TrialRow).where(TrialRow.trial_id.in_(ordered)).order_by(TrialRow.trial_id)
        if lock:
            query = query.with_for_update(key_share=True)
        rows = {row.trial_id: row for row in session.execute(query).scalars()}
        for trial_id in ordered:
            if trial_id not in rows:
                raise self._trial_not_found(trial_id, operation)
        return rows

    def _trial_not_found(self, trial_id: str, operation: str) -> TrialNotFoundError:
        return TrialNotFoundError(
            f"Cannot {operation}: trial {trial_id} is not in the trial store at "
            f"{safe_url(self._url)}; register it with upsert_trial first.",
            trial_id=trial_id,
        )

    def find_run(
        self, session: Session, run_id_pk: int, operation: str, *, lock: bool = False
    ) -> ExperimentRunRow:
        """The run's row; with ``lock`` (FOR UPDATE on PostgreSQL), held until commit, so no
        transaction that writes one of its trials (:func:`~airflow_trials.store.run_summaries.
        trials_written`) runs meanwhile."""
        if lock:
            query = select(ExperimentRunRow).where(ExperimentRunRow.id == run_id_pk)
            row = session.execute(query.with_for_update()).scalar_one_or_none()
        else:
            row = session.get(ExperimentRunRow, run_id_pk)
        if row is None:
            raise StoreError(
                f"Cannot {operation}: experiment run {run_id_pk} is not in the trial store at "
                f"{safe_url(self._url)}; create it with create_experiment_run first."
            )
        return row

    def trial_of_run(
        self, session: Session, experiment_run_id: int, trial_id: str, operation: str
    ) -> None:
        """Check the trial belongs to the run: TrialNotFoundError for no such trial, StoreError
        for no such run, ValueError for a trial of another run."""
        trials = TrialRow.__table__
        query = select(trials.c.experiment_run_id).where(trials.c.trial_id == trial_id)
        row = session.connection().execute(query).first()
        if row is None:
            self.find_trial(session, trial_id, operation)  # raises TrialNotFoundError
        elif row[0] != experiment_run_id:
            self.find_run(session, experiment_run_id, operation)
            raise ValueError(
                f"Cannot {operation}: the trial belongs to experiment run {row[0]}; "
                "pass the run it was registered with (upsert_trial's experiment_run_id)."
            )

    def lock_run_key(self, session: Session, experiment_run_id: int, lock_key: int) -> None:
        """On PostgreSQL, take the run's transaction lock ``lock_key`` (a two-key advisory lock:
        a key space apart from the store's one-key locks; a collision only makes two writers take
        turns). SQLite needs none: a write transaction begins IMMEDIATE and holds the only write
        lock."""
        if self.dialect == "postgresql":
            session.connection().execute(
                select(func.pg_advisory_xact_lock(experiment_run_id, lock_key))
            )

    def insert(self, table: Table) -> Any:
        """INSERT with ON CONFLICT support for this store's dialect."""
        if self.dialect == "postgresql":
            return postgresql.insert(table)
        if self.dialect == "sqlite":
            return sqlite.insert(table)
        raise StoreError(
            f"The trial store supports SQLite and PostgreSQL, not {self.dialect} "
            f"({safe_url(self._url)}); use a sqlite:/// or postgresql+psycopg:// URL."
        )


def check_id(kind: str, value: str, max_length: int = ID_LENGTH) -> None:
    if not isinstance(value, str) or not value or len(value) > max_length:
        raise ValueError(
            f"{kind} must be a non-empty string of at most {max_length} characters, got {value!r}."
        )


def _attempts(attempts: int) -> str:
    """``"3 attempts (2 retries)"``, ``"1 attempt (no retry)"``."""
    if attempts == 1:
        return "1 attempt (no retry)"
    return f"{attempts} attempts ({attempts - 1} {'retry' if attempts == 2 else 'retries'})"


def _cause(error: SQLAlchemyError) -> str:
    """The driver's own error when there is one (its message is the one that says why), on one
    line: libpq's "Is the server running on that host...?" comes on a line of its own."""
    return " ".join(str(getattr(error, "orig", None) or error).split())


def parse_enum(enum: Any, value: str, owner: str) -> Any:
    try:
        return enum(value)
    except ValueError as e:
        allowed = ", ".join(member.value for member in enum)
        raise ValueError(f"Status {value!r} of {owner} is not one of {allowed}.") from e
