"""What every ``airflow-trials`` command shares: the Typer apps, consoles, options and error
handling."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, TypeVar

import typer
from rich.console import Console
from rich.text import Text

from airflow_trials.cli.output import OutputFormat, printable, records_to

if TYPE_CHECKING:
    from airflow_trials.core.goal import Goal

app = typer.Typer(
    name="airflow-trials",
    help="Inspect and manage airflow_trials experiments (the trials DB, GPU pool, leaderboards, "
    "plots).",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
db_app = typer.Typer(help="The trials metadata database.", no_args_is_help=True)
pool_app = typer.Typer(help="The Airflow GPU pool.", no_args_is_help=True)
app.add_typer(db_app, name="db")
app.add_typer(pool_app, name="pool")


class _ValuesConsole(Console):
    """A console that prints values as they are: a string is never Rich markup (``[/x]`` in a
    config value is text, not a closing tag), and control characters are shown escaped
    (:func:`~airflow_trials.cli.output.printable`), never sent to the terminal. Every string
    printed, table cells and titles included, passes :meth:`render_str`."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(markup=False, **kwargs)

    def render_str(self, text: str, **kwargs: Any) -> Text:
        return super().render_str(printable(text), **kwargs)


out = _ValuesConsole()
err = _ValuesConsole(stderr=True)
#: The largest count an option takes (--last, --limit, --gpus): what every database's INTEGER
#: holds, so a larger one is a usage error that names the option, not an overflow in a query.
MAX_COUNT = 2**31 - 1
# Piped or redirected, a table is as wide as its content: ids, run keys and paths are never cut.
PIPED_WIDTH = 10_000

_T = TypeVar("_T")

# No envvar on either: AIRFLOW_TRIALS_DB_URL is one step of the resolution the DAGs use
# (airflow_trials.hooks.trials.resolve_trials_db_url), after the trials_default connection.
GlobalDbUrl = Annotated[
    str | None,
    typer.Option(
        "--db-url",
        help="Trials DB URL for every command (default: as the DAGs find it: the "
        "trials_default connection, else AIRFLOW_TRIALS_DB_URL, else the SQLite file).",
    ),
]
DbUrl = Annotated[
    str | None,
    typer.Option("--db-url", help="Trials DB URL; wins over one given before the command."),
]
AsJson = Annotated[bool, typer.Option("--json", help="Same as --output json.")]
Output = Annotated[
    OutputFormat | None,
    typer.Option(
        "--output",
        "-o",
        case_sensitive=False,
        help="table (default; piped, as wide as its content), plain (tab-separated, a header "
        "line), json or yaml.",
    ),
]
RunOption = Annotated[
    str,
    typer.Option(
        "--run", help="Experiment run: its id, its run key (Airflow run_id), or 'latest'."
    ),
]


class CliError(Exception):
    """A user mistake or an unavailable resource: printed as one line, exit code 1."""


def fail(message: str) -> NoReturn:
    """Print ``Error: message`` as one line on stderr and exit with code 1."""
    # A Text, not markup: a message may hold brackets ("[parameters: ...]") that Rich would eat.
    err.print(
        Text.assemble(("Error:", "red"), " ", printable(message)), highlight=False, soft_wrap=True
    )
    raise typer.Exit(1)


@app.callback()
def options(ctx: typer.Context, db_url: GlobalDbUrl = None) -> None:
    """Inspect and manage airflow_trials experiments (the trials DB, GPU pool, leaderboards,
    plots)."""
    ctx.obj = {"db_url": db_url}  # subcommands' contexts inherit obj
    out.width = None if out.is_terminal else PIPED_WIDTH  # type: ignore[assignment]  # None: the terminal's


@contextmanager
def stdout_for_records() -> Iterator[None]:
    """Within: stdout carries the command's records only. ``sys.stdout`` is stderr, so whatever
    Airflow logs (its log handler writes to ``sys.stdout`` as it is when Airflow configures
    logging, on its first import, which is inside a command: the secrets masker's warning about a
    short password, say), and whatever Alembic, MLflow or a ``print`` write there, goes to
    stderr; ``out`` and :func:`~airflow_trials.cli.output.records` write to the stdout the
    command was started with. ``-o json`` is then JSON, whatever is logged."""
    if _STDOUT_SWAPPED:  # already within
        yield
        return
    records_stream, previous_file = sys.stdout, out._file
    _STDOUT_SWAPPED.append(True)
    out.file = records_stream
    sys.stdout = sys.stderr
    try:
        with records_to(records_stream):
            yield
    finally:
        sys.stdout = records_stream
        out.file = previous_file  # type: ignore[assignment]  # None: sys.stdout, as before
        _STDOUT_SWAPPED.pop()


_STDOUT_SWAPPED: list[bool] = []


def guard(fn: Callable[[], _T]) -> _T:
    """Run a command body, its stdout for its records only (:func:`stdout_for_records`);
    expected errors become one readable line and exit code 1."""
    from airflow_trials.exceptions import AirflowTrialsError

    with stdout_for_records():
        try:
            return fn()
        except (CliError, AirflowTrialsError, ValueError, KeyError) as e:
            message = e.args[0] if isinstance(e, KeyError) and e.args else str(e)
            lines = str(message).strip().splitlines() or [type(e).__name__]
            fail(lines[0])


def output_format(output: OutputFormat | None, as_json: bool) -> OutputFormat:
    """The format asked for: ``--json`` is ``--output json``; both, they must agree."""
    if as_json and output not in (None, OutputFormat.JSON):
        raise CliError(
            f"--json and --output {output.value} ask for two formats; pass only one of them."
        )
    return OutputFormat.JSON if as_json else (output or OutputFormat.TABLE)


def resolve_run(store: Any, experiment: str, run: str) -> Any:
    """The experiment run ``run`` names: its id, its run key, or 'latest'
    (``TrialReader.resolve_run``)."""
    return store.resolve_run(experiment, run)


def recorded_metrics(store: Any, experiment: str) -> tuple[Any, Any]:
    """The experiment's metric and mode as recorded: one as strings; several as their lists of
    names and modes (:func:`~airflow_trials.core.pareto.decode_metrics`); None when not set."""
    from airflow_trials.core.pareto import decode_metrics

    record = next((e for e in store.list_experiments() if e.name == experiment), None)
    return decode_metrics(record.metric, record.mode) if record else (None, None)


def several_metrics(
    store: Any, experiment: str, metric: str | None, mode: str | None
) -> tuple[list[str], list[str]] | None:
    """The experiment's several metrics and their modes, when it records several and no
    ``--metric`` picks one of them; None otherwise (then :func:`metric_and_mode`)."""
    goal = recorded_goal(store, experiment)
    if metric or not goal.several:
        return None
    if mode is not None:
        raise CliError(
            f"--mode {mode} goes with --metric: experiment {experiment!r} ranks trials by "
            f"several metrics ({goal.describe()}) at once; pass --metric with one of them "
            "to rank by it alone, or leave out --mode."
        )
    return list(goal.metrics), [m or "min" for m in goal.modes]


def recorded_goal(store: Any, experiment: str) -> Goal:
    """The experiment's :class:`~airflow_trials.core.goal.Goal` as recorded (no metric when the
    experiment is not recorded)."""
    from airflow_trials.core.goal import Goal

    record = next((e for e in store.list_experiments() if e.name == experiment), None)
    return record.goal if record is not None else Goal((), ())


def metric_and_mode(
    store: Any, experiment: str, metric: str | None, mode: str | None
) -> tuple[str, str]:
    """The metric and mode given, else the experiment's. Of an experiment with several metrics,
    ``metric`` must name one; a metric of the experiment's gets its recorded mode unless
    ``--mode`` is given; any other metric needs ``--mode``
    (:meth:`~airflow_trials.core.goal.Goal.pick` raises the refusal)."""
    recorded = recorded_goal(store, experiment)
    if recorded.several and not metric:
        raise CliError(
            f"Experiment {experiment!r} ranks trials by several metrics "
            f"({recorded.describe()}); pass --metric with one of them."
        )
    goal = recorded.pick(metric, mode)
    if goal.metric is None:
        raise CliError(f"Experiment {experiment!r} has no metric recorded; pass --metric.")
    return goal.metric, goal.mode
