"""The leaderboard query and the per-metric expression index that keeps it fast.

A metric lives inside each result's JSON, so ranking trials by it means extracting it in SQL:
``json_extract(metrics, '$."m"')`` on SQLite and ``(metrics->>'m')::float`` on PostgreSQL.
Extracting it from every row takes seconds at a million results, so the store keeps an
expression index ``(trial_id, <metric value>, iteration)`` on ``at_results`` for each metric an
experiment ranks by. The query then finds each trial's best result with one index probe per trial.
For an index to match, the expression in the query must be the very same as in the index; both
are built by :func:`metric_value`, with the metric name rendered as a literal: a PostgreSQL
generic plan (psycopg prepares a statement after five executions) cannot match an index
expression that holds a parameter.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from sqlalchemy import (
    JSON,
    BindParameter,
    Column,
    ColumnElement,
    Index,
    Integer,
    MetaData,
    Select,
    String,
    Table,
    Text,
    and_,
    bindparam,
    case,
    cast,
    false,
    func,
    select,
    true,
)
from sqlalchemy.orm import Session
from sqlalchemy.sql.elements import Grouping

from airflow_trials.core.pareto import decode_metrics
from airflow_trials.store.models import (
    CheckpointRow,
    ExperimentRow,
    ExperimentRunRow,
    ResultRow,
    TrialRow,
    json_type,
)

METRIC_INDEX_PREFIX = "ix_at_results_metric_"
MODES = ("min", "max")

# A stand-in for at_results in its own MetaData: an Index built on the real table would join
# Base.metadata, and create_all() or autogenerate would then treat it as part of the schema.
_RESULTS_FOR_INDEX = Table(
    "at_results",
    MetaData(),
    Column("trial_id", String(128)),
    Column("iteration", Integer),
    Column("metrics", json_type()),
)


def check_mode(mode: str) -> str:
    if mode not in MODES:
        raise ValueError(f"mode must be 'min' or 'max', got {mode!r}.")
    return mode


def check_metric(metric: str) -> str:
    if not isinstance(metric, str) or not metric or '"' in metric or len(metric) > 250:
        raise ValueError(
            f"Metric name {metric!r} cannot be ranked by: use a non-empty name of at most "
            f"250 characters without '\"' (it becomes a JSON path)."
        )
    return metric


def _literal(value: str, type_: Any = None) -> BindParameter[Any]:
    # Rendered into the SQL text at execution, so the query matches the expression index.
    return bindparam(
        None, value, type_=type_ if type_ is not None else String(), literal_execute=True
    )


def metric_value(metrics: Any, metric: str, dialect_name: str) -> ColumnElement[float]:
    """The metric's value in one result as a float; NULL when missing or not a number.

    :param metrics: the ``metrics`` column of ``at_results`` (or of an alias of it).
    :param metric: key in the result dict.
    :param dialect_name: ``"sqlite"`` or ``"postgresql"``.
    """
    key = _literal(metric, JSON.JSONStrIndexType())
    value = metric_float(metrics, metric)
    # A string or bool under the metric's key must not break the cast (PostgreSQL raises) or
    # rank as 0.0 (SQLite casts 'abc' to 0); it is treated as not reported.
    if dialect_name == "postgresql":
        guard = func.jsonb_typeof(metrics[key]) == _literal("number")
    elif dialect_name == "sqlite":
        guard = func.json_type(metrics, _literal(f'$."{metric}"')).in_(
            [_literal("integer"), _literal("real")]
        )
    else:
        return value
    return case((guard, value), else_=None)


def metric_float(metrics: Any, metric: str) -> ColumnElement[float]:
    """The metric cast to float, unguarded: only for a row whose :func:`metric_value` is not
    NULL."""
    return metrics[_literal(metric, JSON.JSONStrIndexType())].as_float()


def metric_index_name(metric: str) -> str:
    return METRIC_INDEX_PREFIX + hashlib.sha1(metric.encode()).hexdigest()[:16]


def metric_index(metric: str, dialect_name: str) -> Index:
    """The expression index ``(trial_id, <metric value>, iteration)`` on ``at_results``."""
    table = _RESULTS_FOR_INDEX
    return Index(
        metric_index_name(metric),
        table.c.trial_id,
        # Parenthesised: PostgreSQL takes only a column or (expression) as an index key.
        Grouping(metric_value(table.c.metrics, metric, dialect_name)),
        table.c.iteration,
    )


def leaderboard_query(
    dialect_name: str, experiment_run_id: int, metric: str, mode: str, limit: int | None
) -> Select[Any]:
    """One row per trial of the run: trial columns, best value and its iteration.

    Columns: trial_id, status, num_failures, config (JSON text), best_value, best_iteration,
    stop_kind; the
    checkpoints come from :func:`checkpoint_paths`, one query for the whole ranking. Ordered by
    best value (ascending for min, descending for max), trials without the metric last, then by
    trial_id. Each trial's best result is found by one probe of the metric index (the trial's
    first entry whose value is not NULL); on ties the earliest iteration wins.
    """
    trials = TrialRow.__table__
    results = ResultRow.__table__
    value = metric_value(results.c.metrics, metric, dialect_name)
    best_first = (
        select()
        .where(results.c.trial_id == trials.c.trial_id, value.is_not(None))
        .order_by(value.asc() if mode == "min" else value.desc(), results.c.iteration.asc())
        .limit(1)
    )
    build = _lateral_leaderboard if dialect_name == "postgresql" else _joined_leaderboard
    query, best_value, trial_id = build(best_first, experiment_run_id, metric)
    ordering = best_value.asc() if mode == "min" else best_value.desc()
    query = query.order_by(ordering.nulls_last(), trial_id)
    if limit is not None:
        query = query.limit(limit)
    return query


def best_source(
    dialect_name: str,
    experiment_run_id: int,
    metric: str,
    mode: str,
    maintained: MaintainedBest | None,
) -> tuple[Any, ColumnElement[Any], ColumnElement[Any]]:
    """``at_trials`` with each trial's best value of ``metric`` in ``mode`` and its iteration:
    (the FROM to select from, best value, best iteration). The maintained columns when given
    (:func:`maintained_best_columns`), else the leaderboard's probe per trial joined back."""
    trials = TrialRow.__table__
    if maintained is not None:
        return trials, maintained[0], maintained[1]
    probed = leaderboard_query(dialect_name, experiment_run_id, metric, mode, None).order_by(None)
    columns = {column.name: column for column in probed.selected_columns}
    probe = probed.with_only_columns(
        columns["trial_id"], columns["best_value"], columns["best_iteration"]
    ).subquery("probed")
    source = trials.join(probe, probe.c.trial_id == trials.c.trial_id)
    return source, probe.c.best_value, probe.c.best_iteration


# A leaderboard query before ordering, with the columns to order it by: best value, trial id.
_Unordered = tuple[Select[Any], ColumnElement[Any], ColumnElement[Any]]


def _config_text() -> ColumnElement[Any]:
    # As JSON text, decoded by the caller: psycopg's JSONB loader costs twice what json.loads does.
    return cast(TrialRow.__table__.c.config, Text).label("config")


def _lateral_leaderboard(
    best_first: Select[Any], experiment_run_id: int, metric: str
) -> _Unordered:
    """PostgreSQL: LATERAL reads the best result's value and iteration in the probe itself."""
    trials = TrialRow.__table__
    results = ResultRow.__table__
    best = best_first.add_columns(
        # The probe only returns a row whose value is a number: no need for the guard again.
        metric_float(results.c.metrics, metric).label("best_value"),
        results.c.iteration.label("best_iteration"),
    ).lateral("best")
    query = (
        select(
            trials.c.trial_id,
            trials.c.status,
            trials.c.num_failures,
            _config_text(),
            best.c.best_value,
            best.c.best_iteration,
            trials.c.stop_kind,
        )
        .select_from(trials.outerjoin(best, true()))
        .where(trials.c.experiment_run_id == experiment_run_id)
    )
    return query, best.c.best_value, trials.c.trial_id


def _joined_leaderboard(best_first: Select[Any], experiment_run_id: int, metric: str) -> _Unordered:
    """SQLite has no LATERAL: the probe yields the best row's id, joined back by rowid."""
    trials = TrialRow.__table__
    results = ResultRow.__table__
    ranked = (
        select(
            trials.c.trial_id,
            trials.c.status,
            trials.c.num_failures,
            _config_text(),
            trials.c.stop_kind,
            best_first.add_columns(results.c.id)
            .correlate(trials)
            .scalar_subquery()
            .label("best_id"),
        )
        .where(trials.c.experiment_run_id == experiment_run_id)
        .subquery("ranked")
    )
    best_row = results.alias("best")
    best_value = metric_float(best_row.c.metrics, metric).label("best_value")
    query = select(
        ranked.c.trial_id,
        ranked.c.status,
        ranked.c.num_failures,
        ranked.c.config,
        best_value,
        best_row.c.iteration.label("best_iteration"),
        ranked.c.stop_kind,
    ).select_from(ranked.outerjoin(best_row, best_row.c.id == ranked.c.best_id))
    return query, best_value, ranked.c.trial_id


def latest_checkpoint_path() -> Any:
    """Correlated subquery (on ``at_trials``): the trial's newest checkpoint not deleted."""
    trials = TrialRow.__table__
    checkpoints = CheckpointRow.__table__
    return (
        select(checkpoints.c.path)
        .where(checkpoints.c.trial_id == trials.c.trial_id, checkpoints.c.deleted == false())
        .order_by(checkpoints.c.iteration.desc(), checkpoints.c.id.desc())
        .limit(1)
        .correlate(trials)
        .scalar_subquery()
    )


def checkpoint_paths(
    dialect_name: str,
    metric: str,
    mode: str,
    *,
    experiment_run_id: int | None = None,
    trial_ids: Sequence[str] | None = None,
) -> Select[Any]:
    """One row per trial with a kept (not deleted) checkpoint, among the trials of
    ``experiment_run_id`` or those of ``trial_ids`` (one of the two): trial_id,
    best_checkpoint_path, latest_checkpoint_path.

    The best checkpoint is the kept one whose iteration's result has the best value of ``metric``
    (lowest for ``"min"``, highest for ``"max"``; the earliest on ties): the model as it was when
    it scored that value. When no kept checkpoint has a result with the metric, it is the newest
    kept one (highest iteration, then the last recorded), which is the latest checkpoint.

    The leaderboard reads it in a query of its own, once per ranking, and matches the rows by
    trial_id: its cost grows with the kept checkpoints, not with the trials ranked (one
    correlated lookup per trial, three with the best checkpoint's, cost more than the ranking
    itself at 10,000 trials), and with a ``limit`` only the trials shown are read. Each
    checkpoint's result is one probe of the results' unique ``(trial_id, iteration)`` index.
    """
    if (experiment_run_id is None) == (trial_ids is None):
        raise ValueError("Pass experiment_run_id or trial_ids to checkpoint_paths, not both.")
    valued = _valued_checkpoints(dialect_name, metric, experiment_run_id, trial_ids)
    by_value = valued.c.value.asc() if check_mode(mode) == "min" else valued.c.value.desc()
    ranked = select(
        valued.c.trial_id,
        valued.c.path,
        valued.c.value,
        func.row_number()
        .over(
            partition_by=valued.c.trial_id,
            order_by=[by_value.nulls_last(), valued.c.iteration.asc(), valued.c.id.desc()],
        )
        .label("best_rank"),
        func.row_number()
        .over(
            partition_by=valued.c.trial_id,
            order_by=[valued.c.iteration.desc(), valued.c.id.desc()],
        )
        .label("latest_rank"),
    ).subquery("ranked_checkpoints")
    scored = func.max(
        case((and_(ranked.c.best_rank == 1, ranked.c.value.is_not(None)), ranked.c.path))
    )
    latest = func.max(case((ranked.c.latest_rank == 1, ranked.c.path)))
    return select(
        ranked.c.trial_id,
        func.coalesce(scored, latest).label("best_checkpoint_path"),
        latest.label("latest_checkpoint_path"),
    ).group_by(ranked.c.trial_id)


def _valued_checkpoints(
    dialect_name: str,
    metric: str,
    experiment_run_id: int | None,
    trial_ids: Sequence[str] | None,
) -> Any:
    """The kept checkpoints of the run's trials (or of ``trial_ids``), each with its result's
    value of ``metric`` (NULL without one): trial_id, path, iteration, id, value."""
    checkpoints = CheckpointRow.__table__
    results = ResultRow.__table__
    kept = checkpoints.outerjoin(
        results,
        and_(
            results.c.trial_id == checkpoints.c.trial_id,
            results.c.iteration == checkpoints.c.iteration,
        ),
    )
    if trial_ids is None:
        trials = TrialRow.__table__
        kept = kept.join(trials, trials.c.trial_id == checkpoints.c.trial_id)
        which = trials.c.experiment_run_id == experiment_run_id
    else:
        which = checkpoints.c.trial_id.in_(list(trial_ids))
    # The value is computed once per checkpoint here: the windows of checkpoint_paths would each
    # extract it from the result's JSON again (SQLite parses the JSON text on every call).
    return (
        select(
            checkpoints.c.trial_id,
            checkpoints.c.path,
            checkpoints.c.iteration,
            checkpoints.c.id,
            metric_value(results.c.metrics, metric, dialect_name).label("value"),
        )
        .select_from(kept)
        .where(checkpoints.c.deleted == false(), which)
        .subquery("valued_checkpoints")
    )


#: ``at_trials``' columns of a maintained best: (value, the first iteration that reached it).
MaintainedBest = tuple[ColumnElement[Any], ColumnElement[Any]]


def best_leaderboard_query(
    experiment_run_id: int, mode: str, limit: int | None, best: MaintainedBest
) -> Select[Any]:
    """The leaderboard from each trial's maintained best (``best``, from
    :func:`maintained_best_columns`): no result read.

    Same columns and order as :func:`leaderboard_query`; valid when
    :func:`maintained_best_columns` gave ``best`` for the requested metric and mode.
    """
    trials = TrialRow.__table__
    value, iteration = best
    ordering = (value.asc() if mode == "min" else value.desc()).nulls_last()
    columns = (
        trials.c.trial_id,
        trials.c.status,
        trials.c.num_failures,
        _config_text(),
        value.label("best_value"),
        iteration.label("best_iteration"),
        trials.c.stop_kind,
    )
    of_run = trials.c.experiment_run_id == experiment_run_id
    if limit is None:
        return select(*columns).where(of_run).order_by(ordering, trials.c.trial_id)
    # The top trials by id first, from the index (run, ..., best_value, trial_id) alone for the
    # experiment's mode; only they are read whole (a top-N sort of whole rows read every row).
    top = (
        select(trials.c.trial_id)
        .where(of_run)
        .order_by(ordering, trials.c.trial_id)
        .limit(limit)
        .subquery("top")
    )
    return (
        select(*columns)
        .select_from(trials.join(top, top.c.trial_id == trials.c.trial_id))
        .order_by(ordering, trials.c.trial_id)
    )


def maintained_best_columns(
    session: Session, run: ExperimentRunRow, metric: str, mode: str
) -> MaintainedBest | None:
    """The ``at_trials`` columns that hold every trial's best of ``metric`` in ``mode`` and its
    iteration, when the run's trials keep them (:mod:`~airflow_trials.store.trial_best`): the
    metric is the experiment's, or one of its several, and every trial of the run with results
    has its bests kept for the experiment's metric and mode. ``best_value`` for the experiment's
    mode, ``other_mode_best_value`` for the other, the metric's entry of ``metric_bests`` with
    several metrics; None when they are not kept (the leaderboard then probes the results)."""
    experiment = session.get(ExperimentRow, run.experiment_id)
    if experiment is None:
        return None
    several, _ = decode_metrics(experiment.metric, experiment.mode)
    if isinstance(several, list) and metric in several:
        if not _kept_for(session, run, experiment.metric, None):
            return None
        bests = TrialRow.__table__.c.metric_bests
        if session.get_bind().dialect.name == "postgresql":
            # One key at a time: PostgreSQL's path literal would split a key with a comma.
            entry = bests[metric][mode]
            return entry[0].as_float(), entry[1].as_integer()
        return bests[(metric, mode, 0)].as_float(), bests[(metric, mode, 1)].as_integer()
    if experiment.metric != metric or experiment.mode not in MODES:
        return None
    if not _kept_for(session, run, metric, experiment.mode):
        return None
    trials = TrialRow.__table__
    if mode == experiment.mode:
        return trials.c.best_value, trials.c.best_iteration
    return trials.c.other_mode_best_value, trials.c.other_mode_best_iteration


def _kept_for(
    session: Session, run: ExperimentRunRow, metric: str | None, mode: str | None
) -> bool:
    """Has every trial of the run with results its bests kept for ``metric`` and ``mode`` (the
    experiment's, as ``at_experiments`` stores them)?"""
    trials = TrialRow.__table__
    of_run = trials.c.experiment_run_id == run.id
    every = kept = None
    if session.get_bind().dialect.name == "sqlite":
        # Two counts from indexes alone first: when every trial of the run has its bests kept
        # for this metric and mode, none can be stale, and no trial row is read. (PostgreSQL
        # counts from an index alone only where VACUUM marked the pages all-visible; its one
        # sequential scan below costs less than two index scans that read the rows.)
        every, kept = session.execute(
            select(
                select(func.count()).select_from(trials).where(of_run).scalar_subquery(),
                select(func.count())
                .select_from(trials)
                .where(
                    of_run,
                    trials.c.best_metric == metric,
                    trials.c.best_mode.is_(None) if mode is None else trials.c.best_mode == mode,
                )
                .scalar_subquery(),
            )
        ).one()
    stale = 0
    if every is None or every != kept:
        stale = session.execute(
            select(func.count())
            .select_from(trials)
            .where(
                of_run,
                trials.c.last_result.is_not(None),
                trials.c.best_metric.is_distinct_from(metric)
                | trials.c.best_mode.is_distinct_from(mode),
            )
        ).scalar_one()
    return not stale
