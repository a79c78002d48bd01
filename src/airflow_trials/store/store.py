"""TrialStore: the metadata store of experiments, runs, trials, results, checkpoints, ASHA's rungs,
the median rule's running means and PBT's exploits, composed of a read side and write components."""

from __future__ import annotations

from airflow_trials.store.approvals import ApprovalWriter
from airflow_trials.store.database import Database
from airflow_trials.store.experiments import ExperimentWriter
from airflow_trials.store.exploits import ExploitWriter
from airflow_trials.store.extensions import ExtensionWriter
from airflow_trials.store.ingest import (
    IngestWriter,
    TrialProgress,  # noqa: F401 - re-exported
)
from airflow_trials.store.median import MedianStore
from airflow_trials.store.reader import TrialReader
from airflow_trials.store.retry import RetryPolicy
from airflow_trials.store.run_deletion import RunDeleter
from airflow_trials.store.rungs import RungsStore
from airflow_trials.store.trial_writes import TrialWriter

#: The components that write, each over the store's database; a TrialReader holds none of them.
WRITERS = (
    ExperimentWriter,
    ExtensionWriter,
    ApprovalWriter,
    TrialWriter,
    IngestWriter,
    ExploitWriter,
    RungsStore,
    MedianStore,
    RunDeleter,
)


class TrialStore:
    """The metadata store: one database (never Airflow's) shared by every task, trigger and UI.

    It is composed, not inherited: :attr:`reader`, a :class:`~airflow_trials.store.TrialReader`
    that cannot write, answers every read, and one component per concern writes (see
    :data:`WRITERS`); the store hands out their methods as its own. A trial's status changes in
    three ways only, each through one guarded setter
    (:func:`~airflow_trials.store.trial_writes.change_status`): :meth:`record_transition`,
    :meth:`record_end` and :meth:`record_progress`. Give :attr:`reader` to code that only reads.

    Every public method runs in its own transaction: it commits, or rolls back entirely and
    raises :class:`~airflow_trials.exceptions.StoreError` (chained to the database error). A
    transaction that failed transiently (connection lost, server restarting, serialization
    failure, deadlock, SQLite busy) runs again, with exponential backoff and jitter, until the
    ``retry_*`` budget is spent; other database errors fail at once. All writes are idempotent,
    so a retry, or an Airflow retry, may repeat them. One instance may be shared by threads; each
    call takes its own connection.

    Example::

        from airflow_trials.core.fate import Transition

        store = TrialStore("sqlite:////tmp/trials.db", create=True)
        run = store.create_experiment_run("mnist", "manual-1")
        store.upsert_trial("t-1", trainable="pkg.train:fn", config={"lr": 0.1},
                           resources={"cpu": 1}, max_failures=0, experiment_run_id=run)
        store.record_transition("t-1", Transition.PLACED)
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
        reader = self.reader = TrialReader(db)
        #: Close every pooled connection; the store opens new ones if used again.
        self.dispose = db.dispose
        # The read side.
        self.list_experiments = reader.list_experiments
        self.get_experiment = reader.get_experiment
        self.list_experiment_runs = reader.list_experiment_runs
        self.resolve_run = reader.resolve_run
        self.get_trial = reader.get_trial
        self.list_trials = reader.list_trials
        self.get_results = reader.get_results
        self.live_checkpoints = reader.live_checkpoints
        self.latest_checkpoint = reader.latest_checkpoint
        self.leaderboard = reader.leaderboard
        self.pareto_leaderboard = reader.pareto_leaderboard
        self.ranked_page = reader.ranked_page
        self.best_checkpoint_paths = reader.best_checkpoint_paths
        self.trial_rungs = reader.trial_rungs
        self.trial_median_points = reader.trial_median_points
        self.trial_exploits = reader.trial_exploits
        self.lineage = reader.lineage
        self.find_experiment_run = reader.find_experiment_run
        self.trial_counts = reader.trial_counts
        self.ranking = reader.ranking
        self.configs_of = reader.configs_of
        self.stop_reasons_of = reader.stop_reasons_of
        self.early_stopped_trials = reader.early_stopped_trials
        self.rungs_of_run = reader.rungs_of_run
        self.lineages_of_run = reader.lineages_of_run
        self.run_rungs = reader.run_rungs
        self.run_exploits = reader.run_exploits
        self.run_decision_counts = reader.run_decision_counts
        self.experiment_history = reader.experiment_history
        self.experiment_trend = reader.experiment_trend
        self.best_of_run = reader.best_of_run
        self.checkpoints_of = reader.checkpoints_of
        self.metric_curves = reader.metric_curves
        self.runs_of_dag_run = reader.runs_of_dag_run
        self.list_run_extensions = reader.list_run_extensions
        self.run_approvals = reader.run_approvals
        self.trial_of_task = reader.trial_of_task
        # Experiments and their runs.
        experiments = ExperimentWriter(db)
        self.ensure_experiment = experiments.ensure_experiment
        self.ensure_metric_index = experiments.ensure_metric_index
        self.create_experiment_run = experiments.create_experiment_run
        self.finish_experiment_run = experiments.finish_experiment_run
        self.record_pick = experiments.record_pick
        extensions = ExtensionWriter(db)
        self.begin_run_extension = extensions.begin_run_extension
        self.end_run_extension = extensions.end_run_extension
        # Answers to approve_best (tuning_experiment(approval=True)); a rejection is final.
        self.record_approval = ApprovalWriter(db).record_approval
        # Trials: registration, fields, and two of the three ways their status changes.
        trials = TrialWriter(db)
        self.upsert_trial = trials.upsert_trial
        self.update_trial = trials.update_trial
        self.record_transition = trials.record_transition
        self.record_end = trials.record_end
        # Results and checkpoints; record_progress is the third way a status changes (RUNNING).
        ingest = IngestWriter(db)
        self.add_results = ingest.add_results
        self.recompute_best = ingest.recompute_best
        self.record_progress = ingest.record_progress
        self.add_checkpoint = ingest.add_checkpoint
        self.mark_checkpoint_deleted = ingest.mark_checkpoint_deleted
        # What the schedulers decide: PBT's exploits, ASHA's rungs, the median rule's means.
        self.record_exploit = ExploitWriter(db).record_exploit
        rungs = RungsStore(db)
        self.record_rung = rungs.record_rung
        self.rung_values = rungs.rung_values
        self.record_vector_rung = rungs.record_vector_rung
        self.rung_vectors = rungs.rung_vectors
        self.record_median_point = MedianStore(db).record_median_point
        # Pruning: a finished run and every row of it, in one transaction.
        self.delete_experiment_run = RunDeleter(db).delete_experiment_run

    @property
    def url(self) -> str:
        return self._db.url

    def __repr__(self) -> str:
        return repr(self._db)
