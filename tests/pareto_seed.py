"""A run of an experiment with several metrics (max val_acc, min latency), written through
TrialStore as the operator writes it; the CLI's and the dashboard's tests read it back."""

from __future__ import annotations

import math
from dataclasses import dataclass

from sqlalchemy import update

from airflow_trials.core.end import TrialEnd
from airflow_trials.core.fate import Transition
from airflow_trials.core.pareto import encode_metrics
from airflow_trials.core.status import TrialStatus
from tests.factories import add_checkpoint, add_results

EXPERIMENT = "pareto_experiment"
RUN_KEY = "manual__2026-11-26"
METRICS = ["val_acc", "latency"]
MODES = ["max", "min"]

# Each trial's results, oldest first; only the last one places the trial.
HISTORIES: dict[str, list[dict[str, object]]] = {
    "p-0": [{"val_acc": 0.5, "latency": 60.0}, {"val_acc": 0.9, "latency": 30.0}],  # front
    "p-1": [{"val_acc": 0.8, "latency": 10.0}],  # front: fastest
    "p-2": [{"val_acc": 0.7, "latency": 40.0}],  # rank 1: p-0 and p-1 beat it
    "p-3": [{"val_acc": 0.9, "latency": 30.0}],  # front: equal to p-0, so neither beats it
    # Its best val_acc (0.99) is from an earlier result; its last is beaten by p-2: rank 2.
    "p-4": [{"val_acc": 0.99, "latency": 5.0}, {"val_acc": 0.6, "latency": 50.0}],
    "p-5": [{"val_acc": 0.95}],  # no latency: no rank
    "p-6": [{"val_acc": 0.95, "latency": math.nan}],  # NaN latency (stored as null): no rank
    "p-7": [],  # no result yet: no rank
    "p-8": [{"val_acc": "high", "latency": 1.0}],  # a string is not a value: no rank
}
# The order the leaderboard gives: rank 0 by val_acc (max) then trial id, rank 1, rank 2, then
# the trials without a rank by trial id.
ORDER = ["p-0", "p-3", "p-1", "p-2", "p-4", "p-5", "p-6", "p-7", "p-8"]
RANKS = {"p-0": 0, "p-3": 0, "p-1": 0, "p-2": 1, "p-4": 2}
FRONT = ["p-0", "p-1", "p-3"]


@dataclass(frozen=True)
class ParetoRun:
    url: str
    run: int


def register_metrics(store, experiment: str, metrics: list[str], modes: list[str]) -> None:
    """The experiment's row holding several metrics as the trials DB stores them (encode_metrics:
    one JSON string in ``metric``, ``mode`` NULL), written directly."""
    from airflow_trials.store.models import ExperimentRow

    store.ensure_experiment(experiment)
    metric, mode = encode_metrics(metrics, modes)
    with store._write_engine.begin() as connection:
        connection.execute(
            update(ExperimentRow)
            .where(ExperimentRow.name == experiment)
            .values(metric=metric, mode=mode)
        )


def seed_pareto(url: str) -> ParetoRun:
    """The experiment's run of :data:`HISTORIES` in the trials DB at ``url``."""
    from airflow_trials.store import TrialStore

    store = TrialStore(url, create=True)
    try:
        run = seed_pareto_store(store)
    finally:
        store.dispose()
    return ParetoRun(url=url, run=run)


def seed_pareto_store(store) -> int:
    """The experiment's run of :data:`HISTORIES`, written through ``store``; returns its id."""
    register_metrics(store, EXPERIMENT, METRICS, MODES)
    run = store.create_experiment_run(EXPERIMENT, RUN_KEY, dag_id="pareto", run_id=RUN_KEY)
    for i, (trial_id, history) in enumerate(HISTORIES.items()):
        store.upsert_trial(
            trial_id,
            trainable="pkg.train:fn",
            config={"width": 16 * (i + 1)},
            resources={"cpu": 1},
            max_failures=0,
            experiment_run_id=run,
            dag_id="pareto",
            run_id=RUN_KEY,
            task_id="trial",
            map_index=i,
        )
        if not history:
            continue
        store.record_transition(trial_id, Transition.PLACED)
        add_results(
            store,
            trial_id,
            [{"training_iteration": it, **r} for it, r in enumerate(history, start=1)],
        )
        last = len(history)
        add_checkpoint(store, trial_id, f"/ckpt/{trial_id}/{last}", last)
        store.record_end(TrialEnd(trial_id, EXPERIMENT, TrialStatus.TERMINATED))
    return run
