"""TrialStore: the metadata store of experiments, runs, trials, results, checkpoints, ASHA's rungs,
the median rule's running means and PBT's exploits."""

from __future__ import annotations

import json
from collections.abc import Sequence

from sqlalchemy import func, select, text
from sqlalchemy.orm import Session

from airflow_trials.core.status import TrialStatus
from airflow_trials.store.exploits import ExploitsStore
from airflow_trials.store.ingest import (
    IngestStore,
    TrialProgress,  # noqa: F401 - re-exported
)
from airflow_trials.store.leaderboard import (
    best_checkpoint_path,
    best_leaderboard_query,
    check_metric,
    check_mode,
    leaderboard_query,
)
from airflow_trials.store.median import MedianStore
from airflow_trials.store.models import (
    ExperimentRow,
    ExperimentRunRow,
    TrialRow,
)
from airflow_trials.store.records import (
    LeaderboardRow,
)
from airflow_trials.store.rungs import RungsStore
from airflow_trials.store.runs import RunsStore
from airflow_trials.store.trials import TrialsStore

_STATUSES = {status.value: status for status in TrialStatus}


class TrialStore(RunsStore, TrialsStore, IngestStore, RungsStore, MedianStore, ExploitsStore):
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

    # -- leaderboard -----------------------------------------------------------------------

    def leaderboard(
        self, experiment_run_id: int, metric: str, mode: str = "min", limit: int | None = None
    ) -> list[LeaderboardRow]:
        """Trials of a run ranked by their best value of ``metric``, computed in SQL.

        One row per trial: best value (lowest for ``"min"``, highest for ``"max"``) over its
        results, the first iteration that reached it, its best checkpoint (the kept one whose
        iteration scored best on ``metric``) and its latest kept checkpoint. Trials that
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
                query = best_leaderboard_query(self._dialect, experiment_run_id, metric, mode, limit)
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
                    best_checkpoint=best_checkpoint,
                    latest_checkpoint=latest_checkpoint,
                )
                # Core rows, not ORM: the ORM's per-row work would cost more than the query.
                for (trial_id, status, num_failures, config, best_value, best_iteration, best_checkpoint,
                     latest_checkpoint) in connection.execute(query)
            ]

        return self._transaction(operation, work, write=False)


    def best_checkpoint_paths(self, trial_ids: Sequence[str], metric: str, mode: str) -> dict[str, str]:
        """The path of each trial's best checkpoint, as :meth:`leaderboard` gives it
        (:func:`~airflow_trials.store.leaderboard.best_checkpoint_path`); trials with none left out."""
        check_mode(mode)
        check_metric(metric)
        if not trial_ids:
            return {}
        trials = TrialRow.__table__
        operation = f"read the best checkpoints of {len(trial_ids)} trials"

        def work(session: Session) -> dict[str, str]:
            rows = session.execute(
                select(trials.c.trial_id, best_checkpoint_path(self._dialect, metric, mode))
                .where(trials.c.trial_id.in_(list(trial_ids)))
            )
            return {trial_id: path for trial_id, path in rows if path is not None}

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
