"""TrialStore: the metadata store of experiments, runs, trials, results and checkpoints."""

from __future__ import annotations

import json
import logging
import math
import numbers
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

from sqlalchemy import Engine, Insert, Table, bindparam, case, delete, func, select, text
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from airflow_trials.core.resources import Resources
from airflow_trials.core.result import TIMESTAMP, TRAINING_ITERATION
from airflow_trials.core.status import TrialStatus, check_transition
from airflow_trials.exceptions import InvalidTransitionError, StoreError, TrialNotFoundError
from airflow_trials.store.engine import (
    WRITE_OPTION,
    create_store_engine,
    default_store_url,
    safe_url,
)
from airflow_trials.store.jsonsafe import json_safe
from airflow_trials.store.leaderboard import (
    best_leaderboard_query,
    check_metric,
    check_mode,
    leaderboard_query,
    metric_index,
)
from airflow_trials.store.migration import upgrade_engine
from airflow_trials.store.models import (
    ID_LENGTH,
    CheckpointRow,
    ExperimentRow,
    ExperimentRunRow,
    ResultRow,
    TrialRow,
    utcnow,
)
from airflow_trials.store.records import (
    CheckpointRecordRow,
    ExperimentRecord,
    ExperimentRunRecord,
    ExperimentRunStatus,
    LeaderboardRow,
    TrialRecord,
)
from airflow_trials.store.retry import RetryPolicy, is_transient

log = logging.getLogger(__name__)

_STATUSES = {status.value: status for status in TrialStatus}
_T = TypeVar("_T")
# The seed column is BIGINT (migration 0003): any signed 64-bit seed is kept exactly.
SEED_MIN, SEED_MAX = -(2**63), 2**63 - 1

# pg_advisory_xact_lock key held while creating a metric index, so two stores never race on it.
_METRIC_INDEX_LOCK_KEY = 0x61745F6D6978  # "at_mix"


@dataclass(frozen=True)
class TrialProgress:
    """What one trial did since it was last polled, for :meth:`TrialStore.record_progress`.

    :param trial_id: the trial.
    :param results: its new result dicts (as for :meth:`TrialStore.add_results`); default none.
    :param new_checkpoints: ``(path, iteration, score)`` of checkpoints it kept; default none.
    :param deleted_checkpoints: paths of recorded checkpoints it dropped; default none.
    :param running: set it RUNNING (it was placed and answers); default False.
    """

    trial_id: str
    results: Sequence[Mapping[str, Any]] = ()
    new_checkpoints: Sequence[tuple[str, int, float | None]] = ()
    deleted_checkpoints: Sequence[str] = ()
    running: bool = False


class TrialStore:
    """The metadata store: one database (never Airflow's) shared by every task, trigger and UI.

    Every public method runs in its own transaction: it commits, or rolls back entirely and
    raises :class:`~airflow_trials.exceptions.StoreError` (chained to the database error). A
    transaction that failed transiently (connection lost, server restarting, serialization
    failure, deadlock, SQLite busy) runs again, with exponential backoff and jitter, until the
    ``retry_*`` budget is spent; other database errors fail at once. All writes are idempotent,
    so a retry, or an Airflow retry, may repeat them. One instance may be shared by threads; each
    call takes its own connection.

    Example::

        store = TrialStore("sqlite:////tmp/trials.db", create=True)
        run = store.create_experiment_run("mnist", "manual-1")
        store.upsert_trial("t-1", trainable="pkg.train:fn", config={"lr": 0.1},
                           resources={"cpu": 1}, max_failures=0, experiment_run_id=run)
        store.update_trial("t-1", status="RUNNING")
        store.add_results("t-1", [{"training_iteration": 1, "loss": 0.5}])
        store.leaderboard(run, "loss", "min")

    :param url: SQLAlchemy URL; default :func:`~airflow_trials.store.default_store_url`
        (a SQLite file). Production: ``postgresql+psycopg://user:password@host/db``.
    :param create: apply the migrations first (see :func:`~airflow_trials.store.migrate`);
        default False, i.e. the schema must exist already.
    :param retry_max_attempts: attempts of a call that fails transiently (lost connection,
        server restart, serialization failure or deadlock, SQLite busy), the first included;
        default 8. 1 turns retrying off.
    :param retry_timeout_seconds: no new attempt starts this long after the first; default 30.
    :param retry_initial_backoff_seconds: the longest wait after the first failure, doubled
        after each further one; default 0.1.
    :param retry_max_backoff_seconds: the longest wait between two attempts; default 5.
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        create: bool = False,
        retry_max_attempts: int = RetryPolicy.max_attempts,
        retry_timeout_seconds: float = RetryPolicy.timeout_seconds,
        retry_initial_backoff_seconds: float = RetryPolicy.initial_backoff_seconds,
        retry_max_backoff_seconds: float = RetryPolicy.max_backoff_seconds,
    ) -> None:
        self._url = url if url is not None else default_store_url()
        self._retry_policy = RetryPolicy(
            max_attempts=retry_max_attempts,
            timeout_seconds=retry_timeout_seconds,
            initial_backoff_seconds=retry_initial_backoff_seconds,
            max_backoff_seconds=retry_max_backoff_seconds,
        )
        self._engine: Engine = create_store_engine(self._url)
        # Same pool; on SQLite its transactions start with BEGIN IMMEDIATE (see engine.py).
        self._write_engine: Engine = self._engine.execution_options(**{WRITE_OPTION: True})
        self._dialect = self._engine.dialect.name
        self._indexed_metrics: set[str] = set()
        if create:
            # On the store's own engine: a second engine on sqlite:// would be another database.
            upgrade_engine(self._engine)

    @property
    def url(self) -> str:
        return self._url

    def dispose(self) -> None:
        """Close every pooled connection; the store opens new ones if used again."""
        self._engine.dispose()

    def __repr__(self) -> str:
        return f"TrialStore({safe_url(self._url)!r})"

    # -- plumbing --------------------------------------------------------------------------

    def _transaction(self, operation: str, work: Callable[[Session], _T], *, write: bool = True) -> _T:
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
                delay = self._retry_policy.delay_seconds(attempt, elapsed) if is_transient(e) else None
                if delay is None:
                    raise self._store_error(operation, e, attempt, elapsed) from e
                log.warning(
                    "Trial store could not %s at attempt %d of %d (%s: %s); retrying in %.2f s",
                    operation, attempt, self._retry_policy.max_attempts, type(e).__name__,
                    _cause(e), delay,
                )
                time.sleep(delay)

    @contextmanager
    def _session_scope(self, operation: str, *, write: bool = True) -> Iterator[Session]:
        """One attempt of a transaction, for subclasses' reads; public methods use _transaction."""
        try:
            with self._session(write) as session, session.begin():
                yield session
        except SQLAlchemyError as e:
            raise self._store_error(operation, e, 1, 0.0) from e

    def _session(self, write: bool) -> Session:
        return Session(bind=self._write_engine if write else self._engine, expire_on_commit=False)

    def _store_error(
        self, operation: str, error: SQLAlchemyError, attempts: int, elapsed_seconds: float
    ) -> StoreError:
        where = safe_url(self._url)
        if is_transient(error):
            return StoreError(
                f"Trial store could not {operation}: {type(error).__name__}: {_cause(error)}. The "
                f"database at {where} failed transiently (connection lost or refused, server "
                f"restarting, lock contention) at every attempt: {_attempts(attempts)} over "
                f"{elapsed_seconds:.1f} s. Check that the database is up and reachable, or give the "
                f"TrialStore a larger retry_timeout_seconds / retry_max_attempts; then repeat the "
                f"call, which is safe: every write is idempotent."
            )
        return StoreError(
            f"Trial store could not {operation}: {type(error).__name__}: {_cause(error)}. Nothing of "
            f"it was written. Check that {where} is reachable and migrated "
            f"(python -m airflow_trials.store upgrade --url URL) and that the ids exist, then retry."
        )

    def _find_or_raise(
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
            raise TrialNotFoundError(
                f"Cannot {operation}: trial {trial_id} is not in the trial store at "
                f"{safe_url(self._url)}; register it with upsert_trial first.",
                trial_id=trial_id,
            )
        return row

    def _find_run_or_raise(self, session: Session, run_id_pk: int, operation: str) -> ExperimentRunRow:
        row = session.get(ExperimentRunRow, run_id_pk)
        if row is None:
            raise StoreError(
                f"Cannot {operation}: experiment run {run_id_pk} is not in the trial store at "
                f"{safe_url(self._url)}; create it with create_experiment_run first."
            )
        return row

    def _insert(self, table: Table) -> Any:
        """INSERT with ON CONFLICT support for this store's dialect."""
        if self._dialect == "postgresql":
            return postgresql.insert(table)
        if self._dialect == "sqlite":
            return sqlite.insert(table)
        raise StoreError(
            f"The trial store supports SQLite and PostgreSQL, not {self._dialect} "
            f"({safe_url(self._url)}); use a sqlite:/// or postgresql+psycopg:// URL."
        )

    # -- experiments -----------------------------------------------------------------------

    def ensure_experiment(self, name: str, metric: str | None = None, mode: str | None = None) -> int:
        """The experiment's id, creating it if needed; ``metric`` and ``mode`` are updated when given.

        Giving a metric also creates its leaderboard index (see :meth:`ensure_metric_index`).

        :param name: unique experiment name (at most 128 characters).
        :param metric: metric its leaderboard ranks by; default: leave as is.
        :param mode: ``"min"`` or ``"max"``; default: leave as is.
        """
        _check_id("Experiment name", name)
        if mode is not None:
            check_mode(mode)
        if metric is not None:
            check_metric(metric)
        changes = {k: v for k, v in (("metric", metric), ("mode", mode)) if v is not None}

        def work(session: Session) -> int:
            experiment_id = self._ensure_experiment(session, name)
            if changes:
                session.execute(
                    ExperimentRow.__table__.update()
                    .where(ExperimentRow.id == experiment_id)
                    .values(**changes)
                )
            return experiment_id

        experiment_id = self._transaction(f"register experiment {name}", work)
        if metric is not None:
            self.ensure_metric_index(metric)
        return experiment_id

    def _ensure_experiment(self, session: Session, name: str) -> int:
        table = ExperimentRow.__table__
        session.execute(
            self._insert(table)
            .values(name=name, created_at=utcnow())
            .on_conflict_do_nothing(index_elements=[table.c.name])
        )
        return session.execute(select(ExperimentRow.id).where(ExperimentRow.name == name)).scalar_one()

    def ensure_metric_index(self, metric: str) -> None:
        """Create the index that makes :meth:`leaderboard` fast for ``metric``, if it is missing.

        :meth:`leaderboard` works without it, only slower (it then reads every result of the run).
        """
        check_metric(metric)
        if metric in self._indexed_metrics:
            return
        index = metric_index(metric, self._dialect)

        def work(session: Session) -> None:
            connection = session.connection()
            if self._dialect == "postgresql":
                connection.execute(
                    text("SELECT pg_advisory_xact_lock(:key)"), {"key": _METRIC_INDEX_LOCK_KEY}
                )
            # Checked first rather than IF NOT EXISTS: PostgreSQL would lock at_results against
            # writes even when the index exists. (SQLAlchemy's own check does not see expression
            # indexes on SQLite.)
            if self._dialect == "postgresql":
                exists_query = text("SELECT to_regclass(:name) IS NOT NULL")
            else:
                exists_query = text(
                    "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'index' AND name = :name)"
                )
            if not connection.execute(exists_query, {"name": index.name}).scalar_one():
                log.info("Creating leaderboard index %s of metric %r", index.name, metric)
                index.create(connection)

        self._transaction(f"create the leaderboard index of metric {metric!r}", work)
        self._indexed_metrics.add(metric)

    def create_experiment_run(
        self,
        experiment_name: str,
        run_key: str,
        *,
        dag_id: str | None = None,
        run_id: str | None = None,
        search_space: Mapping[str, Any] | None = None,
        seed: int | None = None,
        num_samples: int | None = None,
    ) -> int:
        """The id of the run ``run_key`` of the experiment, creating both if needed.

        Idempotent on (experiment, run_key): a second call returns the existing run's id and
        changes nothing.

        :param experiment_name: the experiment; created (without metric) if it does not exist.
        :param run_key: unique within the experiment, e.g. the Airflow run_id.
        :param dag_id: Airflow DAG id; default None.
        :param run_id: Airflow run id; default None.
        :param search_space: the search space, stored as JSON; default None.
        :param seed: random seed of the search, a signed 64-bit integer (any value of
            ``experiment.run_seed``, which is below 2**32, fits); default None.
        :param num_samples: number of trials asked for; default None.
        """
        _check_id("Experiment name", experiment_name)
        _check_id("run_key", run_key, max_length=250)
        seed = _check_seed(seed, f"run {run_key} of experiment {experiment_name}")
        table = ExperimentRunRow.__table__
        values = {
            "run_key": run_key,
            "dag_id": dag_id,
            "run_id": run_id,
            "search_space": None if search_space is None else json_safe(search_space),
            "seed": seed,
            "num_samples": num_samples,
            "status": ExperimentRunStatus.RUNNING.value,
        }

        def work(session: Session) -> int:
            experiment_id = self._ensure_experiment(session, experiment_name)
            session.execute(
                self._insert(table)
                .values(experiment_id=experiment_id, created_at=utcnow(), **values)
                .on_conflict_do_nothing(index_elements=[table.c.experiment_id, table.c.run_key])
            )
            return session.execute(
                select(ExperimentRunRow.id).where(
                    ExperimentRunRow.experiment_id == experiment_id,
                    ExperimentRunRow.run_key == run_key,
                )
            ).scalar_one()

        return self._transaction(f"create run {run_key} of experiment {experiment_name}", work)

    def finish_experiment_run(self, run_id_pk: int, status: str) -> None:
        """Set a run's status: SUCCESS or FAILED set ``ended_at``, RUNNING clears it.

        Setting the status a run has already keeps its ``ended_at``, so repeating the call
        changes nothing.

        :param run_id_pk: the run's id, as returned by :meth:`create_experiment_run`.
        :param status: RUNNING, SUCCESS or FAILED.
        """
        new = _parse_enum(ExperimentRunStatus, status, f"experiment run {run_id_pk}")

        def work(session: Session) -> None:
            run = self._find_run_or_raise(session, run_id_pk, f"finish experiment run {run_id_pk}")
            if not new.is_terminal():
                run.ended_at = None
            elif run.status != new.value or run.ended_at is None:
                run.ended_at = utcnow()
            run.status = new.value

        self._transaction(f"set experiment run {run_id_pk} to {new.value}", work)

    def list_experiments(self) -> list[ExperimentRecord]:
        """Every experiment, oldest first."""

        def work(session: Session) -> list[ExperimentRecord]:
            rows = session.execute(
                select(ExperimentRow).order_by(ExperimentRow.created_at, ExperimentRow.id)
            ).scalars()
            return [
                ExperimentRecord(
                    id=row.id, name=row.name, metric=row.metric, mode=row.mode, created_at=row.created_at
                )
                for row in rows
            ]

        return self._transaction("list experiments", work, write=False)

    def list_experiment_runs(self, experiment_name: str | None = None) -> list[ExperimentRunRecord]:
        """Runs of one experiment, or of all, oldest first.

        :param experiment_name: only this experiment's runs; default all.
        """
        query = (
            select(ExperimentRunRow, ExperimentRow.name)
            .join(ExperimentRow, ExperimentRow.id == ExperimentRunRow.experiment_id)
            .order_by(ExperimentRunRow.created_at, ExperimentRunRow.id)
        )
        if experiment_name is not None:
            query = query.where(ExperimentRow.name == experiment_name)

        def work(session: Session) -> list[ExperimentRunRecord]:
            return [
                ExperimentRunRecord(
                    id=run.id,
                    experiment_id=run.experiment_id,
                    experiment_name=name,
                    run_key=run.run_key,
                    dag_id=run.dag_id,
                    run_id=run.run_id,
                    search_space=run.search_space,
                    seed=run.seed,
                    num_samples=run.num_samples,
                    status=ExperimentRunStatus(run.status),
                    created_at=run.created_at,
                    ended_at=run.ended_at,
                )
                for run, name in session.execute(query)
            ]

        return self._transaction("list experiment runs", work, write=False)

    # -- trials ----------------------------------------------------------------------------

    def upsert_trial(
        self,
        trial_id: str,
        *,
        trainable: str,
        config: Mapping[str, Any],
        resources: Mapping[str, Any] | Resources,
        max_failures: int,
        experiment_run_id: int | None = None,
        status: str = TrialStatus.PENDING.value,
        dag_id: str | None = None,
        run_id: str | None = None,
        task_id: str | None = None,
        map_index: int = -1,
        try_number: int | None = None,
    ) -> None:
        """Register a trial, or refresh the Airflow ids of one already registered.

        On an existing trial only ``dag_id``, ``run_id``, ``task_id``, ``map_index`` and
        ``try_number`` change, and only those given (not None; ``map_index`` with ``task_id``);
        its status, failures and results are never reset. Calling it again is harmless.

        :param trial_id: globally unique id (at most 128 characters), generated by the caller.
        :param trainable: import path of the trainable.
        :param config: hyperparameters (stored as JSON, see :mod:`~airflow_trials.store.jsonsafe`).
        :param resources: resources per trial, a dict or :class:`~airflow_trials.Resources`.
        :param max_failures: failures tolerated (-1: unlimited).
        :param experiment_run_id: the run it belongs to; default None (run outside Airflow).
        :param status: status of a new trial; default PENDING.
        :param dag_id: Airflow DAG id; default None.
        :param run_id: Airflow run id; default None.
        :param task_id: Airflow task id; default None.
        :param map_index: Airflow map index; default -1.
        :param try_number: Airflow try number; default None.
        """
        _check_id("Trial id", trial_id)
        new_status = _parse_enum(TrialStatus, status, f"trial {trial_id}")
        resources_dict = resources.to_dict() if isinstance(resources, Resources) else resources
        now = utcnow()
        table = TrialRow.__table__
        insert = self._insert(table).values(
            trial_id=trial_id,
            experiment_run_id=experiment_run_id,
            trainable=trainable,
            config=json_safe(dict(config)),
            resources=json_safe(dict(resources_dict)),
            status=new_status.value,
            num_failures=0,
            max_failures=max_failures,
            created_at=now,
            updated_at=now,
            started_at=now if new_status is TrialStatus.RUNNING else None,
            ended_at=now if new_status.is_terminal() else None,
            dag_id=dag_id,
            run_id=run_id,
            task_id=task_id,
            map_index=map_index,
            try_number=try_number,
        )
        new = insert.excluded
        insert = insert.on_conflict_do_update(
            index_elements=[table.c.trial_id],
            set_={
                "dag_id": func.coalesce(new.dag_id, table.c.dag_id),
                "run_id": func.coalesce(new.run_id, table.c.run_id),
                "task_id": func.coalesce(new.task_id, table.c.task_id),
                "map_index": case((new.task_id.is_not(None), new.map_index), else_=table.c.map_index),
                "try_number": func.coalesce(new.try_number, table.c.try_number),
                "updated_at": new.updated_at,
            },
        )
        run_note = f" in experiment run {experiment_run_id}" if experiment_run_id is not None else ""
        self._transaction(f"register trial {trial_id}{run_note}", lambda session: session.execute(insert))

    def update_trial(
        self,
        trial_id: str,
        *,
        status: str | None = None,
        num_failures: int | None = None,
        error_msg: str | None = None,
        last_result: Mapping[str, Any] | None = None,
        try_number: int | None = None,
    ) -> None:
        """Change a trial; only the arguments given (not None) are written.

        A status change goes through :func:`~airflow_trials.core.status.check_transition`; an
        invalid one raises InvalidTransitionError and nothing is written. The first RUNNING sets
        ``started_at``; TERMINATED or ERROR set ``ended_at``, leaving them clears it.

        :param trial_id: the trial.
        :param status: new status; default unchanged.
        :param num_failures: failures so far; default unchanged.
        :param error_msg: full traceback of the last failure; default unchanged, except that a
            change to TERMINATED clears it.
        :param last_result: replaces the last result; default unchanged (add_results keeps it
            current on its own).
        :param try_number: Airflow try number; default unchanged.
        """
        new_status = None if status is None else _parse_enum(TrialStatus, status, f"trial {trial_id}")
        operation = f"update trial {trial_id}" + (f" to {new_status.value}" if new_status else "")
        fields: dict[str, Any] = {
            name: value
            for name, value in (("num_failures", num_failures), ("error_msg", error_msg), ("try_number", try_number))
            if value is not None
        }
        if last_result is not None:
            fields["last_result"] = json_safe(dict(last_result))

        def work(session: Session) -> None:
            trial = self._find_or_raise(session, trial_id, operation, lock=True)
            _change_trial(trial, new_status, fields)

        self._transaction(operation, work)

    def stop_trial_for_try(self, trial_id: str, try_number: int | None, error_msg: str) -> bool:
        """Record that the Airflow try ``try_number`` stopped the trial (TERMINATED with
        ``error_msg``), unless a later try has registered it since; whether it did.

        The fence of a cleared task: its old try's trigger runs ``on_kill`` while its next try may
        already run ``execute``. Checked and written under the row lock, so either the stop is
        recorded first (the new try then starts the trial again from its latest checkpoint) or
        the new try's registration is (the stop is skipped and the new try keeps the live trial).
        ``try_number`` None stops it whatever try registered it.
        """
        operation = f"stop trial {trial_id} for try {try_number}"

        def work(session: Session) -> bool:
            trial = self._find_or_raise(session, trial_id, operation, lock=True)
            if try_number is not None and trial.try_number is not None and trial.try_number > try_number:
                return False
            if not TrialStatus(trial.status).is_terminal():
                _change_trial(trial, TrialStatus.TERMINATED, {"error_msg": error_msg})
            return True

        return self._transaction(operation, work)

    def restart_trial(self, trial_id: str, *, try_number: int | None = None) -> list[str]:
        """Make a finished trial start over from scratch; the checkpoint paths it dropped.

        For a task cleared after its trial ended (Airflow re-runs a cleared task, replacing
        its XComs; the trial's results are replaced the same way). In one transaction the
        trial's results and checkpoint rows are deleted and it goes back to PENDING with no
        failures, error, last or best result. The caller deletes the returned checkpoints'
        files. A trial that has not ended raises InvalidTransitionError and nothing changes.

        :param trial_id: the trial.
        :param try_number: the Airflow try that re-runs it; default unchanged.
        """
        operation = f"restart trial {trial_id}"

        def work(session: Session) -> list[str]:
            trial = self._find_or_raise(session, trial_id, operation, lock=True)
            if not TrialStatus(trial.status).is_terminal():
                raise InvalidTransitionError(
                    f"Cannot {operation} from scratch: it is {trial.status}, not finished. Stop it "
                    "first, or resume it from its latest checkpoint instead."
                )
            paths = list(session.execute(select(CheckpointRow.path).where(CheckpointRow.trial_id == trial_id)).scalars())
            session.execute(delete(CheckpointRow).where(CheckpointRow.trial_id == trial_id))
            session.execute(delete(ResultRow).where(ResultRow.trial_id == trial_id))
            _change_trial(trial, TrialStatus.PENDING, {"num_failures": 0, "error_msg": None, "last_result": None})
            trial.started_at = None
            trial.best_value = trial.best_iteration = None
            if try_number is not None:
                trial.try_number = try_number
            return paths

        return self._transaction(operation, work)

    def get_trial(self, trial_id: str) -> TrialRecord:
        """The trial's record; raises TrialNotFoundError for an unknown id."""
        operation = f"read trial {trial_id}"
        return self._transaction(
            operation,
            lambda session: _trial_record(self._find_or_raise(session, trial_id, operation)),
            write=False,
        )

    def list_trials(
        self, *, experiment_run_id: int | None = None, experiment_name: str | None = None
    ) -> list[TrialRecord]:
        """Trials ordered by created_at, then trial_id.

        :param experiment_run_id: only the trials of this run; default any.
        :param experiment_name: only the trials of this experiment's runs; default any.
        """
        query = select(TrialRow).order_by(TrialRow.created_at, TrialRow.trial_id)
        if experiment_run_id is not None:
            query = query.where(TrialRow.experiment_run_id == experiment_run_id)
        if experiment_name is not None:
            query = (
                query.join(ExperimentRunRow, ExperimentRunRow.id == TrialRow.experiment_run_id)
                .join(ExperimentRow, ExperimentRow.id == ExperimentRunRow.experiment_id)
                .where(ExperimentRow.name == experiment_name)
            )
        return self._transaction(
            "list trials",
            lambda session: [_trial_record(row) for row in session.execute(query).scalars()],
            write=False,
        )

    # -- results ---------------------------------------------------------------------------

    def add_results(self, trial_id: str, results: Sequence[Mapping[str, Any]]) -> int:
        """Store a batch of a trial's results once per iteration; returns how many were new.

        Each result needs an integer ``training_iteration``; ``timestamp`` (seconds since the
        epoch) defaults to now. A result whose iteration is stored already is skipped, so
        writing a batch twice, or from two writers at once, stores it once. Values are made
        JSON-safe first (numpy scalars become numbers, NaN and inf become None: see
        :mod:`~airflow_trials.store.jsonsafe`). When a new result has the highest iteration so
        far, it becomes the trial's ``last_result``. The whole batch is written in one
        transaction, or not at all.

        The count is a report, not a guarantee: when the connection was lost while the batch was
        being committed and the retry finds it stored, the call returns 0 for it.

        :param trial_id: a trial registered with :meth:`upsert_trial`.
        :param results: the result dicts, in any order.
        """
        rows = _result_rows(trial_id, results)
        operation = f"add {len(rows)} results to trial {trial_id}"
        return self._transaction(operation, lambda session: self._add_results(session, trial_id, rows, operation))

    def _add_results(
        self, session: Session, trial_id: str, rows: list[dict[str, Any]], operation: str,
        goals: dict[int, Any] | None = None,
    ) -> int:
        # Locking the trial makes concurrent batches of one trial take turns, so the
        # last_result check below sees every result committed before it.
        trial = self._find_or_raise(session, trial_id, operation, lock=True)
        if not rows:
            return 0
        previous_max = session.execute(
            select(func.max(ResultRow.iteration)).where(ResultRow.trial_id == trial_id)
        ).scalar_one_or_none()
        table = ResultRow.__table__
        inserted: Insert = (
            self._insert(table)
            .on_conflict_do_nothing(index_elements=[table.c.trial_id, table.c.iteration])
            .returning(table.c.iteration)
        )
        new_iterations = list(session.execute(inserted, rows).scalars())
        if new_iterations and (previous_max is None or max(new_iterations) > previous_max):
            newest = max(new_iterations)
            trial.last_result = next(row["metrics"] for row in rows if row["iteration"] == newest)
            trial.updated_at = utcnow()
        if new_iterations:
            self._update_best(session, trial, [r for r in rows if r["iteration"] in set(new_iterations)],
                              had_results=previous_max is not None, goals=goals)
        return len(new_iterations)

    def _update_best(
        self, session: Session, trial: TrialRow, new_rows: list[dict[str, Any]], had_results: bool,
        goals: dict[int, Any] | None = None,
    ) -> None:
        """Fold the new results into the trial's best value of its experiment's metric;
        ``goals`` caches each run's metric and mode within one transaction."""
        goal = None
        run_id = trial.experiment_run_id
        if run_id is not None and goals is not None and run_id in goals:
            goal = goals[run_id]
        elif run_id is not None:
            goal = session.execute(
                select(ExperimentRow.metric, ExperimentRow.mode)
                .join(ExperimentRunRow, ExperimentRunRow.experiment_id == ExperimentRow.id)
                .where(ExperimentRunRow.id == run_id)
            ).one_or_none()
            if goals is not None:
                goals[run_id] = goal
        if goal is None or goal.metric is None or goal.mode is None:
            return
        if (trial.best_metric, trial.best_mode) != (goal.metric, goal.mode):
            if had_results:
                # Earlier results were ranked for another metric (or not at all): unknown now.
                trial.best_metric = trial.best_mode = None
                trial.best_value = trial.best_iteration = None
                return
            trial.best_metric, trial.best_mode = goal.metric, goal.mode
            trial.best_value = trial.best_iteration = None
        sign = 1.0 if goal.mode == "min" else -1.0
        for row in new_rows:
            value = row["metrics"].get(goal.metric)
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                continue
            key = (sign * float(value), row["iteration"])
            if trial.best_value is None or key < (sign * trial.best_value, trial.best_iteration or 0):
                trial.best_value, trial.best_iteration = float(value), row["iteration"]

    def recompute_best(self, experiment_run_id: int) -> int:
        """Recompute every trial's best value of the run's experiment metric from its results.

        Needed only for results loaded around :meth:`add_results` (bulk loads, data from before
        migration 0002) or after the experiment's metric changed. Returns the trials updated.
        """
        operation = f"recompute the best values of experiment run {experiment_run_id}"

        def work(session: Session) -> int:
            run = self._find_run_or_raise(session, experiment_run_id, operation)
            experiment = session.get(ExperimentRow, run.experiment_id)
            if experiment is None or experiment.metric is None or experiment.mode is None:
                return 0
            query = leaderboard_query(self._dialect, experiment_run_id, experiment.metric, experiment.mode, None)
            rows = [
                {"t": r.trial_id, "m": experiment.metric, "o": experiment.mode, "v": r.best_value,
                 "i": r.best_iteration}
                for r in session.connection().execute(query)
            ]
            if rows:
                table = TrialRow.__table__
                session.connection().execute(
                    table.update()
                    .where(table.c.trial_id == bindparam("t"))
                    .values(best_metric=bindparam("m"), best_mode=bindparam("o"),
                            best_value=bindparam("v"), best_iteration=bindparam("i")),
                    rows,
                )
            return len(rows)

        return self._transaction(operation, work)

    def get_results(self, trial_id: str) -> list[dict[str, Any]]:
        """The trial's stored result dicts, ordered by iteration."""
        operation = f"read the results of trial {trial_id}"

        def work(session: Session) -> list[dict[str, Any]]:
            self._find_or_raise(session, trial_id, operation)
            return list(
                session.execute(
                    select(ResultRow.metrics)
                    .where(ResultRow.trial_id == trial_id)
                    .order_by(ResultRow.iteration)
                ).scalars()
            )

        return self._transaction(operation, work, write=False)

    # -- progress of many trials at once ---------------------------------------------------

    def record_progress(self, batch: Sequence[TrialProgress]) -> int:
        """Write what many trials did since they were last polled, in one transaction; returns
        how many results were new.

        Per trial, in this order: the status RUNNING when ``running`` (through the guarded
        transition, so an ended trial refuses it), the results as :meth:`add_results` writes
        them (once per iteration), the new checkpoints as :meth:`add_checkpoint` and the
        dropped ones as :meth:`mark_checkpoint_deleted`. Trials are locked in trial_id order, so
        two batches never deadlock. One trial that cannot be written (unknown, an invalid
        transition, an unknown checkpoint) fails the whole batch and nothing is written: the
        caller may then write the trials one by one to find it.

        :param batch: one :class:`TrialProgress` per trial (a trial at most once).
        """
        items = sorted(batch, key=lambda item: item.trial_id)
        rows = {item.trial_id: _result_rows(item.trial_id, item.results) for item in items}
        if len(rows) != len(items):
            twice = sorted(trial_id for trial_id, n in Counter(i.trial_id for i in items).items() if n > 1)
            raise ValueError(
                f"A progress batch names trials {twice} more than once; nothing was written. "
                "Merge each trial's progress into one TrialProgress."
            )
        operation = f"record the progress of {len(items)} trials ({sum(map(len, rows.values()))} results)"

        def work(session: Session) -> int:
            new = 0
            goals: dict[int, Any] = {}
            # The trials' changed rows are written once, at commit, rather than before each query.
            with session.no_autoflush:
                for item in items:
                    trial = None
                    if rows[item.trial_id]:
                        new += self._add_results(session, item.trial_id, rows[item.trial_id], operation, goals)
                        # Loaded and locked by _add_results: the session hands it back without a query.
                        trial = session.get(TrialRow, item.trial_id)
                    trial = trial or self._find_or_raise(session, item.trial_id, operation, lock=True)
                    if item.running:
                        _change_trial(trial, TrialStatus.RUNNING, {})
                    for path, iteration, score in item.new_checkpoints:
                        self._add_checkpoint(session, item.trial_id, path, iteration, score)
                    for path in item.deleted_checkpoints:
                        self._mark_checkpoint_deleted(session, item.trial_id, path, operation)
            return new

        return self._transaction(operation, work)

    # -- checkpoints -----------------------------------------------------------------------

    def add_checkpoint(
        self, trial_id: str, path: str, iteration: int, score: float | None = None
    ) -> None:
        """Record a persisted checkpoint; a second call with the same path changes nothing.

        :param trial_id: the trial.
        :param path: directory or URL of the checkpoint (at most 1024 characters).
        :param iteration: training_iteration it was taken at.
        :param score: score it is ranked by; default None. NaN and inf are stored as None.
        """
        operation = f"add checkpoint {path} of trial {trial_id}"

        def work(session: Session) -> None:
            self._find_or_raise(session, trial_id, operation)
            self._add_checkpoint(session, trial_id, path, iteration, score)

        self._transaction(operation, work)

    def _add_checkpoint(
        self, session: Session, trial_id: str, path: str, iteration: int, score: float | None
    ) -> None:
        table = CheckpointRow.__table__
        session.execute(
            self._insert(table)
            .values(
                trial_id=trial_id,
                path=path,
                iteration=int(iteration),
                score=None if score is None else json_safe(score),
                deleted=False,
                created_at=utcnow(),
            )
            .on_conflict_do_nothing(index_elements=[table.c.trial_id, table.c.path])
        )

    def mark_checkpoint_deleted(self, trial_id: str, path: str) -> None:
        """Mark a recorded checkpoint as deleted (idempotent); raises StoreError for an unknown path."""
        operation = f"mark checkpoint {path} of trial {trial_id} deleted"

        def work(session: Session) -> None:
            self._find_or_raise(session, trial_id, operation)
            self._mark_checkpoint_deleted(session, trial_id, path, operation)

        self._transaction(operation, work)

    def _mark_checkpoint_deleted(self, session: Session, trial_id: str, path: str, operation: str) -> None:
        checkpoint = session.execute(
            select(CheckpointRow).where(CheckpointRow.trial_id == trial_id, CheckpointRow.path == path)
        ).scalar_one_or_none()
        if checkpoint is None:
            raise StoreError(
                f"Cannot {operation}: trial {trial_id} has no checkpoint at {path} in the trial "
                f"store at {safe_url(self._url)}; record it with add_checkpoint first."
            )
        checkpoint.deleted = True

    def latest_checkpoint(self, trial_id: str) -> CheckpointRecordRow | None:
        """The not-deleted checkpoint with the highest iteration, or None when there is none."""
        operation = f"read the latest checkpoint of trial {trial_id}"

        def work(session: Session) -> CheckpointRecordRow | None:
            self._find_or_raise(session, trial_id, operation)
            row = session.execute(
                select(CheckpointRow)
                .where(CheckpointRow.trial_id == trial_id, CheckpointRow.deleted.is_(False))
                .order_by(CheckpointRow.iteration.desc(), CheckpointRow.id.desc())
                .limit(1)
            ).scalar_one_or_none()
            if row is None:
                return None
            return CheckpointRecordRow(
                path=row.path, iteration=row.iteration, score=row.score, deleted=row.deleted
            )

        return self._transaction(operation, work, write=False)

    # -- leaderboard -----------------------------------------------------------------------

    def leaderboard(
        self, experiment_run_id: int, metric: str, mode: str = "min", limit: int | None = None
    ) -> list[LeaderboardRow]:
        """Trials of a run ranked by their best value of ``metric``, computed in SQL.

        One row per trial: best value (lowest for ``"min"``, highest for ``"max"``) over its
        results, the first iteration that reached it, and its latest kept checkpoint. Trials that
        never reported the metric as a number come last, then ties by trial_id. Fast with the
        metric's index (:meth:`ensure_metric_index`, made by ``ensure_experiment(metric=...)``).

        :param experiment_run_id: the run.
        :param metric: key of the metric in the results.
        :param mode: ``"min"`` (default) or ``"max"``.
        :param limit: at most this many rows; default all.
        """
        check_mode(mode)
        check_metric(metric)
        if limit is not None and limit < 1:
            raise ValueError(f"limit must be at least 1 or None, got {limit}.")
        operation = f"rank the trials of experiment run {experiment_run_id} by {mode} {metric}"

        def work(session: Session) -> list[LeaderboardRow]:
            run = self._find_run_or_raise(session, experiment_run_id, operation)
            connection = session.connection()
            if self._best_is_current(session, run, metric, mode):
                # Every trial's best is maintained for this metric and mode: one row per trial.
                query = best_leaderboard_query(experiment_run_id, mode, limit)
            else:
                query = leaderboard_query(self._dialect, experiment_run_id, metric, mode, limit)
            if self._dialect == "postgresql":
                # The per-trial probes inflate the cost estimate past jit_above_cost, and
                # compiling the plan then takes longer than running it.
                connection.execute(text("SET LOCAL jit = off"))
            return [
                LeaderboardRow(
                    trial_id=trial_id,
                    status=_STATUSES[status],
                    num_failures=num_failures,
                    config=json.loads(config),
                    best_value=best_value,
                    best_iteration=best_iteration,
                    checkpoint_path=checkpoint_path,
                )
                # Core rows, not ORM: the ORM's per-row work would cost more than the query.
                for trial_id, status, num_failures, config, best_value, best_iteration, checkpoint_path
                in connection.execute(query)
            ]

        return self._transaction(operation, work, write=False)


    @staticmethod
    def _best_is_current(session: Session, run: ExperimentRunRow, metric: str, mode: str) -> bool:
        experiment = session.get(ExperimentRow, run.experiment_id)
        if experiment is None or (experiment.metric, experiment.mode) != (metric, mode):
            return False
        trials = TrialRow.__table__
        stale = session.execute(
            select(func.count())
            .select_from(trials)
            .where(
                trials.c.experiment_run_id == run.id,
                trials.c.last_result.is_not(None),
                (trials.c.best_metric.is_distinct_from(metric)) | (trials.c.best_mode.is_distinct_from(mode)),
            )
        ).scalar_one()
        return stale == 0


def _check_id(kind: str, value: str, max_length: int = ID_LENGTH) -> None:
    if not isinstance(value, str) or not value or len(value) > max_length:
        raise ValueError(
            f"{kind} must be a non-empty string of at most {max_length} characters, got {value!r}."
        )


def _check_seed(seed: Any, owner: str) -> int | None:
    """The seed as a Python int, refused (ValueError) unless it is an integer that fits in 64 bits."""
    if seed is None:
        return None
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise ValueError(
            f"Seed {seed!r} of {owner} is a {type(seed).__name__}, not an integer; nothing was "
            f"written. Pass an int between {SEED_MIN} and {SEED_MAX}."
        )
    if not SEED_MIN <= int(seed) <= SEED_MAX:
        raise ValueError(
            f"Seed {seed} of {owner} does not fit the trial store's signed 64-bit seed column "
            f"({SEED_MIN} to {SEED_MAX}); nothing was written. Pass a smaller seed, e.g. "
            f"seed % 2**63."
        )
    return int(seed)


def _attempts(attempts: int) -> str:
    """``"3 attempts (2 retries)"``, ``"1 attempt (no retry)"``."""
    if attempts == 1:
        return "1 attempt (no retry)"
    return f"{attempts} attempts ({attempts - 1} {'retry' if attempts == 2 else 'retries'})"


def _cause(error: SQLAlchemyError) -> object:
    """The driver's own error when there is one: its message is the one that says why."""
    return getattr(error, "orig", None) or error


def _parse_enum(enum: Any, value: str, owner: str) -> Any:
    try:
        return enum(value)
    except ValueError as e:
        allowed = ", ".join(member.value for member in enum)
        raise ValueError(f"Status {value!r} of {owner} is not one of {allowed}.") from e


def _result_rows(trial_id: str, results: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Validated, JSON-safe rows of a batch: one per iteration (first wins), sorted by iteration."""
    if isinstance(results, Mapping) or not isinstance(results, Sequence):
        raise ValueError(
            f"Results of trial {trial_id} must be a list of result dicts, got {type(results).__name__}; "
            f"wrap a single result in a list."
        )
    rows: dict[int, dict[str, Any]] = {}
    now = time.time()
    for position, result in enumerate(results):
        if not isinstance(result, Mapping):
            raise ValueError(
                f"Result {position} of the batch for trial {trial_id} is a {type(result).__name__}, "
                f"not a dict; nothing of the batch was written."
            )
        metrics = json_safe(result)
        iteration = metrics.get(TRAINING_ITERATION)
        if isinstance(iteration, bool) or not isinstance(iteration, int):
            raise ValueError(
                f"Result {position} of the batch for trial {trial_id} has no integer "
                f"{TRAINING_ITERATION} (got {result.get(TRAINING_ITERATION)!r}); nothing of the "
                f"batch was written. Report results through airflow_trials.report, which numbers them."
            )
        timestamp = metrics.get(TIMESTAMP)
        if isinstance(timestamp, bool) or not isinstance(timestamp, numbers.Real) or not math.isfinite(timestamp):
            timestamp = now
        rows.setdefault(
            iteration,
            {"trial_id": trial_id, "iteration": iteration, "timestamp": float(timestamp), "metrics": metrics},
        )
    # Sorted, so concurrent batches of one trial insert keys in the same order.
    return [rows[iteration] for iteration in sorted(rows)]


def _change_trial(trial: TrialRow, new_status: TrialStatus | None, fields: Mapping[str, Any]) -> None:
    """Apply update_trial's changes to the locked row; the same status again is a no-op."""
    now = utcnow()
    if new_status is not None:
        current = TrialStatus(trial.status)
        check_transition(trial.trial_id, current, new_status)
        if new_status is TrialStatus.RUNNING and trial.started_at is None:
            trial.started_at = now
        if not new_status.is_terminal():
            trial.ended_at = None
        elif not current.is_terminal() or trial.ended_at is None:
            # ERROR -> TERMINATED keeps the time the trial actually ended.
            trial.ended_at = now
        if new_status is TrialStatus.TERMINATED and current is not TrialStatus.TERMINATED:
            # A trial that finished after a retry no longer shows the failure it recovered from.
            trial.error_msg = None
        trial.status = new_status.value
    for name, value in fields.items():
        setattr(trial, name, value)
    trial.updated_at = now


def _trial_record(row: TrialRow) -> TrialRecord:
    return TrialRecord(
        trial_id=row.trial_id,
        experiment_run_id=row.experiment_run_id,
        trainable=row.trainable,
        config=row.config,
        resources=row.resources,
        status=TrialStatus(row.status),
        num_failures=row.num_failures,
        max_failures=row.max_failures,
        error_msg=row.error_msg,
        last_result=row.last_result,
        created_at=row.created_at,
        started_at=row.started_at,
        ended_at=row.ended_at,
        updated_at=row.updated_at,
        dag_id=row.dag_id,
        run_id=row.run_id,
        task_id=row.task_id,
        map_index=row.map_index,
        try_number=row.try_number,
    )
