"""The run page's leaderboard ranked, filtered, sorted and sliced in SQL
(``TrialReader.ranked_page``, ``plugins/data/queries.py`` ``leaderboard_page``) gives the very pages
that ranking every trial in Python gave, on SQLite and PostgreSQL: NaN, inf, strings and ties,
errored trials and running ones without results, every sort, filter and page, both modes, the
maintained bests and the probe of the results, with and without constraints."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest
from sqlalchemy import text

from airflow_trials.core.fate import Transition
from airflow_trials.plugins.data.queries import get_experiment_run, leaderboard_page
from airflow_trials.store import TrialStore
from airflow_trials.store.records import RankedTrial
from tests.contract.conftest import new_postgres_schema
from tests.factories import add_results

ASHA = "stopped by ASHA at training_iteration=3 (rung 1 of 4): loss 0.41 above the cutoff 0.35"
MAX_T = "stopped by ASHA at training_iteration=9: it reached max_t=9"
# Per trial: its id (punctuation and case, which collations order differently), its loss per
# iteration (None: not reported), its status after the results, failures and stop reason.
TRIALS = [
    ("t-00", [0.9, 0.5, 0.7], "TERMINATED", 0, "its trainable finished"),
    ("t-01", [0.5], "TERMINATED", 0, ASHA),  # ties t-00's best
    ("t_02", [0.5, 0.5], "TERMINATED", 1, MAX_T),  # ties again, at two iterations
    ("t-03", [float("nan"), 0.8], "TERMINATED", 0, ASHA),  # NaN is not reported
    ("t-04", [float("inf")], "TERMINATED", 0, "it met its stopping criterion"),  # only inf
    ("t-05", [float("-inf"), 0.3], "ERROR", 2, None),  # errored after results
    ("t-06", [], "ERROR", 1, None),  # errored before any result
    ("t-07", [], "RUNNING", 0, None),  # running, no result yet
    ("t-08", [], "PENDING", 0, None),
    ("T-09", ["n/a", 0.2], "TERMINATED", 0, ""),  # a string is not reported
    ("t09", [True, 1.5], "TERMINATED", 3, ASHA),  # nor is a bool
    ("t-10", [0.2], "RUNNING", 0, None),  # ties T-09
    ("t.11", [None, 0.6], "PAUSED", 0, None),
    ("a-12", [0.05], "TERMINATED", 0, ASHA),
    ("z-13", [1.0, -3.0], "TERMINATED", 0, MAX_T),  # negative, the max mode's worst
]
# More trials so that a page size of 4 gives several pages in every filter.
TRIALS += [
    (f"m-{i:02d}", [round(0.05 * (i % 7), 2), 0.4], "TERMINATED", i % 3, ASHA if i % 2 else None)
    for i in range(14, 34)
]
PAGE_SIZE = 4
SORTS = ("metric", "trial_id", "status", "failures")
STOPPED = ("all", "early", "not_early")


def _seed(store: TrialStore, experiment: str, constraints: list[str] | None) -> int:
    store.ensure_experiment(experiment, metric="loss", mode="min", constraints=constraints)
    run = store.create_experiment_run(experiment, "r1", dag_id="d", run_id="r1")
    written = []
    for i, (trial_id, losses, status, failures, reason) in enumerate(TRIALS):
        trial = f"{experiment}/{trial_id}"
        store.upsert_trial(
            trial,
            trainable="pkg.train:fn",
            config={"lr": 0.1 / (i + 1)},
            resources={"cpu": 1},
            max_failures=5,
            experiment_run_id=run,
        )
        if status == "PENDING":
            continue
        store.record_transition(trial, Transition.PLACED)
        if losses:
            add_results(
                store,
                trial,
                [
                    {"training_iteration": it, "acc": 1 - 0.1 * i % 1, "size": i}
                    | ({} if loss is None else {"loss": loss})
                    for it, loss in enumerate(losses, start=1)
                ],
            )
        written.append({"t": trial, "s": status, "f": failures, "r": reason})
    # Statuses as a sweep leaves them (PAUSED included), set directly: only the ranking matters.
    with store._engine.begin() as connection:
        connection.execute(
            text(
                "UPDATE at_trials SET status = :s, num_failures = :f, stop_reason = :r "
                "WHERE trial_id = :t"
            ),
            written,
        )
    return run


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request, tmp_path) -> Iterator[TrialStore]:
    if request.param == "sqlite":
        found = TrialStore(f"sqlite:///{tmp_path / 'trials.db'}", create=True)
        yield found
        found.dispose()
        return
    with new_postgres_schema("at_page") as url:
        found = TrialStore(url, create=True)
        yield found
        found.dispose()


def _python_page(store, run, metric, mode, sort, descending, page, stopped, cache=None):
    """The page as plugins/data/queries.py made it before: the whole ranking in Python, filtered,
    sorted and sliced (ranks those of the whole ranking). ``cache`` (a dict) keeps each goal's
    ranking and the early-stopped trials between pages: the store does not change meanwhile."""
    cache = {} if cache is None else cache
    if (metric, mode) not in cache:
        cache[metric, mode] = store.reader.ranking(run, metric, mode)
    board = cache[metric, mode]
    ranked = list(enumerate(board, start=1))
    if stopped != "all":
        if "early" not in cache:
            cache["early"] = store.reader.early_stopped_trials(run)
        early = cache["early"]
        ranked = [item for item in ranked if (item[1].trial_id in early) is (stopped == "early")]
    total = len(ranked)
    if sort == "metric":
        if descending:
            scored = [item for item in ranked if item[1].best_value is not None]
            ranked = scored[::-1] + [item for item in ranked if item[1].best_value is None]
    elif sort == "trial_id":
        ranked = sorted(ranked, key=lambda item: item[1].trial_id, reverse=descending)
    elif sort == "status":
        ranked = sorted(
            ranked, key=lambda item: (item[1].status.value, item[0]), reverse=descending
        )
    else:
        ranked = sorted(
            ranked,
            key=lambda item: (item[1].num_failures, -item[0] if descending else item[0]),
            reverse=descending,
        )
    start = (page - 1) * PAGE_SIZE
    counts: dict[str, int] = {}
    for trial in board:
        counts[trial.status.value] = counts.get(trial.status.value, 0) + 1
    leaders = [t.trial_id for t in board[:20] if t.best_value is not None]
    best = board[0].trial_id if board and board[0].best_value is not None else None
    return ranked[start : start + PAGE_SIZE], total, counts, leaders, best, len(board)


def _sql_page(store, run, metric, mode, sort, descending, page, stopped):
    found = store.reader.ranked_page(
        run,
        metric,
        mode,
        sort=sort,
        descending=descending,
        stopped=stopped,
        offset=(page - 1) * PAGE_SIZE,
        limit=PAGE_SIZE,
    )
    return (
        found.rows,
        found.total,
        found.status_counts,
        found.leaders,
        found.best_trial_id,
        found.num_trials,
    )


@pytest.mark.parametrize("constraints", [None, ["size <= 20", "acc >= 0.05"]])
def test_every_page_is_the_python_ranking_s(store, constraints):
    experiment = "constrained" if constraints else "plain"
    run = _seed(store, experiment, constraints)
    pages = len(TRIALS) // PAGE_SIZE + 2  # and one past the end
    goals = [
        ("loss", "min"),  # the experiment's: maintained bests
        ("loss", "max"),  # the other mode's maintained bests
        ("acc", "max"),  # not the experiment's: the results probed
        ("acc", "min"),
    ]
    compared = 0
    python_rankings: dict = {}  # each goal's whole ranking, made once (the store is not written)
    for (metric, mode), sort, descending, stopped in itertools.product(
        goals, SORTS, (False, True), STOPPED
    ):
        for page in range(1, pages + 1):
            args = (store, run, metric, mode, sort, descending, page, stopped)
            assert _sql_page(*args) == _python_page(*args, cache=python_rankings), args
            compared += 1
    assert compared == 4 * 4 * 2 * 3 * pages
    board = store.reader.ranking(run, "loss", "min")
    # The fixture has what the comparison is about: ties, trials without a value, feasibility.
    values = [t.best_value for t in board if t.best_value is not None]
    assert len(values) > len(set(values)) and any(t.best_value is None for t in board)
    if constraints:
        assert {t.feasible for t in board} == {True, False}


def test_a_page_s_rows_are_ranked_trials_with_their_feasibility(store):
    run = _seed(store, "constrained", ["size <= 20"])
    found = store.reader.ranked_page(run, "loss", "min", sort="trial_id", limit=3)
    assert [(rank, trial.trial_id) for rank, trial in found.rows] == [
        (rank, trial.trial_id)
        for rank, trial in sorted(
            enumerate(store.reader.ranking(run, "loss", "min"), start=1),
            key=lambda item: item[1].trial_id,
        )[:3]
    ]
    [(_, first)] = found.rows[:1]
    assert isinstance(first, RankedTrial) and first.trial_id == "constrained/T-09"
    # size 9 <= 20: feasible; the violations say so with an empty dict.
    assert (first.feasible, first.violations) == (True, {})


def test_the_run_page_shows_the_sql_page(store):
    run_pk = _seed(store, "plain", None)
    run = get_experiment_run(store.reader, run_pk)
    page = leaderboard_page(
        store.reader, run, "loss", "min", sort="failures", descending=True, page=2, page_size=4
    )
    rows, total, counts, leaders, best, num_trials = _python_page(
        store, run_pk, "loss", "min", "failures", True, 2, "all"
    )
    assert [(row.rank, row.trial) for row in page.rows] == rows
    configs = store.reader.configs_of([trial.trial_id for _, trial in rows])
    assert [row.config for row in page.rows] == [configs[t.trial_id] for _, t in rows]
    assert (page.total, page.num_trials, page.status_counts) == (total, num_trials, counts)
    assert (page.leaders, page.best_trial_id) == (leaders, best) and best == "plain/z-13"


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"sort": "loss"}, "Cannot sort the leaderboard by 'loss'"),
        ({"stopped": "yes"}, "stopped='yes'; use one of all, early, not_early"),
        ({"offset": -1}, "offset must be >= 0"),
        ({"limit": 0}, "limit and leaders >= 1"),
    ],
)
def test_a_page_s_arguments_are_checked(store, arguments, message):
    run = _seed(store, "plain", None)
    with pytest.raises(ValueError, match=message):
        store.reader.ranked_page(run, "loss", "min", **arguments)


def _ranks(store, run, trial_ids, num_trials):
    """The ranks of ``trial_ids`` counted in the index and numbered by the window function."""
    from airflow_trials.store.feasibility import run_constraints
    from airflow_trials.store.leaderboard import maintained_best_columns
    from airflow_trials.store.models import ExperimentRunRow
    from airflow_trials.store.page_ranks import count_ranks, index_served, ranks_query
    from airflow_trials.store.ranked_page import Ranking

    with store._db.session_scope("rank a page", write=False) as session:
        row = session.get(ExperimentRunRow, run)
        maintained = maintained_best_columns(session, row, "loss", "min")
        ranking = Ranking(
            store._db.dialect, run, "loss", "min", maintained, run_constraints(session, row)
        )
        assert index_served(ranking)
        connection = session.connection()
        counted = count_ranks(connection, ranking, trial_ids, num_trials)
        windowed = dict(connection.execute(ranks_query(ranking, trial_ids)).all())
    return counted, windowed


def test_ranks_counted_in_the_index_are_the_window_s(store):
    # The experiment's metric in its mode, no constraints: the ranking is the index's order, so a
    # page off it (by trial id, by status) counts its ranks there (on SQLite; PostgreSQL keeps
    # the window, see store/page_ranks.py) instead of numbering every trial. Ties (t-00, t-01,
    # t_02 at 0.5), inf, and trials without a value both with their bests kept (results without
    # the metric) and not kept (no result yet).
    run = _seed(store, "plain", None)
    ids = [f"plain/{trial_id}" for trial_id, *_ in TRIALS]
    for size in (1, 4, 7, len(ids)):
        for start in range(0, len(ids), size):
            counted, windowed = _ranks(store, run, ids[start : start + size], len(ids))
            assert counted == windowed, (start, size)
    # A trial kept for another goal (no result, bests of another metric) is in neither range
    # the counts read: the page then asks the window, and still shows the Python ranking's.
    with store._engine.begin() as connection:
        connection.execute(
            text(
                "UPDATE at_trials SET best_metric = 'acc', best_mode = 'max' "
                "WHERE trial_id = 'plain/t-08'"
            )
        )
    counted, _ = _ranks(store, run, ids[:4], len(ids))
    assert counted is None
    args = (store, run, "loss", "min", "trial_id", True, 2, "all")
    assert _sql_page(*args) == _python_page(*args)
