"""TrialReader: the trials store's read side, which cannot write; the dashboard, the CLI and
ResultGrid read through it, and :class:`~airflow_trials.store.TrialStore` hands out its reads."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from airflow_trials.core.verdicts import ValueList
from airflow_trials.exceptions import ExperimentNotFoundError
from airflow_trials.store.batch_reads import BatchReader
from airflow_trials.store.database import Database
from airflow_trials.store.exploits import exploit_lineage, latest_exploit
from airflow_trials.store.history_trend import TrendPoint, experiment_trend
from airflow_trials.store.mapping import (
    checkpoint_record,
    experiment_record,
    experiment_run_record,
    exploit_record,
    median_point,
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
)
from airflow_trials.store.ranking_reads import RankingReads
from airflow_trials.store.records import (
    CheckpointRecordRow,
    ExperimentRecord,
    ExperimentRunRecord,
    ExploitRecord,
    MedianPoint,
    RunApprovalRecord,
    RunExtensionRecord,
    RungDecision,
    TrialRecord,
)
from airflow_trials.store.retry import RetryPolicy
from airflow_trials.store.run_decisions import RunDecisionsReader
from airflow_trials.store.run_history import (
    ExperimentHistory,
    experiment_history,
)
from airflow_trials.store.run_trials import TrialState, run_trial_states
from airflow_trials.store.rungs import rung_values, rung_vectors, trial_rungs_query

_EXPLOITS = TrialExploitRow.__table__
_POINTS = TrialMedianPointRow.__table__


class TrialReader(RankingReads):
    """The trials store, read-only: every read of :class:`~airflow_trials.store.TrialStore`, and
    no method that writes. Hand it to whatever only reads (a dashboard, a report).

    Opened on a URL, its database is read-only: it has no write engine and never migrates (a
    TrialStore with ``create=True``, or :func:`~airflow_trials.store.migrate`, does). Each read is
    one transaction that retries transient errors as the TrialStore's do. The batch reads of
    pages (``ranking``, ``configs_of``, ``metric_curves`` and the others it hands out from a
    :class:`~airflow_trials.store.batch_reads.BatchReader`) are one attempt each.

    Example::

        reader = TrialReader("sqlite:////tmp/trials.db")
        run = reader.resolve_run("mnist")
        reader.leaderboard(run.id, "loss", "min", limit=10)

    :param url: SQLAlchemy URL; default as every entry point finds it
        (:func:`~airflow_trials.trials_db_url.trials_db_url`: the ``trials_default`` connection,
        then ``AIRFLOW_TRIALS_DB_URL``, then the default SQLite file). Or an
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
        # The batch reads of pages, one attempt each.
        batch = BatchReader(db, self.leaderboard)
        self.find_experiment_run = batch.find_experiment_run
        self.trial_counts = batch.trial_counts
        self.ranking = batch.ranking
        self.early_stopped_trials = batch.early_stopped_trials
        self.rungs_of_run = batch.rungs_of_run
        self.lineages_of_run = batch.lineages_of_run
        # A run's scheduler decisions, whole, for its decisions page (store/run_decisions.py).
        decisions = RunDecisionsReader(db)
        self.run_rungs = decisions.run_rungs
        self.run_exploits = decisions.run_exploits
        self.run_decision_counts = decisions.run_decision_counts
        self.configs_of = batch.configs_of
        self.stops_of = batch.stops_of
        self.checkpoints_of = batch.checkpoints_of
        self.metric_curves = batch.metric_curves
        self.trial_of_task = batch.trial_of_task

    @property
    def url(self) -> str:
        return self._db.url

    def __repr__(self) -> str:
        return repr(self._db)

    # -- experiments and runs ------------------------------------------------------------------

    def list_experiments(self) -> list[ExperimentRecord]:
        """Every experiment, oldest first."""
        query = select(ExperimentRow).order_by(ExperimentRow.created_at, ExperimentRow.id)

        def work(session: Session) -> list[ExperimentRecord]:
            return [experiment_record(row) for row in session.execute(query).scalars()]

        return self._read("list experiments", work)

    def get_experiment(self, name: str) -> ExperimentRecord:
        """One experiment by name; its metrics decoded are ``.metrics`` and ``.modes``.

        :raises ExperimentNotFoundError: no experiment of that name.
        """
        query = select(ExperimentRow).where(ExperimentRow.name == name)

        def work(session: Session) -> ExperimentRecord | None:
            row = session.execute(query).scalar_one_or_none()
            return None if row is None else experiment_record(row)

        record = self._read(f"read experiment {name}", work)
        if record is None:
            known = ", ".join(e.name for e in self.list_experiments()) or "none yet"
            raise ExperimentNotFoundError(
                f"Experiment {name!r} is not in {self!r} (experiments: {known}); check the "
                "name, or the trials DB URL (--db-url, AIRFLOW_TRIALS_DB_URL, trials_default)."
            )
        return record

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

    def list_run_extensions(self, experiment_run_id: int | None = None) -> list[RunExtensionRecord]:
        """The extensions of one run (``airflow-trials extend``), or of every run, oldest first.

        :param experiment_run_id: only this run's; default every run's.
        """
        from airflow_trials.store.extensions import list_run_extensions

        return self._read(
            "list run extensions", lambda session: list_run_extensions(session, experiment_run_id)
        )

    def run_approvals(self, experiment_run_id: int) -> list[RunApprovalRecord]:
        """The answers ``approve_best`` recorded about one run, one per DAG run that asked, oldest
        first (``tuning_experiment(approval=True)``)."""
        from airflow_trials.store.approvals import list_run_approvals

        return self._read(
            "list run approvals", lambda session: list_run_approvals(session, experiment_run_id)
        )

    def runs_of_dag_run(self, dag_id: str, run_id: str) -> list[ExperimentRunRecord]:
        """The experiment runs a DAG run started (usually one per experiment task group)."""
        return [r for r in self.list_experiment_runs() if r.dag_id == dag_id and r.run_id == run_id]

    def experiment_history(
        self, experiment_name: str, last: int | None = None
    ) -> ExperimentHistory:
        """The experiment's runs (its ``last`` newest; default all), oldest first, each with its
        best on the experiment's metric, trial counts, failures, stop kinds, best config and the
        keys changed from the previous run's (:mod:`~airflow_trials.store.run_history`): a fixed set
        of aggregate queries grouped by run, whatever the number of runs.

        :raises ExperimentNotFoundError: no experiment of that name.
        """
        experiment = self.get_experiment(experiment_name)
        work = lambda session: experiment_history(session, self._db.dialect, experiment, last)  # noqa: E731
        return self._read(f"read the history of experiment {experiment_name}", work)

    def experiment_trend(self, experiment_name: str) -> list[TrendPoint]:
        """Every run of the experiment, oldest first, with its best as :meth:`experiment_history`
        gives it, and nothing else: a seek per run, for a trend chart of any length."""
        experiment = self.get_experiment(experiment_name)
        work = lambda session: experiment_trend(session, self._db.dialect, experiment)  # noqa: E731
        return self._read(f"read the trend of experiment {experiment_name}", work)

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

    def run_trial_states(self, experiment_run_id: int) -> list[TrialState]:
        """The run's trials, slim (:class:`~airflow_trials.store.run_trials.TrialState`: id,
        config, status, started, failures, try), in ``list_trials``' order, without their
        results: what a sweep of 100,000 trials reads of them."""
        work = lambda session: run_trial_states(session, experiment_run_id)  # noqa: E731
        return self._read(f"read the trials of experiment run {experiment_run_id}", work)

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

    # -- the ranking: inherited from RankingReads (store/ranking_reads.py) ----------------------

    # -- what the schedulers recorded ----------------------------------------------------------

    def trial_rungs(self, trial_id: str) -> list[RungDecision]:
        """The trial's ASHA rung records, lowest milestone first; raises TrialNotFoundError for an
        unknown id."""
        return self._of_trial(trial_id, "rungs", trial_rungs_query(trial_id), rung_decision)

    def rung_values(self, experiment_run_id: int, bracket: int, milestone: float) -> ValueList:
        """Every value the run's trials recorded at an ASHA rung (NaN for NaN)."""
        operation = (
            f"read the values at bracket {bracket}, milestone {milestone} of run "
            f"{experiment_run_id}"
        )
        return self._read(
            operation, lambda session: rung_values(session, experiment_run_id, bracket, milestone)
        )

    def rung_vectors(
        self, experiment_run_id: int, bracket: int, milestone: float
    ) -> list[tuple[float, ...]]:
        """The metric vectors the run's trials recorded at a MOASHA rung, in the order recorded."""
        operation = (
            f"read the metric values at bracket {bracket}, milestone {milestone} of run "
            f"{experiment_run_id}"
        )
        return self._read(
            operation, lambda session: rung_vectors(session, experiment_run_id, bracket, milestone)
        )

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
