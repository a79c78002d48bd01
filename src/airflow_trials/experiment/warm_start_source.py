"""The warm start of one DAG run of an experiment: find the source run, rank its trials, seed this
run.

``suggest_configs`` calls :func:`warm_seeds` before it registers the run. What applies when:

* ``"previous"`` or ``"asset"`` with no source (the experiment's first run, or an Asset with no
  event yet): a warning in the task log and a cold start, or a failed run with
  ``WarmStart(if_missing="error")``.
* A run key that names no run, an Asset event naming a run that was deleted, or a source run with
  no finished trial: an error (the user asked for that run).
* A search space that tunes a parameter the source never had: an error. A source trial whose
  value lies outside the new space is skipped, with a warning; if all are: an error.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import Any

from airflow_trials.core.goal import Goal
from airflow_trials.core.warm_start import (
    ASSET,
    PREVIOUS,
    SourceTrial,
    WarmStart,
    WarmStartError,
    seed_configs,
)

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class WarmSeeds:
    """What a warm start gives a run: its first configs, where each came from, and (for a
    searcher) the source results it learns from first.

    :param run_key: the source run's key. :param experiment_run_id: its id in the trials DB.
    :param seeds: ``(config, source trial)`` in rank order.
    :param from_checkpoints: the seeds start from their source trial's best checkpoint.
    """

    run_key: str
    experiment_run_id: int
    seeds: list[tuple[dict[str, Any], SourceTrial]]
    from_checkpoints: bool

    def origin(self, trial: SourceTrial) -> dict[str, Any]:
        """What a seeded trial records of where it came from (its store row, its XCom)."""
        return {
            "run_key": self.run_key,
            "experiment_run_id": self.experiment_run_id,
            "trial_id": trial.trial_id,
            "value": trial.value,
            "checkpoint": trial.checkpoint if self.from_checkpoints else None,
        }

    def points(self) -> list[list[Any]]:
        """``[config, value]`` of each seed, for a searcher's history (Optuna's ``add_trial``),
        with its last result third when the seeds carry one (a searcher with constraints)."""
        return [
            [config, trial.value] + ([trial.result] if trial.result is not None else [])
            for config, trial in self.seeds
        ]

    def entry(self, index: int) -> dict[str, Any]:
        """The mapped arguments of this run's trial ``index`` (< len(seeds)) beyond its config."""
        config, trial = self.seeds[index]
        extra: dict[str, Any] = {"warm_start": self.origin(trial)}
        if self.from_checkpoints and trial.checkpoint:
            extra["restore_path"] = trial.checkpoint
        return extra


def warm_seeds(
    warm_start: WarmStart,
    store: Any,
    experiment_name: str,
    run_key: str,
    space: Mapping[str, Any],
    metric: str | list[str],
    mode: str | list[str],
    context: Mapping[str, Any],
    asset: Any,
    with_results: bool = False,
) -> WarmSeeds | None:
    """The seeds of run ``run_key`` from its source, or None for a cold start (after a warning);
    :class:`WarmStartError` when the source cannot be used (see the module's docstring).

    The source's finished trials that meet its constraints rank as its leaderboard ranks them: by
    the best value of one metric, or with several (lists) by Pareto rank over their last results,
    then by the first metric. ``with_results``: each seed also carries its last result, from which
    a searcher with constraints computes their values (a seed told by value alone would count as
    feasible).
    """
    source = _source_run(warm_start, store, experiment_name, run_key, context, asset)
    if source is None:
        return None
    ranked = (
        _pareto_ranked(store, source.id, metric, mode)
        if isinstance(metric, list) and isinstance(mode, list)
        else _ranked(store, source.id, str(metric), str(mode))
    )
    if not ranked:
        raise WarmStartError(
            f"run {source.run_key} of experiment {experiment_name} has no finished trial with "
            f"metric {metric!r} (that meets its constraints) to warm-start from; warm-start from "
            "another run, or drop warm_start"
        )
    if with_results:
        last = {
            t.trial_id: dict(t.last_result or {})
            for t in store.reader.list_trials(experiment_run_id=source.id)
        }
        ranked = [dataclasses.replace(t, result=last.get(t.trial_id, {})) for t in ranked]
    seeds, skipped = seed_configs(space, source.run_key, ranked, warm_start.top_k)
    for note in skipped:
        log.warning("Warm start skips %s.", note)
    log.info(
        "Warm start from run %s of experiment %s: its best %d trial(s) %s run first%s.",
        source.run_key,
        experiment_name,
        len(seeds),
        ", ".join(t.trial_id for _, t in seeds),
        " from their best checkpoints" if warm_start.from_checkpoints else "",
    )
    return WarmSeeds(source.run_key, source.id, seeds, warm_start.from_checkpoints)


def _ranked(store: Any, source_run_id: int, metric: str, mode: str) -> list[SourceTrial]:
    return [
        SourceTrial(row.trial_id, dict(row.config), row.value, row.best_checkpoint)
        for row in store.reader.board(source_run_id, Goal.of(metric, mode)).rows
        if row.counted and row.feasible is not False
    ]


def _pareto_ranked(
    store: Any, source_run_id: int, metrics: list[str], modes: list[str]
) -> list[SourceTrial]:
    return [
        SourceTrial(
            row.trial_id,
            dict(row.config),
            [row.values[name] for name in metrics],
            row.latest_checkpoint,
        )
        for row in store.reader.board(source_run_id, Goal.of(metrics, modes)).rows
        if row.counted and row.feasible is not False
    ]


def _source_run(
    warm_start: WarmStart,
    store: Any,
    experiment_name: str,
    run_key: str,
    context: Mapping[str, Any],
    asset: Any,
) -> Any:
    """The source run, taken only from the runs of ``warm_start.dag_id`` (default this run's own
    DAG): a run of the same experiment name on another DAG may be another team's, and its
    checkpoints are pickles, which run code when loaded."""
    own_dag = context["ti"].dag_id
    dag_id = warm_start.dag_id or own_dag
    every = [
        r
        for r in store.reader.list_experiment_runs(experiment_name)
        if (r.dag_id, r.run_key) != (own_dag, run_key)
    ]
    runs = [r for r in every if r.dag_id == dag_id]
    if warm_start.source == PREVIOUS:
        done = [r for r in runs if r.status.value == "SUCCESS"]
        if done:
            return max(done, key=lambda r: (r.created_at, r.id))
        return _missing(
            warm_start,
            f"experiment {experiment_name} has no earlier successful run of DAG {dag_id}",
        )
    if warm_start.source == ASSET:
        return _asset_run(warm_start, experiment_name, dag_id, every, context, asset)
    found = next((r for r in runs if r.run_key == warm_start.source), None)
    if found is None:
        known = ", ".join(r.run_key for r in runs[-5:]) or "none"
        raise WarmStartError(
            f"experiment {experiment_name} has no run {warm_start.source!r} of DAG {dag_id} to "
            f"warm-start from (latest runs: {known}); name one of its runs, 'previous' or "
            f"'asset', {_CROSS_DAG}"
        )
    return found


#: How a warm start takes another DAG's run, said in each refusal that may need it.
_CROSS_DAG = (
    "or name the source DAG with WarmStart(dag_id=...) to take another DAG's run (its "
    "checkpoints are code you load)"
)


def _asset_run(
    warm_start: WarmStart,
    experiment_name: str,
    dag_id: str,
    every: list[Any],
    context: Mapping[str, Any],
    asset: Any,
) -> Any:
    """The run the last event of the experiment's Asset names, when it is one of ``dag_id``'s."""
    events = list(context["inlet_events"][asset]) if "inlet_events" in context else []
    if not events:
        return _missing(warm_start, f"Asset {asset.name} has no event yet")
    extra = events[-1].extra or {}
    wanted = extra.get("experiment_run_id")
    found = next((r for r in every if r.id == wanted), None)
    if found is None:
        raise WarmStartError(
            f"the last event of Asset {asset.name} names run {extra.get('run_key', wanted)!r} "
            f"(id {wanted}) of "
            f"experiment {experiment_name}, which the trials DB no longer has (deleted); "
            "warm-start from "
            "'previous' or a run key, or drop warm_start"
        )
    if found.dag_id != dag_id:
        raise WarmStartError(
            f"the last event of Asset {asset.name} names run {found.run_key!r} (id {found.id}) "
            f"of experiment {experiment_name} on DAG {found.dag_id}, not on DAG {dag_id}; "
            f"warm-start from 'previous' or a run key of DAG {dag_id}, {_CROSS_DAG}"
        )
    return found


def _missing(warm_start: WarmStart, why: str) -> None:
    if warm_start.if_missing == "error":
        raise WarmStartError(f"{why} to warm-start from (WarmStart(if_missing='error'))")
    log.warning("Warm start: %s; this run starts cold.", why)
    return None
