"""What the dashboard reads from the trials store: runs, leaderboard pages, curves and checkpoints.

Imports the store only (no Airflow), so it is tested and benchmarked without a web server.
:class:`DashboardStore` adds the batch reads a page needs to :class:`TrialStore` (one query for a
page's checkpoints or curves instead of one per trial); :func:`leaderboard_page` turns the
store's full ranking into one sorted page.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import func, select

from airflow_trials.core.status import TrialStatus
from airflow_trials.store import ExperimentRunRecord, ExperimentRunStatus, TrialStore
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
    TrialRow,
)
from airflow_trials.store.records import CheckpointRecordRow

DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 500
# The curves chart draws the best trials of the ranking only: 10,000 polylines help nobody.
DEFAULT_CURVES = 20
MAX_CURVES = 200
SORT_KEYS = ("metric", "trial_id", "status", "failures")


class NotFoundError(LookupError):
    """An id from the URL names nothing in the trials store."""


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


@dataclass(frozen=True)
class BoardRow:
    """One leaderboard line as a page shows it.

    :param rank: place in the ranking by the metric (1 = best), whatever the page is sorted by.
    :param trial: the trial's place in the ranking.
    :param config: the trial's hyperparameters.
    :param checkpoint: the best checkpoint, see :func:`best_checkpoint`; None when none is kept.
    """

    rank: int
    trial: RankedTrial
    config: dict[str, Any]
    checkpoint: CheckpointRecordRow | None


@dataclass(frozen=True)
class BoardPage:
    """One page of a run's leaderboard.

    :param run: the experiment run.
    :param metric: the metric ranked by.
    :param mode: ``"min"`` or ``"max"``.
    :param sort: the column the page is sorted by, one of :data:`SORT_KEYS`.
    :param descending: sort order of ``sort``.
    :param page: 1-based page number.
    :param page_size: rows per page.
    :param total: trials in the run.
    :param rows: this page's rows.
    :param config_keys: the config columns: the search space's keys and those of the page's
        configs, sorted.
    :param status_counts: trials per status over the whole run.
    :param best_trial_id: the run's best trial; None while no trial reported the metric.
    :param leaders: the ids of the best :data:`DEFAULT_CURVES` trials with a value, best first.
    """

    run: ExperimentRunRecord
    metric: str
    mode: str
    sort: str
    descending: bool
    page: int
    page_size: int
    total: int
    rows: list[BoardRow]
    config_keys: list[str]
    status_counts: dict[str, int] = field(default_factory=dict)
    best_trial_id: str | None = None
    leaders: list[str] = field(default_factory=list)

    @property
    def pages(self) -> int:
        return max(1, math.ceil(self.total / self.page_size))


class DashboardStore(TrialStore):
    """A :class:`TrialStore` with the read-only batch queries of the dashboard's pages."""

    def get_experiment_run(self, run_pk: int) -> ExperimentRunRecord:
        """The run with this id; raises :class:`NotFoundError` naming it when there is none."""
        with self._session_scope(f"read experiment run {run_pk}", write=False) as session:
            found = session.execute(
                select(ExperimentRunRow, ExperimentRow.name)
                .join(ExperimentRow, ExperimentRow.id == ExperimentRunRow.experiment_id)
                .where(ExperimentRunRow.id == run_pk)
            ).one_or_none()
        if found is None:
            raise NotFoundError(
                f"Experiment run {run_pk} is not in the trials store; pick a run from the experiments list."
            )
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
                query = best_leaderboard_query(run_pk, mode, None).with_only_columns(
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


def best_checkpoint(checkpoints: Sequence[CheckpointRecordRow], best_iteration: int | None,
                    ) -> CheckpointRecordRow | None:
    """The kept checkpoint that holds the trial's best state.

    That is the newest kept checkpoint taken at or before the best result's iteration (the
    model as it was when it scored best); when the keep policy dropped all of those, or the
    trial has no best yet, the newest kept checkpoint.
    """
    kept = [c for c in checkpoints if not c.deleted]
    if not kept:
        return None
    if best_iteration is not None:
        before = [c for c in kept if c.iteration <= best_iteration]
        if before:
            return before[-1]
    return kept[-1]


def best_point(curve: Sequence[tuple[int, float]], mode: str) -> tuple[int, float] | None:
    """The best (iteration, value) of a curve: lowest or highest value, the earliest on ties."""
    if not curve:
        return None
    sign = 1.0 if check_mode(mode) == "min" else -1.0
    return min(curve, key=lambda point: (sign * point[1], point[0]))


def _sort_key(sort: str, descending: bool) -> Any:
    if sort == "trial_id":
        return lambda item: item[1].trial_id
    if sort == "status":
        return lambda item: (item[1].status.value, item[0])
    # failures: ties keep the ranking
    return lambda item: (item[1].num_failures, -item[0] if descending else item[0])


def leaderboard_page(
    store: DashboardStore,
    run: ExperimentRunRecord,
    metric: str,
    mode: str,
    *,
    sort: str = "metric",
    descending: bool = False,
    page: int = 1,
    page_size: int = DEFAULT_PAGE_SIZE,
) -> BoardPage:
    """One page of the run's leaderboard, ranked over all its trials.

    The store ranks every trial (:meth:`DashboardStore.ranking`); the ranking is then sorted and
    sliced here, so ranks stay those of the full ranking whatever the sort, and only the page's
    rows have their configs and checkpoints read.

    :param sort: ``"metric"`` (the ranking; descending reverses it, trials without the metric
        still last), ``"trial_id"``, ``"status"`` or ``"failures"``.
    :param page: 1-based; a page past the end is empty.
    :param page_size: 1 to :data:`MAX_PAGE_SIZE`.
    """
    check_metric(metric)
    check_mode(mode)
    if sort not in SORT_KEYS:
        raise ValueError(f"Cannot sort the leaderboard by {sort!r}; use one of {', '.join(SORT_KEYS)}.")
    if not 1 <= page_size <= MAX_PAGE_SIZE or page < 1:
        raise ValueError(f"page must be >= 1 and page_size 1 to {MAX_PAGE_SIZE}, got {page} and {page_size}.")
    board = store.ranking(run.id, metric, mode)
    ranked = list(enumerate(board, start=1))
    if sort == "metric":
        if descending:
            scored = [item for item in ranked if item[1].best_value is not None]
            ranked = scored[::-1] + [item for item in ranked if item[1].best_value is None]
    else:
        ranked.sort(key=_sort_key(sort, descending), reverse=descending)
    start = (page - 1) * page_size
    window = ranked[start : start + page_size]
    ids = [trial.trial_id for _, trial in window]
    configs = store.configs_of(ids)
    checkpoints = store.checkpoints_of(ids)
    status_counts: dict[str, int] = defaultdict(int)
    for trial in board:
        status_counts[trial.status.value] += 1
    config_keys = set(run.search_space) if isinstance(run.search_space, dict) else set()
    for config in configs.values():
        config_keys.update(config)
    best = board[0].trial_id if board and board[0].best_value is not None else None
    return BoardPage(
        run=run, metric=metric, mode=mode, sort=sort, descending=descending, page=page,
        page_size=page_size, total=len(board),
        rows=[BoardRow(rank, trial, configs.get(trial.trial_id, {}),
                       best_checkpoint(checkpoints.get(trial.trial_id, []), trial.best_iteration))
              for rank, trial in window],
        config_keys=sorted(config_keys), status_counts=dict(status_counts), best_trial_id=best,
        leaders=[trial.trial_id for trial in board[:DEFAULT_CURVES] if trial.best_value is not None],
    )


def is_live(run: ExperimentRunRecord, status_counts: dict[str, int] | None = None) -> bool:
    """Whether the run still changes: RUNNING, or a trial not yet terminal."""
    if run.status is ExperimentRunStatus.RUNNING:
        return True
    return any(not TrialStatus(status).is_terminal() for status in (status_counts or {}))
