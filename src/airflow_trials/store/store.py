"""TrialStore: the metadata store of experiments, runs, trials, results, checkpoints, ASHA's rungs,
the median rule's running means and PBT's exploits: its writes, declared here and carried out by
one write component per concern; its reads are :class:`~airflow_trials.store.TrialReader`'s."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from airflow_trials.store.approvals import ApprovalWriter
from airflow_trials.store.database import Database
from airflow_trials.store.experiments import ExperimentWriter
from airflow_trials.store.exploits import ExploitWriter
from airflow_trials.store.extensions import ExtensionWriter
from airflow_trials.store.ingest import IngestWriter
from airflow_trials.store.median import MedianStore
from airflow_trials.store.reader import TrialReader
from airflow_trials.store.retry import RetryPolicy
from airflow_trials.store.run_deletion import RunDeleter
from airflow_trials.store.rungs import RungsStore
from airflow_trials.store.trial_registration import PlannedTrial, RunTrialsWriter
from airflow_trials.store.trial_writes import TrialWriter

if TYPE_CHECKING:
    from airflow_trials.core.approval_rule import ApprovalOutcome
    from airflow_trials.core.constraints import Constraints
    from airflow_trials.core.end import TrialEnd
    from airflow_trials.core.fate import FailureDecision
    from airflow_trials.core.pareto import MetricSpec, ModeSpec
    from airflow_trials.core.resources import Resources
    from airflow_trials.core.status import TrialStatus
    from airflow_trials.core.update import TrialUpdate
    from airflow_trials.store.records import (
        ExploitRecord,
        RunApprovalRecord,
        RunExtensionRecord,
    )
    from airflow_trials.store.run_deletion import RunDeletion
    from airflow_trials.store.scheduler_state import Judging
    from airflow_trials.store.transitions import Recorded, TrialTransition

#: The components that write, each over the store's database; a TrialReader holds none of them.
#: (RungsStore and MedianStore write within record_progress, through its SchedulerState.)
WRITERS = (
    ExperimentWriter,
    ExtensionWriter,
    ApprovalWriter,
    TrialWriter,
    RunTrialsWriter,
    IngestWriter,
    ExploitWriter,
    RungsStore,
    MedianStore,
    RunDeleter,
)


class TrialStore:
    """The metadata store: one database (never Airflow's) shared by every task, trigger and UI.

    Its methods are its writes, each carried out by one write component over the store's database
    (``store/experiments.py``, ``trial_writes.py``, ``ingest.py`` and the others). Its reads are
    :attr:`reader`'s, a :class:`~airflow_trials.store.TrialReader` over the same database that
    cannot write: ``store.reader.leaderboard(...)``; give :attr:`reader` to code that only reads.
    A trial's status changes through one guarded setter
    (:func:`~airflow_trials.store.trial_writes.change_status`), which :meth:`record_transition`,
    :meth:`record_end` and :meth:`record_progress` call.

    Every method runs in its own transaction: it commits, or rolls back entirely and raises
    :class:`~airflow_trials.exceptions.StoreError` (chained to the database error). A
    transaction that failed transiently (connection lost, server restarting, serialization
    failure, deadlock, SQLite busy) runs again, with exponential backoff and jitter, until the
    ``retry_*`` budget is spent; other database errors fail at once. All writes are idempotent,
    so a retry, or an Airflow retry, may repeat them. One instance may be shared by threads; each
    call takes its own connection.

    Example::

        from airflow_trials.core.fate import Transition
        from airflow_trials.core.update import TrialUpdate

        store = TrialStore("sqlite:////tmp/trials.db", create=True)
        run = store.create_experiment_run("mnist", "manual-1")
        store.upsert_trial("t-1", trainable="pkg.train:fn", config={"lr": 0.1},
                           resources={"cpu": 1}, max_failures=0, experiment_run_id=run)
        store.record_transition("t-1", Transition.PLACED)
        result = {"training_iteration": 1, "loss": 0.5}
        store.record_progress([TrialUpdate("t-1", results=[result])])
        store.reader.leaderboard(run, "loss", "min")

    :param url: SQLAlchemy URL; default as every entry point finds it
        (:func:`~airflow_trials.trials_db_url.trials_db_url`: the ``trials_default`` connection,
        then ``AIRFLOW_TRIALS_DB_URL``, then the default SQLite file). Production:
        ``postgresql+psycopg://user:password@host/db``.
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

    #: The store's reads (a :class:`~airflow_trials.store.TrialReader` over its database).
    reader: TrialReader

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
        db = self._db = Database(
            url,
            create=create,
            retry_max_attempts=retry_max_attempts,
            retry_timeout_seconds=retry_timeout_seconds,
            retry_initial_backoff_seconds=retry_initial_backoff_seconds,
            retry_max_backoff_seconds=retry_max_backoff_seconds,
        )
        # The engines, for tools and tests that inspect the database under the store.
        self._engine, self._write_engine = db.engine, db.write_engine
        self.reader = TrialReader(db)
        self._experiments = ExperimentWriter(db)
        self._extensions = ExtensionWriter(db)
        self._approvals = ApprovalWriter(db)
        self._trials = TrialWriter(db)
        self._run_trials = RunTrialsWriter(db)
        self._ingest = IngestWriter(db)
        self._exploits = ExploitWriter(db)
        self._deleter = RunDeleter(db)

    @property
    def url(self) -> str:
        """The store's SQLAlchemy URL."""
        return self._db.url

    def __repr__(self) -> str:
        return repr(self._db)

    def dispose(self) -> None:
        """Close every pooled connection; the store opens new ones if used again."""
        self._db.dispose()

    # -- experiments and their runs --------------------------------------------------------

    def ensure_experiment(
        self,
        name: str,
        metric: MetricSpec | None = None,
        mode: ModeSpec | None = None,
        constraints: Sequence[str] | Constraints | None = None,
    ) -> int:
        """The experiment's id, creating it if needed (:meth:`ExperimentWriter.ensure_experiment
        <airflow_trials.store.experiments.ExperimentWriter.ensure_experiment>`)."""
        return self._experiments.ensure_experiment(name, metric, mode, constraints)

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
        """The id of the run ``run_key`` of the experiment, creating both if needed, with the
        version of the data it tunes on when it names one."""
        return self._experiments.create_experiment_run(
            experiment_name,
            run_key,
            dag_id=dag_id,
            run_id=run_id,
            search_space=search_space,
            seed=seed,
            num_samples=num_samples,
            data_version=data_version,
        )

    def finish_experiment_run(
        self,
        run_id_pk: int,
        status: str,
        *,
        reason: str | None = None,
        if_running: bool = False,
    ) -> None:
        """Set a run's status; SUCCESS or FAILED end it and store its history line, with the
        ``reason`` it was ended by hand (:meth:`ExperimentWriter.finish_experiment_run
        <airflow_trials.store.experiments.ExperimentWriter.finish_experiment_run>`)."""
        self._experiments.finish_experiment_run(
            run_id_pk, status, reason=reason, if_running=if_running
        )

    def record_pick(self, experiment_run_id: int, trial_id: str) -> None:
        """Record the trial ``select_best`` picked in the run."""
        self._experiments.record_pick(experiment_run_id, trial_id)

    def begin_run_extension(
        self,
        experiment_run_id: int,
        dag_run_id: str,
        *,
        num_samples_added: int,
        stop_before: Mapping[str, Any] | None,
        stop_after: Mapping[str, Any] | None,
        trials_continued: Sequence[str],
        trials_added: Sequence[str],
    ) -> RunExtensionRecord:
        """Record that DAG run ``dag_run_id`` extends the finished run, and set it RUNNING."""
        return self._extensions.begin_run_extension(
            experiment_run_id,
            dag_run_id,
            num_samples_added=num_samples_added,
            stop_before=stop_before,
            stop_after=stop_after,
            trials_continued=trials_continued,
            trials_added=trials_added,
        )

    def end_run_extension(self, experiment_run_id: int, dag_run_id: str, status: str) -> bool:
        """End the extension of DAG run ``dag_run_id`` SUCCESS or FAILED."""
        return self._extensions.end_run_extension(experiment_run_id, dag_run_id, status)

    def record_approval(
        self,
        experiment_run_id: int,
        dag_run_id: str,
        *,
        trial_id: str,
        outcome: ApprovalOutcome | str,
        responded_by_id: str,
        responded_by_name: str,
        responded_at: datetime,
        reason: str,
        triggered_by: str | None,
    ) -> RunApprovalRecord:
        """Record the answer ``approve_best`` got about the run's best; a rejection is final."""
        return self._approvals.record_approval(
            experiment_run_id,
            dag_run_id,
            trial_id=trial_id,
            outcome=outcome,
            responded_by_id=responded_by_id,
            responded_by_name=responded_by_name,
            responded_at=responded_at,
            reason=reason,
            triggered_by=triggered_by,
        )

    def delete_experiment_run(
        self,
        experiment_run_id: int,
        *,
        dry_run: bool = False,
        check_paths: Callable[[Sequence[str]], None] | None = None,
    ) -> RunDeletion:
        """Delete a finished run, its trials and every row naming either, in one transaction."""
        return self._deleter.delete_experiment_run(
            experiment_run_id, dry_run=dry_run, check_paths=check_paths
        )

    # -- trials: registration and status ----------------------------------------------------

    def upsert_trial(
        self,
        trial_id: str,
        *,
        trainable: str,
        config: Mapping[str, Any],
        resources: Mapping[str, Any] | Resources,
        max_failures: int,
        experiment_run_id: int | None = None,
        dag_id: str | None = None,
        run_id: str | None = None,
        task_id: str | None = None,
        map_index: int = -1,
        try_number: int | None = None,
        warm_start: Mapping[str, Any] | None = None,
    ) -> None:
        """Register a trial (PENDING), or refresh the Airflow ids of one already registered."""
        self._trials.upsert_trial(
            trial_id,
            trainable=trainable,
            config=config,
            resources=resources,
            max_failures=max_failures,
            experiment_run_id=experiment_run_id,
            dag_id=dag_id,
            run_id=run_id,
            task_id=task_id,
            map_index=map_index,
            try_number=try_number,
            warm_start=warm_start,
        )

    def register_trials(
        self,
        experiment_run_id: int,
        trials: Sequence[PlannedTrial],
        *,
        trainable: str,
        resources: Mapping[str, Any] | Resources,
        max_failures: int,
    ) -> None:
        """Register all the trials of a run (PENDING) in one transaction, ``(trial id, config,
        warm start or None)`` each; those registered already are left as they are."""
        self._run_trials.register_trials(
            experiment_run_id, trials, (trainable, resources, max_failures)
        )

    def record_transition(
        self,
        trial_id: str,
        transition: TrialTransition,
        *,
        why: str | None = None,
        try_number: int | None = None,
    ) -> Recorded:
        """Record a change of the trial's status other than its end, through the guarded setter."""
        return self._trials.record_transition(trial_id, transition, why=why, try_number=try_number)

    def record_end(self, end: TrialEnd, decision: FailureDecision | None = None) -> TrialStatus:
        """Record how a trial's watch ended; returns the status it now has."""
        return self._trials.record_end(end, decision)

    # -- results and checkpoints ------------------------------------------------------------

    def record_progress(
        self, batch: Sequence[TrialUpdate], *, judges: Mapping[str, Judging] | None = None
    ) -> int:
        """Write what many trials did (results, checkpoints, status) and the verdicts their
        schedulers (``judges``, by trial id) gave on those results, in one transaction; returns
        how many results were new (:meth:`IngestWriter.record_progress
        <airflow_trials.store.ingest.IngestWriter.record_progress>`)."""
        return self._ingest.record_progress(batch, judges=judges)

    def mark_checkpoint_deleted(self, trial_id: str, path: str) -> None:
        """Mark a recorded checkpoint deleted (idempotent); StoreError for an unknown path."""
        self._ingest.mark_checkpoint_deleted(trial_id, path)

    def recompute_best(self, experiment_run_id: int) -> int:
        """Recompute each trial's maintained best of the run from its results (after a bulk
        load, or a change of the experiment's metric); returns the trials updated."""
        return self._ingest.recompute_best(experiment_run_id)

    # -- what the schedulers decide ---------------------------------------------------------

    def record_exploit(
        self,
        trial_id: str,
        *,
        iteration: int,
        donor_trial_id: str,
        donor_checkpoint: str,
        old_config: Mapping[str, Any],
        new_config: Mapping[str, Any],
        operations: Mapping[str, str],
    ) -> ExploitRecord:
        """Record that the trial continues from the donor's checkpoint with ``new_config``."""
        return self._exploits.record_exploit(
            trial_id,
            iteration=iteration,
            donor_trial_id=donor_trial_id,
            donor_checkpoint=donor_checkpoint,
            old_config=old_config,
            new_config=new_config,
            operations=operations,
        )
