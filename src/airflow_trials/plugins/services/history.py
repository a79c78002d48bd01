"""An experiment's history across runs for the experiment page and its JSON endpoint: each run's
best, counts and stop kinds, a trend chart, best configs side by side with the changed keys,
warm-start links; only the runs on DAGs the user may read."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Query

from airflow_trials.exceptions import ExperimentNotFoundError
from airflow_trials.plugins.charts.trend import history_trend_svg
from airflow_trials.plugins.data.queries import NotFoundError
from airflow_trials.plugins.datamodels.experiments import (
    ExperimentOut,
    HistoryOut,
    HistoryRunOut,
    RunOut,
    WarmStartOut,
)
from airflow_trials.plugins.web import reads
from airflow_trials.plugins.web.params import checked_name
from airflow_trials.plugins.web.render import Links
from airflow_trials.store import TrialReader
from airflow_trials.store.run_history import (
    STOP_KINDS,
    ExperimentHistory,
    RunHistory,
    with_changes,
)

#: ``?last=N``: only the experiment's N newest runs; default all.
Last = Annotated[
    int | None, Query(ge=1, le=100_000, description="Only the N newest runs; default all.")
]

#: Runs in the experiment page's table without ``?last=`` (its chart shows every run).
TABLE_ROWS = 60

#: Labels of the stop kinds, as the page and the command show them.
STOP_KIND_LABELS = {
    "completed": "completed",
    "early_stopped": "early-stopped",
    "errored": "errored",
    "unfinished": "unfinished",
}


@dataclass(frozen=True)
class HistoryView:
    """What the experiment page shows: the experiment, its history and the chart's SVG text."""

    experiment: ExperimentOut
    history: HistoryOut
    chart: str
    num_runs: int


def readable_run_ids(store: TrialReader, user: Any, name: str) -> tuple[set[int], bool]:
    """The ids of the experiment's runs on DAGs the user may read, and whether that is all.

    :raises NotFoundError: no such experiment, or none of its runs is on a DAG the user may read
        (as the experiment page answers: its existence is not told).
    """
    checked_name("Experiment name", name)
    hidden = NotFoundError(
        f"Experiment {name} has no runs you may read in the trials store; pick one from the "
        f"experiments list."
    )
    try:
        store.get_experiment(name)
    except ExperimentNotFoundError as e:
        raise hidden from e
    runs = store.list_experiment_runs(name)
    readable = {run.id for run in reads.readable_runs(user, runs)}
    if not readable:
        raise hidden
    return readable, len(readable) == len(runs)


def history(
    store: TrialReader,
    user: Any,
    links: Links,
    name: str,
    last: int | None,
    access: tuple[set[int], bool] | None = None,
) -> tuple[ExperimentOut, HistoryOut]:
    """The experiment and its history over the runs the user may read (the ``last`` newest).

    :param access: :func:`readable_run_ids`, when the caller has it already.
    :raises NotFoundError: as :func:`readable_run_ids`.
    """
    readable, every_run = access or readable_run_ids(store, user, name)
    # Every run readable (the usual case): the store cuts to the last runs itself.
    found = store.experiment_history(name, last if every_run else None)
    record = found.experiment
    # Only the runs found readable (one may have started since, on a DAG the user may not
    # read); each line compares with the closest earlier run shown: never a hidden one.
    lines = [line for line in found.runs if line.run.id in readable]
    if len(lines) != len(found.runs):
        lines = with_changes(lines)
    if last is not None:
        lines = lines[-last:]
    out_runs = [_run_out(line, links, readable) for line in lines]
    experiment = ExperimentOut(
        name=record.name,
        metric=None if record.several_metrics else record.metric,
        mode=None if record.several_metrics else record.mode,
        metrics=record.metrics if record.several_metrics else None,
        modes=[m or "min" for m in record.modes] if record.several_metrics else None,
        constraints=record.constraint_spec,
        created_at=record.created_at,
        runs=[line.run for line in out_runs],
    )
    return experiment, HistoryOut(
        experiment=record.name,
        metric=found.metric,
        mode=found.mode,
        several_metrics=found.several_metrics,
        note=_note(found),
        runs=out_runs,
    )


def history_view(
    store: TrialReader, user: Any, links: Links, name: str, last: int | None
) -> HistoryView:
    """The experiment page's history: its table of the ``last`` newest runs (default the newest
    :data:`TABLE_ROWS`), and a trend chart of every run (or the ``last``), which reads only each
    run's best (``TrialReader.experiment_trend``: a seek per run)."""
    access = readable_run_ids(store, user, name)
    experiment, found = history(store, user, links, name, last or TABLE_ROWS, access)
    points = [
        (point.run.run_key, point.run.created_at, point.best_value)
        for point in store.experiment_trend(name)
        if point.run.id in access[0] and point.best_value is not None
    ]
    if last is not None:
        points = points[-last:]
    chart = ""
    if found.metric is not None and found.mode is not None:
        chart = history_trend_svg(
            points,
            metric=found.metric,
            mode=found.mode,
            title=f"{found.experiment}: best {found.metric} ({found.mode}) per run",
        )
    return HistoryView(experiment, found, chart, num_runs=len(access[0]))


def _note(found: ExperimentHistory) -> str | None:
    if found.metric is None:
        return (
            f"Experiment {found.experiment.name} records no metric with a mode, so no run has a "
            "best; the counts are all there is."
        )
    if found.several_metrics:
        metrics = ", ".join(found.experiment.metrics)
        return (
            f"Experiment {found.experiment.name} ranks by several metrics ({metrics}); each run's "
            f"best here is its best {found.metric} ({found.mode}) alone, the first of them."
        )
    return None


def _run_out(line: RunHistory, links: Links, readable: set[int]) -> HistoryRunOut:
    warm = line.warm_started_from
    warm_out = None
    if warm is not None:
        # A source the user may not read (another DAG's, or deleted) is not named.
        source = warm.experiment_run_id if warm.experiment_run_id in readable else None
        warm_out = WarmStartOut(
            experiment_run_id=source,
            run_key=warm.run_key if source is not None else None,
            url=links.run(source) if source is not None else None,
        )
    return HistoryRunOut(
        run=RunOut.of(line.run, line.num_trials, links.run(line.run.id)),
        best_value=line.best_value,
        best_trial_id=line.best_trial_id,
        best_config=line.best_config,
        previous_run_id=line.previous_run_id,
        previous_best_config=line.previous_best_config,
        changed_keys=line.changed_keys,
        num_trials=line.num_trials,
        num_errored=line.num_errored,
        num_failed_tries=line.num_failed_tries,
        stop_kinds={kind: line.stop_kinds[kind] for kind in STOP_KINDS},
        warm_started_from=warm_out,
        picked_trial_id=line.run.picked_trial_id,
    )


def config_rows(history: HistoryOut) -> list[dict[str, Any]]:
    """Per run (newest first), its best config next to the previous run's: one row per key of
    either, ``changed`` marked, for the page's comparison table."""
    keys_by_run: dict[int, str] = {line.run.id: line.run.run_key for line in history.runs}
    rows = []
    for line in reversed(history.runs):
        current = line.best_config or {}
        before = line.previous_best_config or {}
        rows.append(
            {
                "line": line,
                "previous_key": keys_by_run.get(line.previous_run_id or 0),
                "keys": [
                    {
                        "key": key,
                        "value": current.get(key, "—"),
                        # "" when there is nothing to compare; None: the key is new.
                        "before": before.get(key) if line.previous_best_config else "",
                        "changed": key in line.changed_keys,
                    }
                    for key in sorted(set(current) | set(before))
                ],
            }
        )
    return rows
