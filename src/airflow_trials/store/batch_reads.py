"""BatchReader: the read side's reads for pages, one query for many trials and one attempt each."""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any

from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session

from airflow_trials.core.status import TrialStatus
from airflow_trials.core.stop_kind import StopKind, stop_kind_or_none
from airflow_trials.store.database import Database
from airflow_trials.store.exploits import exploit_lineage
from airflow_trials.store.feasibility import judged_feasible_first, run_constraints, run_feasibility
from airflow_trials.store.leaderboard import (
    best_leaderboard_query,
    check_metric,
    check_mode,
    maintained_best_columns,
    metric_value,
)
from airflow_trials.store.mapping import (
    checkpoint_record,
    experiment_run_record,
    exploit_record,
    ranked_trial,
    rung_decision,
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
    ExploitRecord,
    LeaderboardRow,
    RankedTrial,
    RungDecision,
    TrialStop,
)

#: The store's leaderboard of a run (``TrialReader.leaderboard``): run id, metric, mode.
Leaderboard = Callable[[int, str, str], list[LeaderboardRow]]


class BatchReader:
    """The reads behind the dashboard's and the ``airflow-trials`` command's pages: each reads
    what a page shows of many trials in one query, and makes one attempt (no retry: the page is
    asked for again). It has no method that writes;
    :class:`~airflow_trials.store.TrialReader` hands out its methods as its own.

    :param db: the reader's database (read-only, or a TrialStore's).
    :param leaderboard: the reader's leaderboard, which :meth:`ranking` falls back on.
    """

    def __init__(self, db: Database, leaderboard: Leaderboard) -> None:
        self._db = db
        self._leaderboard = leaderboard

    def _once(self, operation: str) -> AbstractContextManager[Session]:
        return self._db.session_scope(operation, write=False)

    # -- runs ----------------------------------------------------------------------------------

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
        """Every trial of the run in the order of the leaderboard, without configs.

        When the run's bests are maintained for this metric and mode (the experiment's), this is
        the leaderboard's own query over ``at_trials`` with fewer columns: no config to decode and
        no checkpoint to look up per trial, which are most of a 10,000-trial leaderboard's time.
        Otherwise it is the store's leaderboard itself. With the experiment's constraints, the
        feasible trials come first, as on the leaderboard.
        """
        check_mode(mode)
        check_metric(metric)
        operation = f"rank the trials of experiment run {run_pk} by {mode} {metric}"
        with self._once(operation) as session:
            run = self._db.find_run(session, run_pk, operation)
            maintained = maintained_best_columns(session, run, metric, mode)
            if maintained is not None:
                trials = TrialRow.__table__.c
                query = best_leaderboard_query(run_pk, mode, None, maintained).with_only_columns(
                    trials.trial_id, trials.status, trials.num_failures, *maintained
                )
                ranked = [ranked_trial(row) for row in session.execute(query)]
                constraints = run_constraints(session, run)
                if not constraints:
                    return ranked
                # Feasible trials first, as the leaderboard ranks them.
                checks = run_feasibility(
                    session, self._db.dialect, run, constraints, (metric, mode)
                )
                return judged_feasible_first(ranked, checks)
        return [
            RankedTrial(
                r.trial_id,
                r.status,
                r.num_failures,
                r.best_value,
                r.best_iteration,
                r.feasible,
                r.violations,
            )
            for r in self._leaderboard(run_pk, metric, mode)
        ]

    def early_stopped_trials(self, run_pk: int) -> set[str]:
        """The ids of the run's trials their scheduler stopped early (stop kind ``scheduler``:
        :attr:`~airflow_trials.core.stop_kind.StopKind.early`), from the partial index
        ``ix_at_trials_run_stopped_early``."""
        with self._once(f"read the early stopped trials of experiment run {run_pk}") as session:
            rows = session.execute(
                select(TrialRow.trial_id).where(
                    TrialRow.experiment_run_id == run_pk,
                    TrialRow.status == TrialStatus.TERMINATED.value,
                    TrialRow.stop_kind == StopKind.SCHEDULER.value,
                )
            )
            return set(rows.scalars())

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
        """The lineage (``TrialReader.lineage``) of each of the run's trials that was exploited,
        from one query over their exploits; donors outside the run end a lineage there."""
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

    # -- trials by id --------------------------------------------------------------------------

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

    def stops_of(self, trial_ids: Sequence[str]) -> dict[str, TrialStop]:
        """How each of these trials ended TERMINATED (its stop reason and kind); trials with
        neither are left out."""
        if not trial_ids:
            return {}
        with self._once(f"read the stop reasons of {len(trial_ids)} trials") as session:
            rows = session.execute(
                select(TrialRow.trial_id, TrialRow.stop_reason, TrialRow.stop_kind).where(
                    TrialRow.trial_id.in_(list(trial_ids)),
                    or_(TrialRow.stop_reason.is_not(None), TrialRow.stop_kind.is_not(None)),
                )
            )
            return {
                trial_id: TrialStop(reason, stop_kind_or_none(kind))
                for trial_id, reason, kind in rows
            }

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
