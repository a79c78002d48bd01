"""QueryStore: a TrialStore with the read-only batch queries of pages that show many trials at once.

One query for a page's checkpoints or curves instead of one per trial. The dashboard
(:mod:`airflow_trials.plugins.queries`) reads through these public methods only.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select

from airflow_trials.core.fate import stopped_early
from airflow_trials.core.status import TrialStatus
from airflow_trials.store.exploits import _exploit_record, exploit_lineage
from airflow_trials.store.leaderboard import (
    best_leaderboard_query,
    check_metric,
    check_mode,
    metric_value,
)
from airflow_trials.store.models import (
    CheckpointRow,
    ExperimentRow,
    ExperimentRunRow,
    ResultRow,
    TrialExploitRow,
    TrialRow,
    TrialRungRow,
)
from airflow_trials.store.records import (
    CheckpointRecordRow,
    ExperimentRunRecord,
    ExperimentRunStatus,
    ExploitRecord,
    RungDecision,
)
from airflow_trials.store.rungs import _rung_decision
from airflow_trials.store.store import TrialStore


@dataclass(frozen=True)
class RankedTrial:
    """A trial's place in a ranking, without its config (read only for the rows a page shows).

    :param trial_id: the trial.
    :param status: its current status.
    :param num_failures: failures so far.
    :param best_value: its best value of the metric; None when it never reported it.
    :param best_iteration: the first iteration that reached ``best_value``; None with it.
    """

    trial_id: str
    status: TrialStatus
    num_failures: int
    best_value: float | None
    best_iteration: int | None


class QueryStore(TrialStore):
    """A :class:`TrialStore` with read-only batch queries; each is one attempt (no retry)."""

    def find_experiment_run(self, run_pk: int) -> ExperimentRunRecord | None:
        """The run with this id, or None when the store has no such run."""
        with self._session_scope(f"read experiment run {run_pk}", write=False) as session:
            found = session.execute(
                select(ExperimentRunRow, ExperimentRow.name)
                .join(ExperimentRow, ExperimentRow.id == ExperimentRunRow.experiment_id)
                .where(ExperimentRunRow.id == run_pk)
            ).one_or_none()
        if found is None:
            return None
        run, name = found
        return ExperimentRunRecord(
            id=run.id, experiment_id=run.experiment_id, experiment_name=name, run_key=run.run_key,
            dag_id=run.dag_id, run_id=run.run_id, search_space=run.search_space, seed=run.seed,
            num_samples=run.num_samples, status=ExperimentRunStatus(run.status),
            created_at=run.created_at, ended_at=run.ended_at,
        )

    def trial_counts(self) -> dict[int, int]:
        """Trials per experiment run id."""
        with self._session_scope("count the trials of each experiment run", write=False) as session:
            rows = session.execute(
                select(TrialRow.experiment_run_id, func.count())
                .where(TrialRow.experiment_run_id.is_not(None))
                .group_by(TrialRow.experiment_run_id)
            )
            return {run_pk: count for run_pk, count in rows if run_pk is not None}

    def ranking(self, run_pk: int, metric: str, mode: str) -> list[RankedTrial]:
        """Every trial of the run in the order of :meth:`TrialStore.leaderboard`, without configs.

        When the run's bests are maintained for this metric and mode (the experiment's), this is
        the leaderboard's own query over ``at_trials`` with fewer columns: no config to decode and
        no checkpoint to look up per trial, which are most of a 10,000-trial leaderboard's time.
        Otherwise it is the store's leaderboard itself.
        """
        check_mode(mode)
        check_metric(metric)
        operation = f"rank the trials of experiment run {run_pk} by {mode} {metric}"
        with self._session_scope(operation, write=False) as session:
            run = self._find_run_or_raise(session, run_pk, operation)
            if self._best_is_current(session, run, metric, mode):
                trials = TrialRow.__table__.c
                query = best_leaderboard_query(self._dialect, run_pk, metric, mode, None).with_only_columns(
                    trials.trial_id, trials.status, trials.num_failures, trials.best_value, trials.best_iteration
                )
                return [RankedTrial(trial_id, TrialStatus(status), failures, value, iteration)
                        for trial_id, status, failures, value, iteration in session.execute(query)]
        return [RankedTrial(r.trial_id, r.status, r.num_failures, r.best_value, r.best_iteration)
                for r in self.leaderboard(run_pk, metric, mode)]

    def configs_of(self, trial_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
        """The configs of these trials."""
        if not trial_ids:
            return {}
        with self._session_scope(f"read the configs of {len(trial_ids)} trials", write=False) as session:
            rows = session.execute(
                select(TrialRow.trial_id, TrialRow.config).where(TrialRow.trial_id.in_(list(trial_ids)))
            )
            return {trial_id: config for trial_id, config in rows}

    def stop_reasons_of(self, trial_ids: Sequence[str]) -> dict[str, str]:
        """Why each of these trials ended TERMINATED; trials without a stop reason are left out."""
        if not trial_ids:
            return {}
        with self._session_scope(f"read the stop reasons of {len(trial_ids)} trials", write=False) as session:
            rows = session.execute(
                select(TrialRow.trial_id, TrialRow.stop_reason)
                .where(TrialRow.trial_id.in_(list(trial_ids)), TrialRow.stop_reason.is_not(None))
            )
            return {trial_id: reason for trial_id, reason in rows if reason is not None}

    def early_stopped_trials(self, run_pk: int) -> set[str]:
        """The ids of the run's trials their scheduler stopped early
        (:func:`~airflow_trials.core.fate.stopped_early`); only trials with a stop reason are read."""
        with self._session_scope(f"read the early stopped trials of experiment run {run_pk}", write=False) as session:
            rows = session.execute(
                select(TrialRow.trial_id, TrialRow.stop_reason)
                .where(TrialRow.experiment_run_id == run_pk, TrialRow.stop_reason.is_not(None))
            )
            return {trial_id for trial_id, reason in rows if stopped_early(reason)}

    def rungs_of_run(self, run_pk: int) -> dict[str, list[RungDecision]]:
        """Every ASHA rung record of the run's trials (``trial_rungs`` of each), in one query."""
        rungs = TrialRungRow.__table__
        found: dict[str, list[RungDecision]] = defaultdict(list)
        with self._session_scope(f"read the rungs of experiment run {run_pk}", write=False) as session:
            rows = session.execute(
                select(rungs).where(rungs.c.experiment_run_id == run_pk).order_by(rungs.c.trial_id, rungs.c.milestone)
            )
            for row in rows:
                found[row.trial_id].append(_rung_decision(row._mapping, fresh=False))
        return found

    def lineages_of_run(self, run_pk: int) -> dict[str, list[ExploitRecord]]:
        """The lineage (``TrialStore.lineage``) of each of the run's trials that was exploited, from
        one query over their exploits; donors outside the run end a lineage there."""
        exploits = TrialExploitRow.__table__
        by_trial: dict[str, list[ExploitRecord]] = defaultdict(list)
        with self._session_scope(f"read the exploits of experiment run {run_pk}", write=False) as session:
            rows = session.execute(
                select(exploits).join(TrialRow, TrialRow.trial_id == exploits.c.trial_id)
                .where(TrialRow.experiment_run_id == run_pk).order_by(exploits.c.id)
            )
            for row in rows:
                by_trial[row.trial_id].append(_exploit_record(row._mapping, fresh=False))

        def latest_before(trial_id: str, bound: int | None) -> ExploitRecord | None:
            own = by_trial.get(trial_id, [])
            index = len(own) if bound is None else bisect.bisect_left(own, bound, key=lambda e: e.id)
            return own[index - 1] if index else None

        return {trial_id: exploit_lineage(trial_id, latest_before) for trial_id in by_trial}

    def checkpoints_of(self, trial_ids: Sequence[str]) -> dict[str, list[CheckpointRecordRow]]:
        """Every recorded checkpoint of these trials (deleted ones too), oldest iteration first."""
        found: dict[str, list[CheckpointRecordRow]] = defaultdict(list)
        if not trial_ids:
            return found
        with self._session_scope(f"read the checkpoints of {len(trial_ids)} trials", write=False) as session:
            rows = session.execute(
                select(CheckpointRow.trial_id, CheckpointRow.path, CheckpointRow.iteration,
                       CheckpointRow.score, CheckpointRow.deleted)
                .where(CheckpointRow.trial_id.in_(list(trial_ids)))
                .order_by(CheckpointRow.trial_id, CheckpointRow.iteration, CheckpointRow.id)
            )
            for trial_id, path, iteration, score, deleted in rows:
                found[trial_id].append(
                    CheckpointRecordRow(path=path, iteration=iteration, score=score, deleted=deleted)
                )
        return found

    def metric_curves(self, trial_ids: Sequence[str], metric: str) -> dict[str, list[tuple[int, float]]]:
        """(iteration, value) of ``metric`` per trial, in iteration order; results without it skipped.

        The value is extracted in SQL with the leaderboard's own guarded expression, so a string
        or NaN-turned-null under the metric's key is skipped as the leaderboard skips it.
        """
        check_metric(metric)
        curves: dict[str, list[tuple[int, float]]] = {trial_id: [] for trial_id in trial_ids}
        if not trial_ids:
            return curves
        value = metric_value(ResultRow.__table__.c.metrics, metric, self._dialect)
        with self._session_scope(f"read the {metric} curves of {len(trial_ids)} trials", write=False) as session:
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
        with self._session_scope(f"find the trial of task {dag_id}.{task_id}", write=False) as session:
            return session.execute(
                select(TrialRow.trial_id).where(
                    TrialRow.dag_id == dag_id, TrialRow.run_id == run_id,
                    TrialRow.task_id == task_id, TrialRow.map_index == map_index,
                ).limit(1)
            ).scalar_one_or_none()
