"""TrialReader: the trials store's read side, which cannot write; the dashboard, the CLI and
ResultGrid read through it, and :class:`~airflow_trials.store.TrialStore` hands out its reads."""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any, TypeVar

from sqlalchemy import func, select, text
from sqlalchemy.orm import Session

from airflow_trials.core.fate import stopped_early
from airflow_trials.exceptions import ExperimentNotFoundError
from airflow_trials.store.database import Database
from airflow_trials.store.exploits import exploit_lineage, latest_exploit
from airflow_trials.store.leaderboard import (
    best_checkpoint_path,
    best_is_current,
    best_leaderboard_query,
    check_metric,
    check_mode,
    leaderboard_query,
    metric_value,
)
from airflow_trials.store.mapping import (
    checkpoint_record,
    experiment_record,
    experiment_run_record,
    exploit_record,
    leaderboard_row,
    median_point,
    ranked_trial,
    rung_decision,
    trial_record,
)
from airflow_trials.store.models import (
    CheckpointRow,
    ExperimentRow,
    ExperimentRunRow,
    ResultRow,
    TrialExploitRow,
    TrialMedianPointRow,
    TrialRow,
    TrialRungRow,
)
from airflow_trials.store.records import (
    CheckpointRecordRow,
    ExperimentRecord,
    ExperimentRunRecord,
    ExploitRecord,
    LeaderboardRow,
    MedianPoint,
    RankedTrial,
    RungDecision,
    TrialRecord,
)
from airflow_trials.store.retry import RetryPolicy

_EXPLOITS = TrialExploitRow.__table__
_RUNGS = TrialRungRow.__table__
_POINTS = TrialMedianPointRow.__table__
_T = TypeVar("_T")


class TrialReader:
    """The trials store, read-only: every read of :class:`~airflow_trials.store.TrialStore`, and
    no method that writes. Hand it to whatever only reads (a dashboard, a report).

    Opened on a URL, its database is read-only: it has no write engine and never migrates (a
    TrialStore with ``create=True``, or :func:`~airflow_trials.store.migrate`, does). Each read is
    one transaction that retries transient errors as the TrialStore's do; the batch reads of
    pages (from :meth:`find_experiment_run` on) are one attempt each.

    Example::

        reader = TrialReader("sqlite:////tmp/trials.db")
        run = reader.resolve_run("mnist")
        reader.leaderboard(run.id, "loss", "min", limit=10)

    :param url: SQLAlchemy URL; default :func:`~airflow_trials.store.default_store_url`. Or an
        open :class:`~airflow_trials.store.database.Database` to share (a TrialStore's).
    :param retry_max_attempts: as TrialStore's; likewise the other ``retry_*`` parameters.
    """

    def __init__(
        self,
        url: str | Database | None = None,
        *,
        retry_max_attempts: int = RetryPolicy.max_attempts,
        retry_timeout_seconds: float = RetryPolicy.timeout_seconds,
        retry_initial_backoff_seconds: float = RetryPolicy.initial_backoff_seconds,
        retry_max_backoff_seconds: float = RetryPolicy.max_backoff_seconds,
    ) -> None:
        db = (
            url
            if isinstance(url, Database)
            else Database(
                url,
                read_only=True,
                retry_max_attempts=retry_max_attempts,
                retry_timeout_seconds=retry_timeout_seconds,
                retry_initial_backoff_seconds=retry_initial_backoff_seconds,
                retry_max_backoff_seconds=retry_max_backoff_seconds,
            )
        )
        self._db = db
        #: Close every pooled connection; the reader opens new ones if used again.
        self.dispose = db.dispose

    @property
    def url(self) -> str:
        return self._db.url

    def __repr__(self) -> str:
        return repr(self._db)

    def _read(self, operation: str, work: Callable[[Session], _T]) -> _T:
        return self._db.transaction(operation, work, write=False)

    def _once(self, operation: str) -> AbstractContextManager[Session]:
        """One attempt at a read (no retry), for the batch reads of pages."""
        return self._db.session_scope(operation, write=False)

    # -- experiments and runs ------------------------------------------------------------------

    def list_experiments(self) -> list[ExperimentRecord]:
        """Every experiment, oldest first."""
        query = select(ExperimentRow).order_by(ExperimentRow.created_at, ExperimentRow.id)
        work = lambda session: [experiment_record(row) for row in session.execute(query).scalars()]  # noqa: E731
        return self._read("list experiments", work)

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
            return [experiment_run_record(run, name) for run, name in session.execute(query)]

        return self._read("list experiment runs", work)

    def resolve_run(self, experiment_name: str, run: str | int = "latest") -> ExperimentRunRecord:
        """One run of an experiment, as a user names it.

        :param experiment_name: the experiment.
        :param run: ``"latest"`` (the newest run; default), the run's id, or its run key (the
            Airflow run_id of a DAG run).
        :raises ExperimentNotFoundError: the experiment has no runs, or none of that name.
        """
        runs = self.list_experiment_runs(experiment_name)
        if not runs:
            known = ", ".join(e.name for e in self.list_experiments()) or "none yet"
            raise ExperimentNotFoundError(
                f"Experiment {experiment_name!r} has no runs in {self!r} (experiments: {known}); "
                "check the name, or the trials DB URL (--db-url, AIRFLOW_TRIALS_DB_URL, "
                "trials_default)."
            )
        if run == "latest":
            return max(runs, key=lambda r: (r.created_at, r.id))
        for candidate in runs:
            if str(run) in (str(candidate.id), candidate.run_key):
                return candidate
        raise ExperimentNotFoundError(
            f"Experiment {experiment_name!r} has no run {run!r}; name a run (--run) by an id or "
            f"run key that 'airflow-trials runs {experiment_name}' lists, or 'latest'."
        )

    # -- trials, results and checkpoints ---------------------------------------------------------

    def get_trial(self, trial_id: str) -> TrialRecord:
        """The trial's record; raises TrialNotFoundError for an unknown id."""
        operation = f"read trial {trial_id}"
        work = lambda session: trial_record(self._db.find_trial(session, trial_id, operation))  # noqa: E731
        return self._read(operation, work)

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
        work = lambda session: [trial_record(row) for row in session.execute(query).scalars()]  # noqa: E731
        return self._read("list trials", work)

    def get_results(self, trial_id: str) -> list[dict[str, Any]]:
        """The trial's stored result dicts, ordered by iteration."""
        operation = f"read the results of trial {trial_id}"
        query = (
            select(ResultRow.metrics)
            .where(ResultRow.trial_id == trial_id)
            .order_by(ResultRow.iteration)
        )

        def work(session: Session) -> list[dict[str, Any]]:
            self._db.find_trial(session, trial_id, operation)
            return list(session.execute(query).scalars())

        return self._read(operation, work)

    def live_checkpoints(self, trial_id: str) -> list[CheckpointRecordRow]:
        """The trial's not-deleted checkpoints, newest (highest iteration) first."""
        return self._live_checkpoints(trial_id, f"read the checkpoints of trial {trial_id}", None)

    def latest_checkpoint(self, trial_id: str) -> CheckpointRecordRow | None:
        """The not-deleted checkpoint with the highest iteration, or None when there is none."""
        operation = f"read the latest checkpoint of trial {trial_id}"
        newest = self._live_checkpoints(trial_id, operation, 1)
        return newest[0] if newest else None

    def _live_checkpoints(
        self, trial_id: str, operation: str, limit: int | None
    ) -> list[CheckpointRecordRow]:
        query = (
            select(CheckpointRow)
            .where(CheckpointRow.trial_id == trial_id, CheckpointRow.deleted.is_(False))
            .order_by(CheckpointRow.iteration.desc(), CheckpointRow.id.desc())
            .limit(limit)
        )

        def work(session: Session) -> list[CheckpointRecordRow]:
            self._db.find_trial(session, trial_id, operation)
            return [checkpoint_record(row) for row in session.execute(query).scalars()]

        return self._read(operation, work)

    # -- the leaderboard -----------------------------------------------------------------------

    def leaderboard(
        self, experiment_run_id: int, metric: str, mode: str = "min", limit: int | None = None
    ) -> list[LeaderboardRow]:
        """Trials of a run ranked by their best value of ``metric``, computed in SQL.

        One row per trial: best value (lowest for ``"min"``, highest for ``"max"``) over its
        results, the first iteration that reached it, its best checkpoint (the kept one whose
        iteration scored best on ``metric``) and its latest kept checkpoint. Trials that
        never reported the metric as a number come last, then ties by trial_id. Fast with the
        metric's index (``TrialStore.ensure_metric_index``, made by
        ``ensure_experiment(metric=...)``).

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
        dialect = self._db.dialect

        def work(session: Session) -> list[LeaderboardRow]:
            run = self._db.find_run(session, experiment_run_id, operation)
            connection = session.connection()
            if best_is_current(session, run, metric, mode):
                # Every trial's best is maintained for this metric and mode: one row per trial.
                query = best_leaderboard_query(dialect, experiment_run_id, metric, mode, limit)
            else:
                query = leaderboard_query(dialect, experiment_run_id, metric, mode, limit)
            if dialect == "postgresql":
                # The per-trial probes inflate the cost estimate past jit_above_cost, and
                # compiling the plan then takes longer than running it.
                connection.execute(text("SET LOCAL jit = off"))
            return [leaderboard_row(row) for row in connection.execute(query)]

        return self._read(operation, work)

    def best_checkpoint_paths(
        self, trial_ids: Sequence[str], metric: str, mode: str
    ) -> dict[str, str]:
        """The path of each trial's best checkpoint, as :meth:`leaderboard` gives it
        (:func:`~airflow_trials.store.leaderboard.best_checkpoint_path`); trials with none left
        out."""
        check_mode(mode)
        check_metric(metric)
        if not trial_ids:
            return {}
        trials = TrialRow.__table__
        best = best_checkpoint_path(self._db.dialect, metric, mode)
        query = select(trials.c.trial_id, best).where(trials.c.trial_id.in_(list(trial_ids)))

        def work(session: Session) -> dict[str, str]:
            return {trial_id: path for trial_id, path in session.execute(query) if path is not None}

        return self._read(f"read the best checkpoints of {len(trial_ids)} trials", work)

    # -- what the schedulers recorded ----------------------------------------------------------

    def trial_rungs(self, trial_id: str) -> list[RungDecision]:
        """The trial's ASHA rung records, lowest milestone first; raises TrialNotFoundError for an
        unknown id."""
        query = select(_RUNGS).where(_RUNGS.c.trial_id == trial_id).order_by(_RUNGS.c.milestone)
        return self._of_trial(trial_id, "rungs", query, rung_decision)

    def trial_median_points(self, trial_id: str) -> list[MedianPoint]:
        """The trial's median points in the order recorded; raises TrialNotFoundError for an
        unknown id."""
        query = select(_POINTS).where(_POINTS.c.trial_id == trial_id).order_by(_POINTS.c.seq)
        return self._of_trial(trial_id, "median points", query, median_point)

    def trial_exploits(self, trial_id: str) -> list[ExploitRecord]:
        """The trial's own PBT exploits, oldest first; raises TrialNotFoundError for an unknown
        id."""
        query = select(_EXPLOITS).where(_EXPLOITS.c.trial_id == trial_id).order_by(_EXPLOITS.c.id)
        return self._of_trial(trial_id, "exploits", query, exploit_record)

    def _of_trial(self, trial_id: str, what: str, query: Any, to_record: Any) -> Any:
        operation = f"read the {what} of trial {trial_id}"

        def work(session: Session) -> list[Any]:
            self._db.find_trial(session, trial_id, operation)
            return [to_record(row._mapping, fresh=False) for row in session.execute(query)]

        return self._read(operation, work)

    def lineage(self, trial_id: str) -> list[ExploitRecord]:
        """The exploits that made the trial's state, oldest first
        (:func:`~airflow_trials.store.exploits.exploit_lineage`): its donor's lineage up to the
        exploit, then the exploit. Empty for a trial never exploited; raises TrialNotFoundError
        for an unknown id."""
        operation = f"read the lineage of trial {trial_id}"

        def work(session: Session) -> list[ExploitRecord]:
            self._db.find_trial(session, trial_id, operation)
            return exploit_lineage(
                trial_id, lambda trial, bound: latest_exploit(session, trial, bound)
            )

        return self._read(operation, work)

    # -- batch reads of pages: one query for many trials, one attempt each (no retry) ------------

    def find_experiment_run(self, run_pk: int) -> ExperimentRunRecord | None:
        """The run with this id, or None when the store has no such run."""
        with self._once(f"read experiment run {run_pk}") as session:
            found = session.execute(
                select(ExperimentRunRow, ExperimentRow.name)
                .join(ExperimentRow, ExperimentRow.id == ExperimentRunRow.experiment_id)
                .where(ExperimentRunRow.id == run_pk)
            ).one_or_none()
        return None if found is None else experiment_run_record(*found)

    def trial_counts(self) -> dict[int, int]:
        """Trials per experiment run id."""
        with self._once("count the trials of each experiment run") as session:
            rows = session.execute(
                select(TrialRow.experiment_run_id, func.count())
                .where(TrialRow.experiment_run_id.is_not(None))
                .group_by(TrialRow.experiment_run_id)
            )
            return {run_pk: count for run_pk, count in rows if run_pk is not None}

    def ranking(self, run_pk: int, metric: str, mode: str) -> list[RankedTrial]:
        """Every trial of the run in the order of :meth:`leaderboard`, without configs.

        When the run's bests are maintained for this metric and mode (the experiment's), this is
        the leaderboard's own query over ``at_trials`` with fewer columns: no config to decode and
        no checkpoint to look up per trial, which are most of a 10,000-trial leaderboard's time.
        Otherwise it is the store's leaderboard itself.
        """
        check_mode(mode)
        check_metric(metric)
        operation = f"rank the trials of experiment run {run_pk} by {mode} {metric}"
        with self._once(operation) as session:
            run = self._db.find_run(session, run_pk, operation)
            if best_is_current(session, run, metric, mode):
                trials = TrialRow.__table__.c
                query = best_leaderboard_query(
                    self._db.dialect, run_pk, metric, mode, None
                ).with_only_columns(
                    trials.trial_id,
                    trials.status,
                    trials.num_failures,
                    trials.best_value,
                    trials.best_iteration,
                )
                return [ranked_trial(row) for row in session.execute(query)]
        return [
            RankedTrial(r.trial_id, r.status, r.num_failures, r.best_value, r.best_iteration)
            for r in self.leaderboard(run_pk, metric, mode)
        ]

    def configs_of(self, trial_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
        """The configs of these trials."""
        if not trial_ids:
            return {}
        with self._once(f"read the configs of {len(trial_ids)} trials") as session:
            rows = session.execute(
                select(TrialRow.trial_id, TrialRow.config).where(
                    TrialRow.trial_id.in_(list(trial_ids))
                )
            )
            return {trial_id: config for trial_id, config in rows}

    def stop_reasons_of(self, trial_ids: Sequence[str]) -> dict[str, str]:
        """Why each of these trials ended TERMINATED; trials without a stop reason are left out."""
        if not trial_ids:
            return {}
        with self._once(f"read the stop reasons of {len(trial_ids)} trials") as session:
            rows = session.execute(
                select(TrialRow.trial_id, TrialRow.stop_reason).where(
                    TrialRow.trial_id.in_(list(trial_ids)), TrialRow.stop_reason.is_not(None)
                )
            )
            return {trial_id: reason for trial_id, reason in rows if reason is not None}

    def early_stopped_trials(self, run_pk: int) -> set[str]:
        """The ids of the run's trials their scheduler stopped early
        (:func:`~airflow_trials.core.fate.stopped_early`); only trials with a stop reason are
        read."""
        with self._once(f"read the early stopped trials of experiment run {run_pk}") as session:
            rows = session.execute(
                select(TrialRow.trial_id, TrialRow.stop_reason).where(
                    TrialRow.experiment_run_id == run_pk, TrialRow.stop_reason.is_not(None)
                )
            )
            return {trial_id for trial_id, reason in rows if stopped_early(reason)}

    def rungs_of_run(self, run_pk: int) -> dict[str, list[RungDecision]]:
        """Every ASHA rung record of the run's trials (``trial_rungs`` of each), in one query."""
        rungs = TrialRungRow.__table__
        found: dict[str, list[RungDecision]] = defaultdict(list)
        with self._once(f"read the rungs of experiment run {run_pk}") as session:
            rows = session.execute(
                select(rungs)
                .where(rungs.c.experiment_run_id == run_pk)
                .order_by(rungs.c.trial_id, rungs.c.milestone)
            )
            for row in rows:
                found[row.trial_id].append(rung_decision(row._mapping, fresh=False))
        return found

    def lineages_of_run(self, run_pk: int) -> dict[str, list[ExploitRecord]]:
        """The lineage (:meth:`lineage`) of each of the run's trials that was exploited, from
        one query over their exploits; donors outside the run end a lineage there."""
        exploits = TrialExploitRow.__table__
        by_trial: dict[str, list[ExploitRecord]] = defaultdict(list)
        with self._once(f"read the exploits of experiment run {run_pk}") as session:
            rows = session.execute(
                select(exploits)
                .join(TrialRow, TrialRow.trial_id == exploits.c.trial_id)
                .where(TrialRow.experiment_run_id == run_pk)
                .order_by(exploits.c.id)
            )
            for row in rows:
                by_trial[row.trial_id].append(exploit_record(row._mapping, fresh=False))

        def latest_before(trial_id: str, bound: int | None) -> ExploitRecord | None:
            own = by_trial.get(trial_id, [])
            if bound is None:
                return own[-1] if own else None
            index = bisect.bisect_left(own, bound, key=lambda e: e.id)
            return own[index - 1] if index else None

        return {trial_id: exploit_lineage(trial_id, latest_before) for trial_id in by_trial}

    def checkpoints_of(self, trial_ids: Sequence[str]) -> dict[str, list[CheckpointRecordRow]]:
        """Every recorded checkpoint of these trials (deleted ones too), oldest iteration first."""
        found: dict[str, list[CheckpointRecordRow]] = defaultdict(list)
        if not trial_ids:
            return found
        with self._once(f"read the checkpoints of {len(trial_ids)} trials") as session:
            rows = session.execute(
                select(
                    CheckpointRow.trial_id,
                    CheckpointRow.path,
                    CheckpointRow.iteration,
                    CheckpointRow.score,
                    CheckpointRow.deleted,
                )
                .where(CheckpointRow.trial_id.in_(list(trial_ids)))
                .order_by(CheckpointRow.trial_id, CheckpointRow.iteration, CheckpointRow.id)
            )
            for row in rows:
                found[row.trial_id].append(checkpoint_record(row))
        return found

    def metric_curves(
        self, trial_ids: Sequence[str], metric: str
    ) -> dict[str, list[tuple[int, float]]]:
        """(iteration, value) of ``metric`` per trial, in iteration order; results without it
        skipped.

        The value is extracted in SQL with the leaderboard's own guarded expression, so a string
        or NaN-turned-null under the metric's key is skipped as the leaderboard skips it.
        """
        check_metric(metric)
        curves: dict[str, list[tuple[int, float]]] = {trial_id: [] for trial_id in trial_ids}
        if not trial_ids:
            return curves
        value = metric_value(ResultRow.__table__.c.metrics, metric, self._db.dialect)
        with self._once(f"read the {metric} curves of {len(trial_ids)} trials") as session:
            rows = session.execute(
                select(ResultRow.trial_id, ResultRow.iteration, value)
                .where(ResultRow.trial_id.in_(list(trial_ids)), value.is_not(None))
                .order_by(ResultRow.trial_id, ResultRow.iteration)
            )
            for trial_id, iteration, metric_value_ in rows:
                curves[trial_id].append((int(iteration), float(metric_value_)))
        return curves

    def runs_of_dag_run(self, dag_id: str, run_id: str) -> list[ExperimentRunRecord]:
        """The experiment runs a DAG run started (usually one per experiment task group)."""
        return [r for r in self.list_experiment_runs() if r.dag_id == dag_id and r.run_id == run_id]

    def trial_of_task(self, dag_id: str, run_id: str, task_id: str, map_index: int) -> str | None:
        """The id of the trial a task instance ran, or None when it ran none."""
        with self._once(f"find the trial of task {dag_id}.{task_id}") as session:
            return session.execute(
                select(TrialRow.trial_id)
                .where(
                    TrialRow.dag_id == dag_id,
                    TrialRow.run_id == run_id,
                    TrialRow.task_id == task_id,
                    TrialRow.map_index == map_index,
                )
                .limit(1)
            ).scalar_one_or_none()
