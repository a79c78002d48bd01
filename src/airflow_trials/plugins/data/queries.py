"""What the dashboard reads from the trials store: runs, leaderboard pages, curves, checkpoints, and
a trial's ASHA rungs and PBT lineage.

Imports the store only (no Airflow), so it is tested and benchmarked without a web server.
The dashboard reads through a :class:`~airflow_trials.store.TrialReader`, which cannot write (its
batch reads give a page's checkpoints or curves in one query instead of one per trial);
:func:`leaderboard_page` reads one sorted page of the store's ranking, ranked in SQL
(:meth:`~airflow_trials.store.TrialReader.ranked_page`).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from airflow_trials.core.goal import Goal
from airflow_trials.core.status import TrialStatus
from airflow_trials.core.stop_kind import StopKind
from airflow_trials.store import (
    CheckpointRecordRow,
    ExperimentRunRecord,
    ExperimentRunStatus,
    ParetoRow,
    RankedTrial,
    TrialReader,
)
from airflow_trials.store.board import several_board
from airflow_trials.store.leaderboard import check_metric, check_mode
from airflow_trials.store.ranked_page import PAGE_SORTS, check_page_order
from airflow_trials.store.ranked_page import STOPPED_FILTERS as PAGE_STOPPED_FILTERS
from airflow_trials.store.records import TrialStop

DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 500
# The curves chart draws the best trials of the ranking only: 10,000 polylines help nobody.
DEFAULT_CURVES = 20
MAX_CURVES = 200
SORT_KEYS = PAGE_SORTS
# The leaderboard's ?stopped= filter: every trial, those their scheduler stopped early, the others.
STOPPED_FILTERS = PAGE_STOPPED_FILTERS


#: The most trials of a run of several metrics the dashboard ranks on a request: Pareto ranks
#: over several metrics are not a SQL sort, so each request reads and ranks every trial in
#: Python (6 to 9 s at 100,000 trials; docs/dashboard.md, "Performance").
MAX_PARETO_TRIALS = 10_000


class NotFoundError(LookupError):
    """An id from the URL names nothing in the trials store."""


class TooManyTrialsError(ValueError):
    """A run too large for a read the dashboard can only make whole (a 409 that says so)."""


def check_pareto_size(store: TrialReader, run: ExperimentRunRecord, metrics: Sequence[str]) -> None:
    """Raise :class:`TooManyTrialsError` when the run has more than :data:`MAX_PARETO_TRIALS`
    trials to rank by the Pareto front of ``metrics``, naming the reads that answer instead."""
    num_trials = store.trial_counts().get(run.id, 0)
    if num_trials > MAX_PARETO_TRIALS:
        raise TooManyTrialsError(
            f"Run {run.id} of experiment {run.experiment_name} has {num_trials:,} trials: the "
            f"dashboard ranks a run by the Pareto front of {', '.join(metrics)} over every trial "
            f"on each request (not a sort the database can page), up to {MAX_PARETO_TRIALS:,} "
            f"trials. Add ?metric={metrics[0]} to rank it by one metric, or run airflow-trials "
            f"leaderboard {run.experiment_name} --run {run.id}."
        )


@dataclass(frozen=True)
class TrialTableRow:
    """One trial's row in the run page's leaderboard table, with what the table shows of it (the
    ranking's own row is the store's :class:`~airflow_trials.store.board.BoardRow`).

    :param rank: place in the ranking by the metric (1 = best), whatever the page is sorted by.
    :param trial: the trial's place in the ranking.
    :param config: the trial's hyperparameters.
    :param checkpoint: the best checkpoint (:func:`best_checkpoint`); None when none is kept.
        With several metrics, the newest kept one (no one score picks a best).
    :param stop_reason: why the trial ended TERMINATED; default None (not TERMINATED, or not said).
    :param pareto: with several metrics, the trial's line on the store's leaderboard of several
        metrics (its values, Pareto rank and whether it is on the front); default None.
    :param stop_kind: the kind of its end (``core/stop_kind.py``); default None (not TERMINATED,
        or not said).
    """

    rank: int
    trial: RankedTrial
    config: dict[str, Any]
    checkpoint: CheckpointRecordRow | None
    stop_reason: str | None = None
    pareto: ParetoRow | None = None
    stop_kind: StopKind | None = None

    @property
    def early_stopped(self) -> bool:
        """Its scheduler stopped it early (:func:`early_stopped`)."""
        return early_stopped(self.stop_kind)


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
    :param total: trials the page's filter keeps (all of the run's with ``stopped="all"``).
    :param rows: this page's rows.
    :param config_keys: the config columns: the search space's keys and those of the page's
        configs, sorted.
    :param status_counts: trials per status over the whole run.
    :param best_trial_id: the run's best trial; None while no trial reported the metric.
    :param leaders: the ids of the best :data:`DEFAULT_CURVES` trials with a value, best first.
    :param stopped: the filter, one of :data:`STOPPED_FILTERS`; default ``"all"``.
    :param num_trials: trials in the run, whatever the filter; default 0.
    :param metrics: with several metrics, their names (``metric`` is then the first); default
        None (one metric).
    :param modes: with several metrics, one ``"min"`` or ``"max"`` per metric; default None.
    :param front_trial_ids: with several metrics, the ids of the run's trials on the Pareto front,
        sorted, whatever the filter and page; default empty.
    :param constraints: the experiment's constraints (each row's trial says whether it meets
        them, and feasible trials rank first); default none.
    """

    run: ExperimentRunRecord
    metric: str
    mode: str
    sort: str
    descending: bool
    page: int
    page_size: int
    total: int
    rows: list[TrialTableRow]
    config_keys: list[str]
    status_counts: dict[str, int] = field(default_factory=dict)
    best_trial_id: str | None = None
    leaders: list[str] = field(default_factory=list)
    stopped: str = "all"
    num_trials: int = 0
    metrics: list[str] | None = None
    modes: list[str] | None = None
    front_trial_ids: list[str] = field(default_factory=list)
    constraints: list[str] = field(default_factory=list)

    @property
    def pages(self) -> int:
        return max(1, math.ceil(self.total / self.page_size))


def get_experiment_run(store: TrialReader, run_pk: int) -> ExperimentRunRecord:
    """The run with this id; raises :class:`NotFoundError` (a 404) naming it when there is none."""
    run = store.find_experiment_run(run_pk)
    if run is None:
        raise NotFoundError(
            f"Experiment run {run_pk} is not in the trials store; pick a run from the experiments "
            "list."
        )
    return run


def early_stopped(stop_kind: StopKind | str | None) -> bool:
    """Did its scheduler stop it early (its stop kind:
    :attr:`airflow_trials.core.stop_kind.StopKind.early`)?"""
    return stop_kind is not None and StopKind(stop_kind).early


def best_checkpoint(
    checkpoints: Sequence[CheckpointRecordRow], best_path: str | None
) -> CheckpointRecordRow | None:
    """The record of a trial's best checkpoint, whose path the store chose
    (:meth:`TrialReader.best_checkpoint_paths`: the kept checkpoint whose iteration scored best
    on the metric, as on the leaderboard and in ``select_best``'s XCom); None when none is kept."""
    return next((c for c in checkpoints if c.path == best_path and not c.deleted), None)


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
    store: TrialReader,
    run: ExperimentRunRecord,
    metric: str,
    mode: str,
    *,
    sort: str = "metric",
    descending: bool = False,
    page: int = 1,
    page_size: int = DEFAULT_PAGE_SIZE,
    stopped: str = "all",
) -> BoardPage:
    """One page of the run's leaderboard, ranked over all its trials.

    The store ranks, filters, sorts and slices in SQL (:meth:`TrialReader.ranked_page`), so
    ranks stay those of the full ranking whatever the filter and sort, and only the page's rows
    leave the database; their configs, checkpoints and stop reasons are then read for them
    alone. The status counts, the best trial and the leaders are the whole run's.

    :param sort: ``"metric"`` (the ranking; descending reverses it, trials without the metric
        still last), ``"trial_id"``, ``"status"`` or ``"failures"``.
    :param page: 1-based; a page past the end is empty.
    :param page_size: 1 to :data:`MAX_PAGE_SIZE`.
    :param stopped: ``"early"``: only the trials their scheduler stopped early
        (:func:`early_stopped`);
        ``"not_early"``: only the others; ``"all"`` (default).
    """
    _check_page(metric, mode, sort, page, page_size, stopped)
    ranked = store.ranked_page(
        run.id,
        metric,
        mode,
        sort=sort,
        descending=descending,
        stopped=stopped,
        offset=(page - 1) * page_size,
        limit=page_size,
        leaders=DEFAULT_CURVES,
    )
    rows = _board_rows(store, ranked.rows, metric, mode)
    return BoardPage(
        run=run,
        metric=metric,
        mode=mode,
        sort=sort,
        descending=descending,
        page=page,
        page_size=page_size,
        total=ranked.total,
        rows=rows,
        config_keys=_config_keys(run, rows),
        status_counts=ranked.status_counts,
        best_trial_id=ranked.best_trial_id,
        leaders=ranked.leaders,
        stopped=stopped,
        num_trials=ranked.num_trials,
        constraints=store.get_experiment(run.experiment_name).constraint_spec,
    )


def _check_page(metric: str, mode: str, sort: str, page: int, page_size: int, stopped: str) -> None:
    check_metric(metric)
    check_mode(mode)
    check_page_order(sort, stopped)
    if not 1 <= page_size <= MAX_PAGE_SIZE or page < 1:
        raise ValueError(
            f"page must be >= 1 and page_size 1 to {MAX_PAGE_SIZE}, got {page} and {page_size}."
        )


def _filtered(
    store: TrialReader, run_pk: int, ranked: list[tuple[int, RankedTrial]], stopped: str
) -> list[tuple[int, RankedTrial]]:
    """The (rank, trial) pairs the ``stopped`` filter keeps, ranks unchanged."""
    if stopped == "all":
        return ranked
    early = store.early_stopped_trials(run_pk)
    keep = stopped == "early"
    return [item for item in ranked if (item[1].trial_id in early) is keep]


def _board_rows(
    store: TrialReader, window: list[tuple[int, RankedTrial]], metric: str, mode: str
) -> list[TrialTableRow]:
    """The page's rows, with the configs, best checkpoints and stop reasons of its trials only."""
    ids = [trial.trial_id for _, trial in window]
    configs = store.configs_of(ids)
    checkpoints = store.checkpoints_of(ids)
    best_paths = store.best_checkpoint_paths(ids, metric, mode)
    stops = store.stops_of(ids)
    return [
        TrialTableRow(
            rank,
            trial,
            configs.get(trial.trial_id, {}),
            best_checkpoint(checkpoints.get(trial.trial_id, []), best_paths.get(trial.trial_id)),
            *_stop(stops.get(trial.trial_id)),
        )
        for rank, trial in window
    ]


def _stop(stop: TrialStop | None) -> tuple[str | None, None, StopKind | None]:
    """A row's ``stop_reason``, ``pareto`` (None) and ``stop_kind`` from its trial's stop."""
    return (None, None, None) if stop is None else (stop.reason, None, stop.kind)


def _sorted(
    ranked: list[tuple[int, RankedTrial]],
    sort: str,
    descending: bool,
    unscored: set[str] | None = None,
) -> list[tuple[int, RankedTrial]]:
    """(rank, trial) pairs in the page's order, ranking order first; ranks stay the ranking's.

    :param unscored: the trials the ranking could not place, which stay last when ``"metric"``
        is descending; default those without a best value.
    """
    if sort == "metric":
        if descending:
            last = (
                {t.trial_id for _, t in ranked if t.best_value is None}
                if unscored is None
                else unscored
            )
            scored = [item for item in ranked if item[1].trial_id not in last]
            ranked = scored[::-1] + [item for item in ranked if item[1].trial_id in last]
    else:
        ranked = sorted(ranked, key=_sort_key(sort, descending), reverse=descending)
    return ranked


def pareto_page(
    store: TrialReader,
    run: ExperimentRunRecord,
    metrics: list[str],
    modes: list[str],
    *,
    sort: str = "metric",
    descending: bool = False,
    page: int = 1,
    page_size: int = DEFAULT_PAGE_SIZE,
    stopped: str = "all",
) -> BoardPage:
    """One page of the run's leaderboard of several metrics
    (:meth:`TrialReader.pareto_leaderboard`): trials by Pareto rank (0 = the front) over their
    last results, then by the first metric in its mode, then by trial id; those without a
    rankable value of every metric last. Filtered, sorted and sliced as :func:`leaderboard_page`
    does, ranks staying those of the whole ranking. ``metric`` and ``mode`` of the page are the
    first metric's (the tie-break, and the metric of its learning curves); its front
    (``front_trial_ids``) and best trial (``best_trial_id``, the pick's default) are the run
    board's (:mod:`~airflow_trials.store.board`), the ones select_best and the history name.
    Of a run of more than :data:`MAX_PARETO_TRIALS` trials, :class:`TooManyTrialsError`.
    """
    for metric, mode in zip(metrics, modes, strict=True):
        _check_page(metric, mode, sort, page, page_size, stopped)
    check_pareto_size(store, run, metrics)
    pareto = store.pareto_leaderboard(run.id, metrics, modes)
    best = several_board(Goal.of(metrics, modes), pareto).best_trial_id
    board = [
        RankedTrial(
            r.trial_id, r.status, r.num_failures, None, None, r.feasible, r.violations, r.stop_kind
        )
        for r in pareto.rows
    ]
    shown = _filtered(store, run.id, list(enumerate(board, start=1)), stopped)
    unranked = {r.trial_id for r in pareto.rows if r.pareto_rank is None}
    start = (page - 1) * page_size
    window = _sorted(shown, sort, descending, unranked)[start : start + page_size]
    rows = _pareto_rows(store, window, {r.trial_id: r for r in pareto.rows})
    status_counts, config_keys = _counts_and_config_keys(run, board, rows)
    return BoardPage(
        run=run,
        metric=metrics[0],
        mode=modes[0],
        sort=sort,
        descending=descending,
        page=page,
        page_size=page_size,
        total=len(shown),
        rows=rows,
        config_keys=config_keys,
        status_counts=status_counts,
        best_trial_id=best,
        leaders=[r.trial_id for r in pareto.rows[:DEFAULT_CURVES] if r.pareto_rank is not None],
        stopped=stopped,
        num_trials=len(board),
        metrics=pareto.metrics,
        modes=pareto.modes,
        front_trial_ids=pareto.front_trial_ids,
        constraints=pareto.constraints,
    )


def _pareto_rows(
    store: TrialReader, window: list[tuple[int, RankedTrial]], places: dict[str, ParetoRow]
) -> list[TrialTableRow]:
    """The table's rows of a page of the leaderboard of several metrics: each trial's config,
    best checkpoint, stop and place on the Pareto ranking."""
    ids = [trial.trial_id for _, trial in window]
    checkpoints = store.checkpoints_of(ids)
    stops = store.stops_of(ids)
    return [
        TrialTableRow(
            rank,
            trial,
            places[trial.trial_id].config,
            best_checkpoint(
                checkpoints.get(trial.trial_id, []), places[trial.trial_id].latest_checkpoint
            ),
            stops[trial.trial_id].reason if trial.trial_id in stops else None,
            places[trial.trial_id],
            stops[trial.trial_id].kind if trial.trial_id in stops else None,
        )
        for rank, trial in window
    ]


def is_live(run: ExperimentRunRecord, status_counts: dict[str, int] | None = None) -> bool:
    """Whether the run still changes: RUNNING, or a trial not yet terminal."""
    if run.status is ExperimentRunStatus.RUNNING:
        return True
    return any(not TrialStatus(status).is_terminal() for status in (status_counts or {}))


def _counts_and_config_keys(
    run: ExperimentRunRecord, board: Sequence[Any], rows: Sequence[TrialTableRow]
) -> tuple[dict[str, int], list[str]]:
    """A board page's trials per status over the whole run, and its config columns
    (:func:`_config_keys`)."""
    status_counts: dict[str, int] = defaultdict(int)
    for trial in board:
        status_counts[trial.status.value] += 1
    return dict(status_counts), _config_keys(run, rows)


def _config_keys(run: ExperimentRunRecord, rows: Sequence[TrialTableRow]) -> list[str]:
    """A board page's config columns: the search space's keys and those of its configs, sorted."""
    config_keys = set(run.search_space) if isinstance(run.search_space, dict) else set()
    for row in rows:
        config_keys.update(row.config)
    return sorted(config_keys)
