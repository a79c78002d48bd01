"""The run page's view: one page of the run's board (the store's ranking read, through
:func:`~airflow_trials.plugins.web.reads.board`), the learning curves of its leaders, the Pareto
scatter of a run with several metrics, and the run's decisions, extensions and approvals."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from markupsafe import Markup

from airflow_trials.plugins.charts.curves import learning_curves_svg
from airflow_trials.plugins.charts.pareto_chart import pareto_svg
from airflow_trials.plugins.data.queries import DEFAULT_PAGE_SIZE, BoardPage
from airflow_trials.plugins.datamodels.runs import ParetoView
from airflow_trials.plugins.services.pareto_front import of_board
from airflow_trials.plugins.web import reads
from airflow_trials.plugins.web.render import Links, is_number
from airflow_trials.store import TrialReader
from airflow_trials.store.records import RunApprovalRecord, RunExtensionRecord
from airflow_trials.store.run_decisions import RunDecisionCounts


@dataclass(frozen=True)
class BoardQuery:
    """The run page's query: the ranking asked for, the page and the filter, the Pareto axes."""

    metric: str | None = None
    mode: str | None = None
    sort: str = "metric"
    order: str = "asc"
    page: int = 1
    page_size: int = DEFAULT_PAGE_SIZE
    stopped: str = "all"
    x: str | None = None
    y: str | None = None


@dataclass(frozen=True)
class RunPage:
    """What the run page shows (``templates/run.html``)."""

    board: BoardPage
    chart: Markup
    pareto: tuple[ParetoView, Markup] | None
    numeric_config_keys: set[str]
    board_url: Callable[..., str]
    decisions: RunDecisionCounts
    extensions: list[RunExtensionRecord]
    approvals: list[RunApprovalRecord]


def run_page_view(
    store: TrialReader, user: Any, links: Links, run_pk: int, query: BoardQuery
) -> RunPage:
    """The run page of ``run_pk`` for ``user`` (a 404 for a run the user may not read)."""
    q = query
    board = reads.board(
        store, user, run_pk, q.metric, q.mode, q.sort, q.order, q.page, q.page_size, q.stopped
    )
    run = board.run
    chart = learning_curves_svg(
        store.metric_curves(board.leaders, board.metric),
        metric=board.metric,
        best_trial_id=board.best_trial_id,
    )
    # With several metrics: the Pareto scatter (?x=&y= pick two; default the first two).
    pareto = None
    if board.metrics is not None and board.modes is not None:
        view = of_board(store, run, board.metrics, board.modes, q.x, q.y)
        pareto = view, Markup(pareto_svg(view))
    return RunPage(
        board=board,
        chart=Markup(chart),
        pareto=pareto,
        numeric_config_keys=numeric_config_keys(board),
        board_url=_board_url(links, run_pk, board, q),
        decisions=store.run_decision_counts(run.id),  # templates/run_decisions.html
        extensions=store.list_run_extensions(run.id),  # templates/run_extensions.html
        approvals=store.run_approvals(run.id),  # templates/run_approvals.html
    )


def numeric_config_keys(board: BoardPage) -> set[str]:
    """The config columns of numbers only (right-aligned, heading included)."""
    return {
        key
        for key in board.config_keys
        if all(is_number(row.config[key]) for row in board.rows if key in row.config)
    }


def _board_url(
    links: Links, run_pk: int, board: BoardPage, query: BoardQuery
) -> Callable[..., str]:
    """This page's URL with ``changes`` to its query (a value of None drops that parameter)."""

    def url(**changes: Any) -> str:
        kept = {
            "metric": query.metric,
            "mode": query.mode,
            "sort": board.sort,
            "order": "desc" if board.descending else "asc",
            "page_size": board.page_size if board.page_size != DEFAULT_PAGE_SIZE else None,
            "stopped": board.stopped if board.stopped != "all" else None,
        }
        kept.update(changes)
        return links.run(run_pk, **kept)

    return url
