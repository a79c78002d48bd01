"""How ``airflow-trials`` prints rows: ``--output table|plain|json|yaml``, as Airflow's own CLI
does."""

from __future__ import annotations

import enum
import json
import re
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, is_dataclass
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table


class OutputFormat(enum.StrEnum):
    """``--output``: Airflow's CLI formats (``airflow ... --output``)."""

    TABLE = "table"
    PLAIN = "plain"
    JSON = "json"
    YAML = "yaml"


def jsonable(value: Any) -> Any:
    """Records, enums and datetimes as plain JSON values (the same for JSON and YAML)."""
    if isinstance(value, enum.Enum):  # before str: a str Enum would reach YAML as an object
        return value.value
    if is_dataclass(value) and not isinstance(value, type):
        return {k: jsonable(v) for k, v in asdict(value).items()}
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return value


# The stream a command's records go to: stdout as the command found it. While a command body
# runs, sys.stdout itself is stderr (cli.common.stdout_for_records), so that whatever else writes
# there (Airflow's log handler, which writes to sys.stdout as it was when Airflow configured its
# logging, on its first import inside a command; Alembic; MLflow) reaches stderr, never the rows.
_records: list[TextIO] = []


def records() -> TextIO:
    """Where a command's records (rows, JSON, YAML) go: the stdout it was started with."""
    return _records[-1] if _records else sys.stdout


@contextmanager
def records_to(stream: TextIO) -> Iterator[None]:
    """Within: :func:`records` is ``stream``."""
    _records.append(stream)
    try:
        yield
    finally:
        _records.pop()


def print_document(document: Any, fmt: OutputFormat) -> None:
    """``document`` as JSON or YAML on stdout: the same values either way, no colours."""
    data = jsonable(document)
    if fmt is OutputFormat.YAML:
        import yaml

        text = yaml.safe_dump(data, sort_keys=True, default_flow_style=False, allow_unicode=True)
    else:
        text = json.dumps(data, indent=2, sort_keys=True) + "\n"
    records().write(text)


def print_plain(columns: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    """Tab-separated: a header line, then one line per row; no borders, nothing cut."""
    for line in (columns, *rows):
        records().write("\t".join(_plain_cell(cell) for cell in line) + "\n")


def _plain_cell(cell: str) -> str:
    # A tab or newline inside a value would split it into two columns or two rows.
    return printable(" ".join(str(cell).split("\n")).replace("\t", " "))


# Control characters, and the Unicode marks that reorder how a line reads (bidi overrides).
_UNPRINTABLE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def printable(text: str) -> str:
    """``text`` with each control character written out as an escape (``\\x1b``): a value from
    the trials DB (a config value, a run key) may hold terminal escapes, which would clear the
    screen or retitle the window if printed raw. Newlines and tabs stay."""
    return _UNPRINTABLE.sub(lambda m: ascii(m.group())[1:-1], text)


def make_table(
    columns: Sequence[str], rows: Sequence[Sequence[str]], title: str | None = None
) -> Table:
    """A Rich table whose cells fold rather than end in an ellipsis when the terminal is narrow."""
    from rich.table import Table

    table = Table(title=title)
    for column in columns:
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(*row)
    return table


def emit(
    console: Console,
    fmt: OutputFormat,
    document: Any,
    columns: Sequence[str],
    rows: Sequence[Sequence[str]],
    *,
    title: str | None = None,
    empty: str | None = None,
) -> None:
    """Print a listing: ``document`` as JSON or YAML, else ``rows`` as a table or plain lines.

    :param empty: said instead of an empty table (plain output keeps its header line, for scripts).
    """
    if fmt in (OutputFormat.JSON, OutputFormat.YAML):
        print_document(document, fmt)
    elif fmt is OutputFormat.PLAIN:
        print_plain(columns, rows)
    elif not rows and empty:
        console.print(empty, highlight=False, soft_wrap=True)
    else:
        console.print(make_table(columns, rows, title=title))


def leaderboard_cells(
    board: Sequence[Any], metric: str, mode: str
) -> tuple[list[str], list[list[str]]]:
    """Columns and rows of a leaderboard, configs flattened into columns; a ``feasible`` column
    when the experiment has constraints (its rows say whether they meet them)."""
    keys = sorted({k for r in board for k in (r.config or {})})
    judged = any(r.feasible is not None for r in board)
    columns = [
        "rank",
        "trial",
        *keys,
        "status",
        "failures",
        f"{mode} {metric}",
        *(["feasible"] if judged else []),
        "iteration",
        "best checkpoint",
    ]
    rows = [
        [
            str(rank),
            r.trial_id,
            *(_short((r.config or {}).get(k)) for k in keys),
            r.status.value,
            str(r.num_failures),
            number(r.best_value),
            *([yes_no(r.feasible)] if judged else []),
            "-" if r.best_iteration is None else str(r.best_iteration),
            r.best_checkpoint or "-",
        ]
        for rank, r in enumerate(board, start=1)
    ]
    return columns, rows


def pareto_cells(board: Any) -> tuple[list[str], list[list[str]]]:
    """Columns and rows of a leaderboard of several metrics (a ``ParetoBoard``): one column per
    metric, ``last <metric>``, its value in the trial's last result (the board places each trial
    by it; not its best, which a one-metric board's ``<mode> <metric>`` shows), the Pareto rank,
    and ``front`` marking the trials on the front; configs flattened into columns. With the
    experiment's constraints, a ``feasible`` column."""
    keys = sorted({k for r in board.rows for k in (r.config or {})})
    judged = bool(board.constraints)
    columns = [
        "rank",
        "trial",
        *keys,
        "status",
        "failures",
        *(f"last {metric}" for metric in board.metrics),
        *(["feasible"] if judged else []),
        "pareto rank",
        "front",
        "iteration",
        "latest checkpoint",
    ]
    rows = [
        [
            str(rank),
            r.trial_id,
            *(_short((r.config or {}).get(k)) for k in keys),
            r.status.value,
            str(r.num_failures),
            *(number(r.values[metric]) for metric in board.metrics),
            *([yes_no(r.feasible)] if judged else []),
            "-" if r.pareto_rank is None else str(r.pareto_rank),
            "yes" if r.on_front else "-",
            "-" if r.iteration is None else str(r.iteration),
            r.latest_checkpoint or "-",
        ]
        for rank, r in enumerate(board.rows, start=1)
    ]
    return columns, rows


def render_leaderboard(
    board: Sequence[Any], metric: str, mode: str, title: str | None = None
) -> Table:
    """A Rich table of leaderboard rows, configs flattened into columns."""
    return make_table(*leaderboard_cells(board, metric, mode), title=title)


def yes_no(flag: bool | None) -> str:
    return "-" if flag is None else ("yes" if flag else "no")


def number(value: float | None) -> str:
    return "-" if value is None else f"{value:.6g}"


def _short(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)
