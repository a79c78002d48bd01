"""An experiment's history across its runs: each run's best, trial counts, failures, stop kinds.

A nightly tuning DAG makes one run of its experiment per night; a year of it is 365 runs of, say,
1,000 trials. :func:`experiment_history` reads what a history page shows of every run with a fixed
set of aggregate queries grouped by run, each from the indexes of
:mod:`~airflow_trials.store.history_indexes`: trials per status, early-stopped and warm-started
trials, then the configs of the best trials. Each run's best trial is the one ``select_best``
picks (:mod:`~airflow_trials.store.run_best`: a trial that ended TERMINATED, feasible first; one
ranking read per run). A run that ended has its line stored (``at_experiment_runs.summary``,
:mod:`~airflow_trials.store.run_summaries`), so those reads cover only the runs without one.
:mod:`~airflow_trials.store.history_trend` reads only each run's best, for a chart.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from sqlalchemy import (
    Select,
    func,
    select,
    text,
)
from sqlalchemy.orm import Session, undefer

from airflow_trials.core.status import TrialStatus
from airflow_trials.store.history_indexes import STOPPED_EARLY_SQL, WARM_STARTED_SQL
from airflow_trials.store.mapping import experiment_run_record
from airflow_trials.store.models import ExperimentRunRow, ResultRow, TrialRow
from airflow_trials.store.records import ExperimentRecord, ExperimentRunRecord
from airflow_trials.store.run_best import run_best

_TRIALS = TrialRow.__table__
_RESULTS = ResultRow.__table__
_RUNS = ExperimentRunRow.__table__

#: The kinds of a trial's end a history counts, in the order they are shown.
STOP_KINDS = ("completed", "early_stopped", "errored", "unfinished")


@dataclass(frozen=True)
class WarmStartedFrom:
    """The earlier run a warm-started run took its first configs from.

    :param experiment_run_id: the source run's id; None when its trials did not record it.
    :param run_key: the source run's key, as its warm-started trials recorded it.
    """

    experiment_run_id: int | None
    run_key: str | None


@dataclass(frozen=True)
class RunHistory:
    """One run's line in its experiment's history.

    :param run: the run.
    :param num_trials: its trials.
    :param num_errored: its trials that ended ERROR.
    :param num_failed_tries: failed tries over all its trials (``num_failures`` summed).
    :param stop_kinds: trials per kind of end (:data:`STOP_KINDS`): ``completed`` (TERMINATED on
        their own or at ``max_t``), ``early_stopped`` (TERMINATED by their scheduler before their
        budget: stop kind ``scheduler``, :class:`~airflow_trials.core.stop_kind.StopKind`),
        ``errored``, ``unfinished`` (PENDING, RUNNING, PAUSED).
    :param best_value: the best value of the metric over its trials; None when none reported it.
    :param best_trial_id: the trial that reached it (ties: the lowest trial id); None with it.
    :param best_config: that trial's config; None with it.
    :param previous_run_id: the id of the closest earlier run with a best config, which
        ``changed_keys`` compares with; None when there is none.
    :param previous_best_config: that run's best config; None with it.
    :param changed_keys: the config keys whose value differs from that run's best config (keys
        added or removed too), sorted; empty when there is nothing to compare.
    :param warm_started_from: the run its warm-started trials came from; None when it was not
        warm-started.
    """

    run: ExperimentRunRecord
    num_trials: int
    num_errored: int
    num_failed_tries: int
    stop_kinds: dict[str, int]
    best_value: float | None
    best_trial_id: str | None
    best_config: dict[str, Any] | None
    previous_run_id: int | None = None
    previous_best_config: dict[str, Any] | None = None
    changed_keys: list[str] = field(default_factory=list)
    warm_started_from: WarmStartedFrom | None = None


@dataclass(frozen=True)
class ExperimentHistory:
    """An experiment's runs, oldest first, each with its best and counts.

    :param experiment: the experiment.
    :param metric: the metric each run's best is of; None when the experiment records none (then
        no run has a best).
    :param mode: ``"min"`` or ``"max"``; None with ``metric`` or when its mode is not recorded.
    :param several_metrics: the experiment ranks by several metrics at once; the bests are then
        of its first metric alone.
    :param runs: one :class:`RunHistory` per run, oldest first.
    """

    experiment: ExperimentRecord
    metric: str | None
    mode: str | None
    several_metrics: bool
    runs: list[RunHistory]


def history_goal(experiment: ExperimentRecord) -> tuple[str | None, str | None]:
    """The metric and mode a history ranks each run by: the experiment's, or with several
    metrics its first and that one's mode; (None, None) without a metric or a mode."""
    metrics, modes = experiment.metrics, experiment.modes
    if not metrics or modes[0] is None:
        return None, None
    return metrics[0], modes[0]


def run_counts_query(run_pks: Sequence[int]) -> Select[Any]:
    """Per run and status: run_pk, status, count, failed_tries (``num_failures`` summed). Read
    from the narrow ``ix_at_trials_run_status`` alone, in its order."""
    run, status = _TRIALS.c.experiment_run_id, _TRIALS.c.status
    return (
        select(
            run.label("run_pk"),
            status,
            func.count().label("count"),
            func.sum(_TRIALS.c.num_failures).label("failed_tries"),
        )
        .where(run.in_(run_pks))
        .group_by(run, status)
    )


def stopped_early_counts_query(run_pks: Sequence[int]) -> Select[Any]:
    """(run_pk, count) of the runs' trials their scheduler stopped early, from the partial index
    ``ix_at_trials_run_stopped_early``."""
    return (
        select(_TRIALS.c.experiment_run_id.label("run_pk"), func.count().label("count"))
        .where(_TRIALS.c.experiment_run_id.in_(run_pks), text(STOPPED_EARLY_SQL))
        .group_by(_TRIALS.c.experiment_run_id)
    )


def warm_started_query(run_pks: Sequence[int]) -> Select[Any]:
    """(run_pk, trial_id): one warm-started trial of each run that has any, from the partial
    index ``ix_at_trials_run_warm_started``."""
    return (
        select(
            _TRIALS.c.experiment_run_id.label("run_pk"),
            func.min(_TRIALS.c.trial_id).label("trial_id"),
        )
        .where(_TRIALS.c.experiment_run_id.in_(run_pks), text(WARM_STARTED_SQL))
        .group_by(_TRIALS.c.experiment_run_id)
    )


def experiment_history(
    session: Session, dialect_name: str, experiment: ExperimentRecord, last: int | None = None
) -> ExperimentHistory:
    """The experiment's runs (its ``last`` newest; all when None), oldest first, each with its
    best on the experiment's metric (the first of several), counts and stop kinds, its best
    config and the keys changed from the previous run's, and where it was warm-started from.

    An ended run's line is the one stored when it ended (:func:`line_from_summary`); the lines of
    the others (running, ended before migration 0013, or written to since) are computed by
    :func:`run_lines`, a fixed set of aggregate queries grouped by run, whatever their number.
    """
    if last is not None and last < 1:
        raise ValueError(f"last must be at least 1 or None, got {last}.")
    metric, mode = history_goal(experiment)
    # One run more than asked for, so the oldest one shown has a run to compare its config with.
    fetch = None if last is None else last + 1
    runs_query = (
        select(ExperimentRunRow)
        .options(undefer(ExperimentRunRow.summary))
        .where(ExperimentRunRow.experiment_id == experiment.id)
        .order_by(ExperimentRunRow.created_at.desc(), ExperimentRunRow.id.desc())
        .limit(fetch)
    )
    stored: dict[int, RunHistory] = {}
    runs = []
    for row in session.scalars(runs_query):
        run = experiment_run_record(row, experiment.name)
        runs.append(run)
        line = line_from_summary(run, row.summary, metric, mode)
        if line is not None:
            stored[run.id] = line
    runs.reverse()
    live = run_lines(session, dialect_name, [r for r in runs if r.id not in stored], metric, mode)
    lines = with_changes([stored.get(run.id) or live[run.id] for run in runs])
    if last is not None:
        lines = lines[-last:]
    return ExperimentHistory(
        experiment=experiment,
        metric=metric,
        mode=mode,
        several_metrics=experiment.several_metrics,
        runs=lines,
    )


def run_lines(
    session: Session,
    dialect_name: str,
    runs: Sequence[ExperimentRunRecord],
    metric: str | None,
    mode: str | None,
) -> dict[int, RunHistory]:
    """Each run's history line by its id, computed from its trials (without the keys changed from
    an earlier run, which :func:`experiment_history` adds): the one aggregation of a history,
    used both to read the runs without a stored line and to store a run's line when it ends.

    A fixed set of aggregate queries grouped by run, whatever the number of runs, each read from
    the history indexes (:mod:`~airflow_trials.store.history_indexes`): their counts and
    maintained bests; the trials whose best is not maintained (usually none); the best trials;
    the trials stopped early; the warm-started trials; the configs of the best and warm-started
    trials.
    """
    if not runs:
        return {}
    counts: dict[int, _Counts] = {}
    for run_pk, status, count, failed_tries in session.execute(
        run_counts_query([run.id for run in runs])
    ):
        counts.setdefault(run_pk, _Counts()).add(status, int(count), failed_tries)
    run_pks = list(counts)  # the runs with trials
    bests: dict[int, tuple[float, str]] = {}
    if metric is not None and mode is not None and run_pks:
        bests = run_bests(session, dialect_name, run_pks)
    early: dict[int, int] = {}
    warm_trials: dict[int, str] = {}
    if run_pks:
        early = {
            run_pk: int(count)
            for run_pk, count in session.execute(stopped_early_counts_query(run_pks))
        }
        warm_trials = {
            row.run_pk: row.trial_id for row in session.execute(warm_started_query(run_pks))
        }
    wanted = [trial_id for _, trial_id in bests.values() if trial_id is not None]
    wanted += list(warm_trials.values())
    details: dict[str, tuple[Any, Any]] = {}
    if wanted:
        rows = session.execute(
            select(_TRIALS.c.trial_id, _TRIALS.c.config, _TRIALS.c.warm_start).where(
                _TRIALS.c.trial_id.in_(wanted)
            )
        )
        details = {trial_id: (config, warm) for trial_id, config, warm in rows}
    return {
        run.id: _run_line(
            run,
            counts.get(run.id),
            bests.get(run.id),
            early.get(run.id, 0),
            details.get(warm_trials.get(run.id, ""), (None, None))[1],
            details,
        )
        for run in runs
    }


#: The shape of a stored line (``at_experiment_runs.summary``); a line of another is recomputed.
#: Still 1 although lines stored since issue 48 name select_best's best (store/run_best.py):
#: a new version would make every run ended before the upgrade computed live on each read (6
#: to 12 times slower, docs/benchmarks.md), and nothing stores a line again after its run ended.
SUMMARY_VERSION = 1


def summary_of_line(
    line: RunHistory, metric: str | None, mode: str | None
) -> dict[str, Any] | None:
    """The JSON stored of a run's line (:func:`run_lines`), with the metric and mode its best is
    of; None when it cannot be stored exactly (a best value that is not a finite number)."""
    if line.best_value is not None and not math.isfinite(line.best_value):
        return None
    warm = line.warm_started_from
    return {
        "version": SUMMARY_VERSION,
        "metric": metric,
        "mode": mode,
        "num_trials": line.num_trials,
        "num_errored": line.num_errored,
        "num_failed_tries": line.num_failed_tries,
        "stop_kinds": {kind: line.stop_kinds[kind] for kind in STOP_KINDS},
        "best_value": line.best_value,
        "best_trial_id": line.best_trial_id,
        "best_config": line.best_config,
        "warm_started_from": None
        if warm is None
        else {"experiment_run_id": warm.experiment_run_id, "run_key": warm.run_key},
    }


def line_from_summary(
    run: ExperimentRunRecord, summary: Any, metric: str | None, mode: str | None
) -> RunHistory | None:
    """The run's line as stored when it ended; None when it must be computed instead: the run
    is not ended, it has no stored line (or one of another shape), or the line's best is of
    another metric or mode than the history's (the experiment changed them since)."""
    summary = valid_summary(run, summary, metric, mode)
    if summary is None:
        return None
    warm = summary["warm_started_from"]
    best_value = summary["best_value"]
    return RunHistory(
        run=run,
        num_trials=summary["num_trials"],
        num_errored=summary["num_errored"],
        num_failed_tries=summary["num_failed_tries"],
        stop_kinds={kind: summary["stop_kinds"][kind] for kind in STOP_KINDS},
        best_value=None if best_value is None else float(best_value),
        best_trial_id=summary["best_trial_id"],
        best_config=summary["best_config"],
        warm_started_from=None
        if warm is None
        else WarmStartedFrom(warm["experiment_run_id"], warm["run_key"]),
    )


@dataclass
class _Counts:
    """A run's trials per status, added up from :func:`run_counts_query`'s rows."""

    num_trials: int = 0
    num_errored: int = 0
    num_terminated: int = 0
    num_failed_tries: int = 0

    def add(self, status: str, count: int, failed_tries: int | None) -> None:
        self.num_trials += count
        self.num_failed_tries += failed_tries or 0
        if status == TrialStatus.ERROR.value:
            self.num_errored += count
        elif status == TrialStatus.TERMINATED.value:
            self.num_terminated += count


def run_bests(
    session: Session, dialect_name: str, run_pks: Sequence[int]
) -> dict[int, tuple[float, str]]:
    """Each run's best value and trial, as ``select_best`` picks it
    (:func:`~airflow_trials.store.run_best.run_best`); runs without one left out."""
    bests: dict[int, tuple[float, str]] = {}
    for run_pk in run_pks:
        best = run_best(session, dialect_name, session.get_one(ExperimentRunRow, run_pk))
        if best is not None:
            bests[run_pk] = best
    return bests


def valid_summary(
    run: ExperimentRunRecord, summary: Any, metric: str | None, mode: str | None
) -> Mapping[str, Any] | None:
    """The run's stored line when the history may read it (see :func:`line_from_summary`)."""
    if not run.status.is_terminal() or not isinstance(summary, Mapping):
        return None
    if summary.get("version") != SUMMARY_VERSION:
        return None
    if (summary.get("metric"), summary.get("mode")) != (metric, mode):
        return None
    return summary


def _run_line(
    run: ExperimentRunRecord,
    row: _Counts | None,
    best: tuple[float, str] | None,
    early_stopped: int,
    warm: Any,
    details: Mapping[str, tuple[Any, Any]],
) -> RunHistory:
    if row is None:  # a run without trials
        return RunHistory(run, 0, 0, 0, dict.fromkeys(STOP_KINDS, 0), None, None, None)
    num_trials, errored, terminated = row.num_trials, row.num_errored, row.num_terminated
    best_value, best_trial = best if best is not None else (None, None)
    config = details.get(best_trial, (None, None))[0] if best_trial is not None else None
    return RunHistory(
        run=run,
        num_trials=num_trials,
        num_errored=errored,
        num_failed_tries=int(row.num_failed_tries),
        stop_kinds={
            "completed": terminated - early_stopped,
            "early_stopped": early_stopped,
            "errored": errored,
            "unfinished": num_trials - terminated - errored,
        },
        best_value=best_value,
        best_trial_id=best_trial,
        best_config=config if isinstance(config, dict) else None,
        warm_started_from=_warm_source(warm),
    )


def _warm_source(warm: Any) -> WarmStartedFrom | None:
    if not isinstance(warm, Mapping):
        return None
    run_pk = warm.get("experiment_run_id")
    run_key = warm.get("run_key")
    return WarmStartedFrom(
        experiment_run_id=run_pk if isinstance(run_pk, int) else None,
        run_key=str(run_key) if run_key is not None else None,
    )


def changed_config_keys(previous: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """The keys whose value differs between two configs, those in only one of them included."""
    return sorted(
        key
        for key in set(previous) | set(current)
        if key not in previous or key not in current or previous[key] != current[key]
    )


def with_changes(lines: Sequence[RunHistory]) -> list[RunHistory]:
    """Each line with the keys its best config changed from the closest earlier best config among
    ``lines`` alone (what an earlier pass set is replaced): a reader that drops lines (runs on
    DAGs a user may not read) calls it again, so that no line names a dropped run."""
    out = []
    previous: tuple[int, dict[str, Any]] | None = None
    for line in lines:
        config = line.best_config
        line = replace(line, previous_run_id=None, previous_best_config=None, changed_keys=[])
        if config is not None:
            if previous is not None:
                line = replace(
                    line,
                    previous_run_id=previous[0],
                    previous_best_config=previous[1],
                    changed_keys=changed_config_keys(previous[1], config),
                )
            previous = (line.run.id, config)
        out.append(line)
    return out


__all__ = [
    "STOP_KINDS",
    "ExperimentHistory",
    "RunHistory",
    "WarmStartedFrom",
    "changed_config_keys",
    "experiment_history",
    "history_goal",
    "line_from_summary",
    "run_bests",
    "run_lines",
    "summary_of_line",
    "valid_summary",
    "with_changes",
    "run_counts_query",
    "stopped_early_counts_query",
    "warm_started_query",
]
