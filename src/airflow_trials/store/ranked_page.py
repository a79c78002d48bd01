"""One page of a run's ranking, in SQL: the page's ids by a narrow ORDER BY with LIMIT/OFFSET,
their rows by id, their ranks from the offset or a window function, the pager's total and the
run's status counts by COUNT; only the page's rows (and the chart's leaders) leave the database.

The ranking is the leaderboard's (:meth:`~airflow_trials.store.TrialReader.leaderboard`): trials
by best value of the metric (lowest for ``"min"``, highest for ``"max"``), those without one
last, ties by trial id; with the experiment's constraints, every feasible trial first
(:func:`~airflow_trials.store.feasibility.feasible_sql`). The best values are the maintained ones
when the run keeps them for the metric and mode
(:func:`~airflow_trials.store.leaderboard.maintained_best_columns`), else the leaderboard's probe
of the metric index per trial. A page then keeps, sorts and slices the ranked trials, each
keeping its rank in the whole ranking:

- ``sort="metric"``: the ranking; descending reverses the trials with a value, those without one
  stay last in ranking order;
- ``"trial_id"``: by trial id in code point order (``COLLATE "C"`` on PostgreSQL, as Python
  compares strings);
- ``"status"``: by status, then rank (both reversed when descending);
- ``"failures"``: by failures (reversed when descending), then rank.

``stopped="early"`` keeps the trials their scheduler stopped early
(stop kind ``scheduler``: :attr:`~airflow_trials.core.stop_kind.StopKind.early`),
``"not_early"`` the others.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from sqlalchemy import (
    ColumnElement,
    Select,
    Subquery,
    case,
    func,
    literal,
    or_,
    select,
)
from sqlalchemy.orm import Session

from airflow_trials.core.constraints import COUNTED_STATUSES, Constraints, is_counted
from airflow_trials.core.stop_kind import StopKind
from airflow_trials.store.feasibility import feasible_sql, judge, judged_join, judged_value
from airflow_trials.store.leaderboard import MaintainedBest, best_source
from airflow_trials.store.mapping import trial_status
from airflow_trials.store.models import TrialRow
from airflow_trials.store.page_ranks import (
    index_page_ids,
    index_served,
    kept_prefix,
    page_ranks,
)
from airflow_trials.store.records import RankedTrial

#: What a page may be sorted by.
PAGE_SORTS = ("metric", "trial_id", "status", "failures")
#: A page's ``stopped`` filter: every trial, those their scheduler stopped early, the others.
STOPPED_FILTERS = ("all", "early", "not_early")


@dataclass(frozen=True)
class RankedPage:
    """One page of a run's ranking (:meth:`~airflow_trials.store.TrialReader.ranked_page`).

    :param rows: the page's trials in the page's order, each with its rank in the whole
        ranking (1 = best), whatever the filter and sort.
    :param total: the trials the filter keeps.
    :param status_counts: the run's trials per status, whatever the filter.
    :param leaders: the ids of the first ``leaders`` trials of the ranking that have a value,
        best first.
    :param best_trial_id: the first trial of the ranking with a value that ended TERMINATED (the
        trial ``select_best`` picks: :func:`best_query`); None when there is none.
    :param front_trial_ids: when asked for (``front=True``), the run's front, sorted: the trials
        that count sharing the best trial's value and feasibility (:func:`front_query`, the
        board's Pareto rank 0 with one metric); default empty.
    """

    rows: list[tuple[int, RankedTrial]]
    total: int
    status_counts: dict[str, int] = field(default_factory=dict)
    leaders: list[str] = field(default_factory=list)
    best_trial_id: str | None = None
    front_trial_ids: list[str] = field(default_factory=list)

    @property
    def num_trials(self) -> int:
        """The run's trials, whatever the filter."""
        return sum(self.status_counts.values())


def check_page_order(sort: str, stopped: str) -> None:
    """Raise ValueError naming the accepted values when ``sort`` or ``stopped`` is unknown."""
    if sort not in PAGE_SORTS:
        raise ValueError(
            f"Cannot sort the leaderboard by {sort!r}; use one of {', '.join(PAGE_SORTS)}."
        )
    if stopped not in STOPPED_FILTERS:
        raise ValueError(
            f"Cannot filter the leaderboard by stopped={stopped!r}; use one of "
            f"{', '.join(STOPPED_FILTERS)}."
        )


def _valued_trials(
    dialect: str,
    run_pk: int,
    metric: str,
    mode: str,
    maintained: MaintainedBest | None,
    constraints: Constraints,
    *,
    extras: Sequence[str] = (),
    only: Sequence[str] | None = None,
) -> Subquery:
    """Every trial of the run with its best value (only those of ``only`` when given):
    trial_id, best_value, feasible (1 or 0; 1 without constraints), and the ``extras`` among
    status, num_failures, stop_kind, best_iteration and the constrained metrics' values in its
    judged result (``"constrained"``: ``c_0``...; :mod:`~airflow_trials.store.feasibility`)."""
    trials = TrialRow.__table__
    source, value, iteration = best_source(dialect, run_pk, metric, mode, maintained)
    feasible = None
    if constraints:
        # Judged on the result whose value is ranked (store/feasibility.py).
        source = judged_join(source, iteration)
        feasible = feasible_sql(dialect, constraints, iteration)
    selected: list[Any] = [
        trials.c.trial_id,
        value.label("best_value"),
        (feasible if feasible is not None else literal(1)).label("feasible"),
    ]
    by_name: dict[str, list[Any]] = {
        "status": [trials.c.status],
        "num_failures": [trials.c.num_failures],
        "stop_kind": [trials.c.stop_kind],
        "best_iteration": [iteration.label("best_iteration")],
        "constrained": [
            judged_value(dialect, iteration, name).label(f"c_{i}")
            for i, name in enumerate(constraints.metrics)
        ],
    }
    for extra in extras:
        selected += by_name[extra]
    query = select(*selected).select_from(source).where(trials.c.experiment_run_id == run_pk)
    if only is not None:
        query = query.where(trials.c.trial_id.in_(list(only)))
    return query.subquery("valued")


def _ranking_order(
    valued: Subquery, mode: str, constrained: bool, *, reverse: bool = False
) -> list[ColumnElement[Any]]:
    """The ranking's ORDER BY over ``valued``: feasible first (with constraints), best value in
    ``mode`` with the trials without one last, trial id; ``reverse`` turns all of it around."""
    value = valued.c.best_value
    forward = (value.asc() if mode == "min" else value.desc()).nulls_last()
    backward = (value.desc() if mode == "min" else value.asc()).nulls_first()
    order: list[ColumnElement[Any]] = [
        backward if reverse else forward,
        valued.c.trial_id.desc() if reverse else valued.c.trial_id.asc(),
    ]
    if constrained:
        order.insert(0, valued.c.feasible.asc() if reverse else valued.c.feasible.desc())
    return order


def _by_code_point(column: ColumnElement[str], dialect: str) -> ColumnElement[str]:
    # PostgreSQL's default collation (e.g. en_US.UTF-8) ignores punctuation at first; Python and
    # SQLite's BINARY compare code points, as "C" does.
    return column.collate("C") if dialect == "postgresql" else column


def _page_order(
    valued: Subquery,
    mode: str,
    constrained: bool,
    sort: str,
    descending: bool,
    dialect: str,
) -> list[ColumnElement[Any]]:
    """The page's ORDER BY over ``valued``; where the rank breaks ties, the ranking's own order
    does (the same order, without computing a rank)."""
    ranking = _ranking_order(valued, mode, constrained)
    if sort == "metric":
        if not descending:
            return ranking
        # The trials with a value in reverse, then those without one in the ranking's order.
        unscored = valued.c.best_value.is_(None)
        feasible = valued.c.feasible
        reverse = _ranking_order(valued, mode, constrained=False, reverse=True)
        return [
            case((unscored, 1), else_=0),
            case((unscored, -feasible), else_=feasible),
            reverse[0],
            case((unscored, valued.c.trial_id)),
            reverse[1],
        ]
    if sort == "trial_id":
        trial_id = _by_code_point(valued.c.trial_id, dialect)
        return [trial_id.desc() if descending else trial_id.asc()]
    if sort == "status":
        status = _by_code_point(valued.c.status, dialect)
        if descending:
            return [status.desc(), *_ranking_order(valued, mode, constrained, reverse=True)]
        return [status.asc(), *ranking]
    failures = valued.c.num_failures
    return [failures.desc() if descending else failures.asc(), *ranking]


def _stopped_clause(stop_kind: Any, stopped: str) -> Any:
    """The filter's WHERE on a ``stop_kind`` column; None for ``"all"``."""
    if stopped == "all":
        return None
    early = StopKind.SCHEDULER.value
    return (
        stop_kind == early if stopped == "early" else or_(stop_kind.is_(None), stop_kind != early)
    )


@dataclass(frozen=True)
class Ranking:
    """What identifies a run's ranking: the arguments of :func:`_valued_trials`."""

    dialect: str
    run_pk: int
    metric: str
    mode: str
    maintained: MaintainedBest | None
    constraints: Constraints

    def valued(self, *, extras: Sequence[str] = (), only: Sequence[str] | None = None) -> Subquery:
        return _valued_trials(
            self.dialect,
            self.run_pk,
            self.metric,
            self.mode,
            self.maintained,
            self.constraints,
            extras=extras,
            only=only,
        )

    def order(self, valued: Subquery) -> list[ColumnElement[Any]]:
        return _ranking_order(valued, self.mode, bool(self.constraints))


#: Every column of a page's row (:func:`_valued_trials`).
ROW_COLUMNS = ("status", "num_failures", "stop_kind", "best_iteration", "constrained")


def page_query(
    ranking: Ranking, *, sort: str, descending: bool, stopped: str, offset: int, limit: int
) -> Select[Any]:
    """The ids of the page's trials: those the ``stopped`` filter keeps, in the page's order,
    ``limit`` of them from ``offset``. Narrow (the sort's and the filter's columns only): by
    metric or id, from the index ``(run, ..., best_value, trial_id)`` alone, without reading a
    trial's row. No rank: a window over every trial costs SQLite ten times the page's sort."""
    extras = {"status": ["status"], "failures": ["num_failures"]}.get(sort, [])
    if stopped != "all":
        extras.append("stop_kind")
    valued = ranking.valued(extras=extras)
    order = _page_order(
        valued, ranking.mode, bool(ranking.constraints), sort, descending, ranking.dialect
    )
    query = select(valued.c.trial_id).order_by(*order)
    if stopped != "all":
        query = query.where(_stopped_clause(valued.c.stop_kind, stopped))
    return query.limit(limit).offset(offset)


def rows_query(ranking: Ranking, trial_ids: Sequence[str]) -> Select[Any]:
    """The page's rows (every column of :func:`_valued_trials`) of ``trial_ids``, by id."""
    return select(ranking.valued(extras=ROW_COLUMNS, only=trial_ids))


def leaders_query(ranking: Ranking, count: int) -> Select[Any]:
    """The first ``count`` trials of the ranking with a value: trial_id, best_value, feasible,
    status; best first. Without constraints the trials with a value lead the ranking, so in
    the index's order (:func:`~airflow_trials.store.page_ranks.index_served`) they are its first
    entries: no sort. With constraints, the first ``count`` of the ranking, those without a
    value included (a feasible one without a value ranks before an infeasible one with)."""
    valued = ranking.valued(extras=("status",))
    columns = (valued.c.trial_id, valued.c.best_value, valued.c.feasible, valued.c.status)
    if ranking.constraints:
        return select(*columns).order_by(*ranking.order(valued)).limit(count)
    value = valued.c.best_value
    query = select(*columns).where(value.is_not(None))
    if index_served(ranking):  # the index's prefix, which holds every trial with a value
        trials = TrialRow.__table__.c
        value = trials.best_value
        query = select(trials.trial_id, value, literal(1), trials.status).where(
            *kept_prefix(ranking), value.is_not(None)
        )
    by_value = value.asc() if ranking.mode == "min" else value.desc()
    return query.order_by(by_value, query.selected_columns[0].asc()).limit(count)


def best_query(ranking: Ranking) -> Select[Any]:
    """The run's best trial (trial_id, best_value, feasible): the first of the ranking with a
    value whose status counts (:data:`~airflow_trials.core.constraints.COUNTED_STATUSES`), as
    ``select_best`` picks it."""
    valued = ranking.valued(extras=("status",))
    return (
        select(valued.c.trial_id, valued.c.best_value, valued.c.feasible)
        .where(valued.c.best_value.is_not(None), valued.c.status.in_(sorted(COUNTED_STATUSES)))
        .order_by(*ranking.order(valued))
        .limit(1)
    )


def front_query(ranking: Ranking, best_value: float, feasible: int) -> Select[Any]:
    """The ids of the run's front with one metric, unordered: the trials whose status counts
    that share the best trial's value and feasibility, as the board ranks them 0
    (:func:`~airflow_trials.store.board.one_board`: dense ranks by feasibility, then value)."""
    valued = ranking.valued(extras=("status",))
    return select(valued.c.trial_id).where(
        valued.c.best_value == best_value,
        valued.c.feasible == feasible,
        valued.c.status.in_(sorted(COUNTED_STATUSES)),
    )


def count_query(run_pk: int, stopped: str) -> Select[Any]:
    """The run's trials the ``stopped`` filter keeps."""
    trials = TrialRow.__table__
    query = select(func.count()).select_from(trials).where(trials.c.experiment_run_id == run_pk)
    kept = _stopped_clause(trials.c.stop_kind, stopped)
    return query if kept is None else query.where(kept)


def status_counts_query(run_pk: int) -> Select[Any]:
    """The run's trials per status (from the index ``ix_at_trials_run_status`` alone)."""
    trials = TrialRow.__table__
    return (
        select(trials.c.status, func.count())
        .where(trials.c.experiment_run_id == run_pk)
        .group_by(trials.c.status)
    )


def _ranked_trial(row: Any, constraints: Constraints) -> RankedTrial:
    """A page query's row; with constraints the trial is judged from its constrained values
    (:func:`~airflow_trials.store.feasibility.judge`), as the leaderboard judges it."""
    feasible = violations = None
    if constraints:
        values = [getattr(row, f"c_{i}") for i in range(len(constraints.metrics))]
        check = judge(constraints, constraints.metrics, values)
        feasible, violations = check.feasible, check.violations
    return RankedTrial(
        row.trial_id,
        trial_status(row.status),
        row.num_failures,
        row.best_value,
        row.best_iteration,
        feasible,
        violations,
        row.stop_kind,
    )


def ranked_page(
    session: Session,
    dialect: str,
    run_pk: int,
    metric: str,
    mode: str,
    maintained: MaintainedBest | None,
    constraints: Constraints,
    *,
    sort: str,
    descending: bool,
    stopped: str,
    offset: int,
    limit: int,
    leaders: int,
    front: bool = False,
) -> RankedPage:
    """The page, its total, the run's status counts and its leaders; with ``front``, the run's
    front too (one more query, over the trials with the best value). A page in the ranking's
    order (by metric, every trial) has its ranks from its offset, and page 1 gives the leaders;
    by metric descending without constraints, from the count of trials with a value. Any other
    page asks a window function for its rows' ranks."""
    connection = session.connection()
    ranking = Ranking(dialect, run_pk, metric, mode, maintained, constraints)
    order = {"sort": sort, "descending": descending, "stopped": stopped}
    trials = _page_trials(connection, ranking, _page_ids(connection, ranking, order, offset, limit))
    status_counts = {
        status: count for status, count in connection.execute(status_counts_query(run_pk))
    }
    every_trial = stopped == "all"
    total = (
        sum(status_counts.values())
        if every_trial
        else connection.execute(count_query(run_pk, stopped)).scalar_one()
    )
    in_rank_order = every_trial and sort == "metric" and not descending
    ranks = page_ranks(
        connection,
        ranking,
        trials,
        offset,
        in_rank_order=in_rank_order,
        reversed_by_metric=every_trial and sort == "metric" and not constraints,
        num_trials=sum(status_counts.values()),
    )
    from_page = in_rank_order and offset == 0 and (len(trials) >= leaders or len(trials) < limit)
    first = _first_trials(connection, ranking, trials if from_page else None, leaders)
    best_trial_id, front_ids = _best_and_front(connection, ranking, front, first)
    return RankedPage(
        rows=list(zip(ranks, trials, strict=True)),
        total=total,
        status_counts=status_counts,
        leaders=[t.trial_id for t in first[:leaders] if t.best_value is not None],
        best_trial_id=best_trial_id,
        front_trial_ids=front_ids,
    )


class _Leader(NamedTuple):
    """One of the first trials of the ranking."""

    trial_id: str
    best_value: float | None
    feasible: bool
    status: Any


def _first_trials(
    connection: Any, ranking: Ranking, page: list[RankedTrial] | None, leaders: int
) -> list[_Leader]:
    """The first trials of the ranking: the ``page``'s when it is the ranking's first page, else
    the first ``leaders`` read."""
    if page is not None:
        return [_Leader(t.trial_id, t.best_value, t.feasible is not False, t.status) for t in page]
    return [_Leader(*row) for row in connection.execute(leaders_query(ranking, leaders))]


def _best_and_front(
    connection: Any, ranking: Ranking, front: bool, first: list[_Leader]
) -> tuple[str | None, list[str]]:
    """The run's best trial (None when none counts): the first of ``first`` (the ranking's first
    trials) with a value that counts, else :func:`best_query`'s; with ``front`` its front,
    sorted."""
    top = next((t for t in first if t.best_value is not None and is_counted(t.status)), None)
    if top is None:
        row = connection.execute(best_query(ranking)).first()
        top = None if row is None else _Leader(row.trial_id, row.best_value, bool(row.feasible), "")
    if top is None or top.best_value is None or not front:
        return (None if top is None else top.trial_id), []
    query = front_query(ranking, top.best_value, int(top.feasible))
    # Sorted here: Python's code point order, whatever the database's collation.
    return top.trial_id, sorted(connection.execute(query).scalars())


def _page_ids(
    connection: Any, ranking: Ranking, order: dict[str, Any], offset: int, limit: int
) -> list[str]:
    """The ids of the page's trials (``order``: :func:`page_query`'s sort, descending and
    stopped): in the ranking's own order, read in the index's order where it serves
    (:func:`~airflow_trials.store.page_ranks.index_page_ids`); else :func:`page_query`'s."""
    in_rank_order = order == {"sort": "metric", "descending": False, "stopped": "all"}
    # On PostgreSQL an index walk reads the row of every entry it passes (unless VACUUM marked
    # the pages all-visible): the first page only, past no trial.
    walk = ranking.dialect == "sqlite" or offset == 0
    if in_rank_order and walk and index_served(ranking):
        return index_page_ids(connection, ranking, offset, limit)
    page = page_query(ranking, **order, offset=offset, limit=limit)
    return list(connection.execute(page).scalars())


def _page_trials(connection: Any, ranking: Ranking, page_ids: list[str]) -> list[RankedTrial]:
    """The rows of the page's trials alone, in a statement of their own (the page's sort then
    never carries whole rows, which past the first pages means every trial's), in page order."""
    if not page_ids:
        return []
    constraints = ranking.constraints
    rows = connection.execute(rows_query(ranking, page_ids))
    by_id = {row.trial_id: _ranked_trial(row, constraints) for row in rows}
    return [by_id[trial_id] for trial_id in page_ids]
