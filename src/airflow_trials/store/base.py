"""StoreBase: one component of the trials store (its experiments, trials, results, rungs...), over
the :class:`~airflow_trials.store.database.Database` that all components share."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any, TypeVar

from sqlalchemy import Table
from sqlalchemy.orm import Session

from airflow_trials.store.database import Database, check_id, parse_enum
from airflow_trials.store.models import ExperimentRunRow, TrialRow

_T = TypeVar("_T")

# The helpers' old names, for the components written against them.
_check_id = check_id
_parse_enum = parse_enum


class StoreBase:
    """A component: it holds the shared database, never another component.

    :class:`~airflow_trials.store.TrialStore` builds one of each over its database and its
    declared methods delegate to them; :class:`~airflow_trials.store.TrialReader` holds none of
    the writers.
    The ``_``-prefixed helpers below are the database's, shortened for the components' bodies.

    :param db: the database; a write method needs one that is not read-only.
    """

    def __init__(self, db: Database) -> None:
        self._db = db

    @property
    def _dialect(self) -> str:
        return self._db.dialect

    @property
    def _url(self) -> str:
        return self._db.url

    def _transaction(
        self, operation: str, work: Callable[[Session], _T], *, write: bool = True
    ) -> _T:
        return self._db.transaction(operation, work, write=write)

    def _session_scope(
        self, operation: str, *, write: bool = True
    ) -> AbstractContextManager[Session]:
        return self._db.session_scope(operation, write=write)

    def _find_or_raise(
        self, session: Session, trial_id: str, operation: str, *, lock: bool = False
    ) -> TrialRow:
        return self._db.find_trial(session, trial_id, operation, lock=lock)

    def _find_all_or_raise(
        self, session: Session, trial_ids: Sequence[str], operation: str, *, lock: bool = False
    ) -> dict[str, TrialRow]:
        return self._db.find_trials(session, trial_ids, operation, lock=lock)

    def _find_run_or_raise(
        self, session: Session, run_pk: int, operation: str, *, lock: bool = False
    ) -> ExperimentRunRow:
        return self._db.find_run(session, run_pk, operation, lock=lock)

    def _trial_of_run(
        self, session: Session, experiment_run_id: int, trial_id: str, operation: str
    ) -> None:
        self._db.trial_of_run(session, experiment_run_id, trial_id, operation)

    def _insert(self, table: Table) -> Any:
        return self._db.insert(table)
