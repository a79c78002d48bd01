"""The ranks of a page's trials in the run's ranking, counted in the index
``ix_at_trials_run_best`` (``(experiment_run_id, best_metric, best_mode, best_value, trial_id)``)
instead of numbered by a window function over every trial.

A trial's rank is one more than the number of the run's trials ranked before it. Taken in the
ranking's order (as the database orders them: its collation decides ties by trial id), the page's
trials cut the ranking into stretches, and each stretch is one range of the index: counting the
trials of every stretch, in one statement, gives every rank by a running sum. The database counts
index entries and sorts nothing: at 100,000 trials the window function sorted and numbered them
all for each page off the ranking's order (sorted by trial id or status, filtered).

This holds where the ranking is the index's order (:func:`index_served`): the experiment's
metric in its own mode, its bests maintained, no constraints. Every trial with a value then has
its bests kept in that prefix; a trial without one is either kept there too (its results have no
value of the metric) or not kept at all (no result yet: ``best_metric`` NULL). Where a trial is
neither (kept for another goal), :func:`count_ranks` says so and the page asks the window.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from sqlalchemy import ColumnElement, Select, Subquery, and_, func, not_, select

from airflow_trials.core.constraints import Constraints
from airflow_trials.store.leaderboard import MaintainedBest
from airflow_trials.store.models import TrialRow
from airflow_trials.store.records import RankedTrial


class Ranking(Protocol):
    """What these reads need of :class:`~airflow_trials.store.ranked_page.Ranking`."""

    @property
    def dialect(self) -> str: ...
    @property
    def run_pk(self) -> int: ...
    @property
    def metric(self) -> str: ...
    @property
    def mode(self) -> str: ...
    @property
    def maintained(self) -> MaintainedBest | None: ...
    @property
    def constraints(self) -> Constraints: ...

    def valued(
        self, *, extras: Sequence[str] = (), only: Sequence[str] | None = None
    ) -> Subquery: ...

    def order(self, valued: Subquery) -> list[ColumnElement[Any]]: ...


#: A trial's place in the ranking: (its best value, None for none; its trial id).
Key = tuple[float | None, str]


def index_served(ranking: Ranking) -> bool:
    """Whether the ranking is the order of ``ix_at_trials_run_best``: the maintained bests of the
    experiment's own mode (``best_value``, not ``other_mode_best_value``), no constraints."""
    maintained = ranking.maintained
    return (
        maintained is not None
        and not ranking.constraints
        and maintained[0] is TrialRow.__table__.c.best_value
    )


def kept_prefix(ranking: Ranking) -> list[ColumnElement[bool]]:
    """The index prefix of the run's trials whose bests are kept for the ranking's metric and
    mode: where the ranking's trials with a value all are."""
    return _prefix(ranking, True)


def _prefix(ranking: Ranking, kept: bool) -> list[ColumnElement[bool]]:
    """The index prefix of the run's trials whose bests are kept for the ranking's metric and mode
    (``kept``), or of those whose bests are not kept at all."""
    trials = TrialRow.__table__.c
    if kept:
        return [
            trials.experiment_run_id == ranking.run_pk,
            trials.best_metric == ranking.metric,
            trials.best_mode == ranking.mode,
        ]
    return [
        trials.experiment_run_id == ranking.run_pk,
        trials.best_metric.is_(None),
        trials.best_mode.is_(None),
        trials.best_value.is_(None),
    ]


def _from(key: Key | None, mode: str) -> list[ColumnElement[bool]]:
    """The trials with a value at or after ``key`` (None: the first) in the ranking's order."""
    if key is None:
        return [TrialRow.__table__.c.best_value.is_not(None)]
    value, trial_id = key
    trials = TrialRow.__table__.c
    bound = trials.best_value >= value if mode == "min" else trials.best_value <= value
    return [bound, not_(and_(trials.best_value == value, trials.trial_id < trial_id))]


def _before(key: Key, mode: str) -> list[ColumnElement[bool]]:
    """The trials with a value before ``key`` (which has one) in the ranking's order."""
    value, trial_id = key
    trials = TrialRow.__table__.c
    bound = trials.best_value <= value if mode == "min" else trials.best_value >= value
    return [bound, not_(and_(trials.best_value == value, trials.trial_id >= trial_id))]


def _stretch(ranking: Ranking, start: Key | None, end: Key) -> list[Any]:
    """Counts whose sum is the number of trials from ``start`` (included; None: the ranking's
    first) to ``end`` (excluded), each one range of the index."""
    mode = ranking.mode
    trials = TrialRow.__table__.c
    kept, not_kept = _prefix(ranking, True), _prefix(ranking, False)
    wheres: list[list[ColumnElement[bool]]] = []
    if end[0] is not None:  # both have a value (the trials without one come last)
        wheres.append([*kept, *_from(start, mode), *_before(end, mode)])
    else:
        if start is None or start[0] is not None:  # the rest of the trials with a value
            wheres.append([*kept, *_from(start, mode)])
        # The trials without a value, from start (or the first of them) to end, by trial id.
        ids = [trials.trial_id < end[1]]
        if start is not None and start[0] is None:
            ids.append(trials.trial_id >= start[1])
        wheres.append([*kept, trials.best_value.is_(None), *ids])
        wheres.append([*not_kept, *ids])
    return [select(func.count()).where(*where).scalar_subquery() for where in wheres]


def index_page_ids(connection: Any, ranking: Ranking, offset: int, limit: int) -> list[str]:
    """The ids of ``limit`` trials of the ranking from ``offset``, in its order, read in the
    index's order (where :func:`index_served` holds) rather than sorted: the trials with a value
    from the kept prefix, walked in order; past them, the trials without a value by trial id
    (sorted, but only those)."""
    trials = TrialRow.__table__.c
    value = trials.best_value
    scored = [*kept_prefix(ranking), value.is_not(None)]
    by_value = value.asc() if ranking.mode == "min" else value.desc()
    ids = list(
        connection.execute(
            select(trials.trial_id)
            .where(*scored)
            .order_by(by_value, trials.trial_id.asc())
            .limit(limit)
            .offset(offset)
        ).scalars()
    )
    if len(ids) == limit:
        return ids
    # Past the trials with a value: offset among those without one.
    if ids:
        past = 0
    else:
        past = offset - connection.execute(select(func.count()).where(*scored)).scalar_one()
    unscored = (
        select(trials.trial_id)
        .where(trials.experiment_run_id == ranking.run_pk, value.is_(None))
        .order_by(trials.trial_id.asc())
        .limit(limit - len(ids))
        .offset(past)
    )
    return ids + list(connection.execute(unscored).scalars())


def count_ranks(
    connection: Any, ranking: Ranking, trial_ids: Sequence[str], num_trials: int
) -> dict[str, int] | None:
    """The rank (1 = first) of each of ``trial_ids`` in the run's ranking, counted in the index;
    None when a trial of the run (``num_trials`` in all) is outside both prefixes the count reads
    (its bests kept for another goal): the caller then numbers them with the window function.
    Call only where :func:`index_served` holds."""
    valued = ranking.valued(only=trial_ids)
    ordered = [
        (row.best_value, row.trial_id)
        for row in connection.execute(
            select(valued.c.trial_id, valued.c.best_value).order_by(*ranking.order(valued))
        )
    ]
    counts: list[Any] = [
        select(func.count()).where(*_prefix(ranking, kept)).scalar_subquery()
        for kept in (True, False)
    ]
    widths = []
    for i, key in enumerate(ordered):
        stretch = _stretch(ranking, ordered[i - 1] if i else None, key)
        widths.append(len(stretch))
        counts += stretch
    found = list(connection.execute(select(*counts)).one())
    if found[0] + found[1] != num_trials:
        return None
    ranks: dict[str, int] = {}
    before, at = 0, 2
    for (_, trial_id), width in zip(ordered, widths, strict=True):
        before += sum(found[at : at + width])
        at += width
        ranks[trial_id] = before + 1
    return ranks


def ranks_query(ranking: Ranking, trial_ids: Sequence[str]) -> Select[Any]:
    """The rank (1 = first) of each of ``trial_ids`` in the whole ranking: a window function
    over the run's trials, narrow (id, value, feasibility)."""
    valued = ranking.valued()
    ranked = select(
        valued.c.trial_id,
        func.row_number().over(order_by=ranking.order(valued)).label("rank"),
    ).subquery("ranked")
    return select(ranked.c.trial_id, ranked.c.rank).where(ranked.c.trial_id.in_(list(trial_ids)))


def scored_count_query(ranking: Ranking) -> Select[Any]:
    """The run's trials with a best value."""
    valued = ranking.valued()
    return select(func.count()).select_from(valued).where(valued.c.best_value.is_not(None))


def page_ranks(
    connection: Any,
    ranking: Ranking,
    trials: list[RankedTrial],
    offset: int,
    *,
    in_rank_order: bool,
    reversed_by_metric: bool,
    num_trials: int,
) -> list[int]:
    """Each page row's rank in the whole ranking: from the page's offset when the page is in
    rank order; from the count of scored trials when it is the ranking reversed (by metric,
    descending, without constraints); else counted in the index where it serves the ranking
    (:mod:`~airflow_trials.store.page_ranks`), or from a window function over the run."""
    if in_rank_order:
        return list(range(offset + 1, offset + len(trials) + 1))
    if reversed_by_metric:
        # Scored trials ranked 1..S appear as S, S-1, ..., 1, then S+1, S+2, ...
        scored = connection.execute(scored_count_query(ranking)).scalar_one()
        positions = range(offset, offset + len(trials))
        return [scored - p if p < scored else p + 1 for p in positions]
    if not trials:
        return []
    ids = [t.trial_id for t in trials]
    found = None
    if index_served(ranking) and ranking.dialect == "sqlite":
        # PostgreSQL counts from an index alone only where VACUUM marked the pages all-visible;
        # else each entry counted reads its row, and the window over a scan costs less.
        found = count_ranks(connection, ranking, ids, num_trials)
    if found is None:
        found = {trial_id: rank for trial_id, rank in connection.execute(ranks_query(ranking, ids))}
    return [found[t.trial_id] for t in trials]
