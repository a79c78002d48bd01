"""ExperimentWriter: the trials store's experiments and runs, as they are created and finished."""

from __future__ import annotations

import logging
import numbers
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import select, text
from sqlalchemy.orm import Session

from airflow_trials.core.constraints import Constraints
from airflow_trials.core.jsonsafe import json_safe
from airflow_trials.core.pareto import MetricSpec, ModeSpec, encode_metrics
from airflow_trials.store.base import StoreBase
from airflow_trials.store.database import check_id, parse_enum
from airflow_trials.store.feasibility import constraints_json
from airflow_trials.store.leaderboard import (
    check_metric,
    check_mode,
    metric_index,
)
from airflow_trials.store.models import (
    ExperimentRow,
    ExperimentRunRow,
    utcnow,
)
from airflow_trials.store.records import ExperimentRunStatus
from airflow_trials.store.run_summaries import store_summary

log = logging.getLogger(__name__)

# The seed column is BIGINT (migration 0003): any signed 64-bit seed is kept exactly.
SEED_MIN, SEED_MAX = -(2**63), 2**63 - 1

# pg_advisory_xact_lock key held while creating a metric index, so two stores never race on it.
_METRIC_INDEX_LOCK_KEY = 0x61745F6D6978  # "at_mix"


class RunAlreadyEndedError(ValueError):
    """The run has ended already, so it is not ended again (``finish_experiment_run(...,
    if_running=True)``); nothing was written."""


def already_ended(
    run_key: str, run_id: int, experiment: str, status: str, ended_at: datetime | None
) -> str:
    """The one line that says a run has ended already, and what to do instead."""
    when = "" if ended_at is None else f" at {ended_at:%Y-%m-%d %H:%M:%S} UTC"
    return (
        f"Run {run_key} (id {run_id}) of experiment {experiment} has already ended: it is "
        f"{status}{when}, so nothing was changed. 'airflow-trials runs {experiment} -o json' "
        "shows how it ended (end_reason, when it was ended by hand)."
    )


class ExperimentWriter(StoreBase):
    """Experiments and their runs (one run per Airflow DAG run or main job); the leaderboard's
    metric indexes."""

    def ensure_experiment(
        self,
        name: str,
        metric: MetricSpec | None = None,
        mode: ModeSpec | None = None,
        constraints: Sequence[str] | Constraints | None = None,
    ) -> int:
        """The experiment's id, creating it if needed; ``metric`` and ``mode`` are updated when
        given.

        Giving a metric also creates its leaderboard index (see :meth:`ensure_metric_index`).
        Several metrics (a list, with a list of one mode per metric) are stored together as one
        JSON object in the metric column, with the mode column set to NULL
        (:func:`~airflow_trials.core.pareto.encode_metrics`); each gets its leaderboard index.
        Read them back decoded with ``ExperimentRecord.metrics`` and ``.modes``.

        :param name: unique experiment name (at most 128 characters).
        :param metric: metric its leaderboard ranks by, or a list of several; default: leave as
            is.
        :param mode: ``"min"`` or ``"max"``, or with several metrics a list of one per metric;
            default: leave as is.
        :param constraints: the experiment's constraints on reported metrics (``["latency <=
            5.0"]``, :mod:`airflow_trials.core.constraints`), stored in their canonical spelling
            as a JSON list; the leaderboards rank feasible trials first. An empty list clears
            them; default None: leave as is.
        :raises ValueError: a bad mode or metric name, lists that do not pair up, or a constraint
            that does not parse; nothing is written.
        """
        check_id("Experiment name", name)
        names = _checked_metrics(name, metric, mode)
        changes: dict[str, str | None] = {}
        if constraints is not None:
            parsed = Constraints.parse(constraints, f"Experiment {name}")
            changes["constraints"] = constraints_json(parsed)
        if isinstance(metric, list | tuple):
            changes["metric"], _ = encode_metrics(list(metric), list(mode or []))
            changes["mode"] = None  # the modes are in the metric column's JSON
        else:
            if metric is not None:
                changes["metric"] = metric
            if isinstance(mode, str):
                changes["mode"] = mode

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
        for one in names:
            self.ensure_metric_index(one)
        return experiment_id

    def _ensure_experiment(self, session: Session, name: str) -> int:
        table = ExperimentRow.__table__
        session.execute(
            self._insert(table)
            .values(name=name, created_at=utcnow())
            .on_conflict_do_nothing(index_elements=[table.c.name])
        )
        query = select(ExperimentRow.id).where(ExperimentRow.name == name)
        return session.execute(query).scalar_one()

    def ensure_metric_index(self, metric: str) -> None:
        """Create the index that makes :meth:`leaderboard` fast for ``metric``, if it is missing.

        :meth:`leaderboard` works without it, only slower (it then reads every result of the run).
        """
        check_metric(metric)
        if metric in self._db.indexed_metrics:
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
                    "SELECT EXISTS (SELECT 1 FROM sqlite_master"
                    " WHERE type = 'index' AND name = :name)"
                )
            if not connection.execute(exists_query, {"name": index.name}).scalar_one():
                log.info("Creating leaderboard index %s of metric %r", index.name, metric)
                index.create(connection)

        self._transaction(f"create the leaderboard index of metric {metric!r}", work)
        self._db.indexed_metrics.add(metric)

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
        data_version: str | None = None,
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
        :param data_version: the version of the data the run tunes on, at most 250 characters;
            default None (it names none). Kept as the run first recorded it.
        """
        check_id("Experiment name", experiment_name)
        check_id("run_key", run_key, max_length=250)
        if data_version is not None:
            check_id(f"data_version of run {run_key}", data_version, max_length=250)
        seed = _check_seed(seed, f"run {run_key} of experiment {experiment_name}")
        table = ExperimentRunRow.__table__
        values = {
            "run_key": run_key,
            "dag_id": dag_id,
            "run_id": run_id,
            "search_space": None if search_space is None else json_safe(search_space),
            "seed": seed,
            "num_samples": num_samples,
            "data_version": data_version,
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

    def finish_experiment_run(
        self,
        run_id_pk: int,
        status: str,
        *,
        reason: str | None = None,
        if_running: bool = False,
    ) -> None:
        """Set a run's status: SUCCESS or FAILED set ``ended_at`` and store the run's history
        line, RUNNING clears both (its trials may change again).

        Setting the status a run has already keeps its ``ended_at``, so repeating the call
        changes nothing but the stored line, computed again from the trials as they are. The line
        is the history's own (:func:`~airflow_trials.store.run_history.run_lines`), computed in this
        transaction under the run's row lock, and forgotten by any later write of one of the
        run's trials (:mod:`~airflow_trials.store.run_summaries`).

        :param run_id_pk: the run's id, as returned by :meth:`create_experiment_run`.
        :param status: RUNNING, SUCCESS or FAILED.
        :param reason: why the run ends, kept as its ``end_reason`` (``airflow-trials db
            end-run``); default None: it ended on its own (``select_best``). Every call replaces
            it, so it always tells why the run's latest end came.
        :param if_running: end it only if it is RUNNING, checked under the row lock; default
            False.
        :raises RunAlreadyEndedError: with ``if_running``, the run has ended; nothing is written.
        """
        new = parse_enum(ExperimentRunStatus, status, f"experiment run {run_id_pk}")
        if reason is not None and not new.is_terminal():
            raise ValueError(
                f"Experiment run {run_id_pk}: a reason goes with an end (SUCCESS or FAILED), not "
                f"with {new.value}; nothing was written."
            )

        def work(session: Session) -> None:
            run = self._find_run_or_raise(
                session, run_id_pk, f"finish experiment run {run_id_pk}", lock=True
            )
            if if_running and run.status != ExperimentRunStatus.RUNNING.value:
                name = session.execute(
                    select(ExperimentRow.name).where(ExperimentRow.id == run.experiment_id)
                ).scalar_one()
                raise RunAlreadyEndedError(
                    already_ended(run.run_key, run.id, name, run.status, run.ended_at)
                )
            if not new.is_terminal():
                run.ended_at = None
            elif run.status != new.value or run.ended_at is None:
                run.ended_at = utcnow()
            run.status = new.value
            run.end_reason = reason
            if new.is_terminal():
                store_summary(session, self._dialect, run)
            else:
                run.summary = None

        self._transaction(f"set experiment run {run_id_pk} to {new.value}", work)

    def record_pick(self, experiment_run_id: int, trial_id: str) -> None:
        """Record the trial ``select_best`` picked in the run (the Pareto scatter marks it, the
        history shows it); a later pick replaces it, and recording the same one again changes
        nothing.

        :param experiment_run_id: the run, as returned by :meth:`create_experiment_run`.
        :param trial_id: one of the run's trials.
        :raises TrialNotFoundError: no trial ``trial_id``; nothing is written.
        :raises ValueError: the trial belongs to another run, or to none; nothing is written.
        """
        check_id("Trial id", trial_id)
        operation = f"record trial {trial_id} as the pick of experiment run {experiment_run_id}"

        def work(session: Session) -> None:
            run = self._find_run_or_raise(session, experiment_run_id, operation)
            trial = self._find_or_raise(session, trial_id, operation)
            if trial.experiment_run_id != experiment_run_id:
                owner = (
                    "no experiment run"
                    if trial.experiment_run_id is None
                    else f"experiment run {trial.experiment_run_id}"
                )
                raise ValueError(
                    f"Cannot {operation}: trial {trial_id} belongs to {owner}, not to run "
                    f"{experiment_run_id}; nothing was written. Pick one of the run's own trials "
                    f"(list_trials(experiment_run_id={experiment_run_id}))."
                )
            run.picked_trial_id = trial_id

        self._transaction(operation, work)


def _checked_metrics(name: str, metric: MetricSpec | None, mode: ModeSpec | None) -> list[str]:
    """The metric names ``ensure_experiment`` indexes, after checking metric and mode: one as
    always, several as lists that pair up, each a name the leaderboard can rank by."""
    if not isinstance(metric, list | tuple):
        if isinstance(mode, list | tuple):
            raise ValueError(
                f"Experiment {name}: mode={mode!r} is a list but metric={metric!r} is not; give "
                "metric as a list too, one name per mode, or one mode as a string."
            )
        if mode is not None:
            check_mode(mode)
        if metric is not None:
            check_metric(metric)
        return [] if metric is None else [metric]
    try:
        encode_metrics(list(metric), list(mode) if isinstance(mode, list | tuple) else mode)
    except ValueError as e:
        raise ValueError(f"Experiment {name}: {e}") from e
    for one in metric:
        check_metric(one)
    return list(metric)


def _check_seed(seed: Any, owner: str) -> int | None:
    """The seed as a Python int; ValueError unless it is an integer that fits in 64 bits."""
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
