"""Two runs whose best trial and front every screen must agree on, written through the store's
production write path (``record_progress``, then ``record_end``): one metric with a constraint,
and two metrics. Each holds a trial that ended in ERROR, one still RUNNING, and (one metric) a
trial whose best result breaks the constraint while its last result meets it."""

from __future__ import annotations

from dataclasses import dataclass

from airflow_trials.core.end import TrialEnd
from airflow_trials.core.fate import Transition
from airflow_trials.core.status import TrialStatus
from airflow_trials.core.stop_kind import StopKind
from airflow_trials.core.update import KeptCheckpoint, TrialUpdate

ONE = "one_best"
ONE_GOAL = {"metric": "loss", "mode": "min"}
CONSTRAINTS = ["latency <= 5.0"]
# trial -> (its status, its results oldest first)
ONE_RUNS: dict[str, tuple[TrialStatus, list[dict[str, float]]]] = {
    # Its best loss (0.1, iteration 2) breaks the constraint; its last result meets it.
    "o-0": (
        TrialStatus.TERMINATED,
        [
            {"loss": 0.5, "latency": 3.0},
            {"loss": 0.1, "latency": 9.0},
            {"loss": 0.4, "latency": 2.0},
        ],
    ),
    "o-1": (TrialStatus.TERMINATED, [{"loss": 0.3, "latency": 4.0}]),  # the best
    "o-2": (TrialStatus.ERROR, [{"loss": 0.05, "latency": 1.0}]),  # better, but failed
    "o-3": (TrialStatus.RUNNING, [{"loss": 0.2, "latency": 1.0}]),  # better, not ended
    "o-4": (TrialStatus.TERMINATED, [{"loss": 0.15, "latency": 8.0}]),  # infeasible
}
ONE_BEST = "o-1"

TWO = "two_best"
TWO_GOAL = {"metric": ["val_acc", "latency"], "mode": ["max", "min"]}
TWO_RUNS: dict[str, tuple[TrialStatus, list[dict[str, float]]]] = {
    "q-0": (TrialStatus.TERMINATED, [{"val_acc": 0.9, "latency": 30.0}]),
    "q-1": (TrialStatus.TERMINATED, [{"val_acc": 0.8, "latency": 10.0}]),
    "q-2": (TrialStatus.TERMINATED, [{"val_acc": 0.7, "latency": 40.0}]),  # rank 1
    "q-3": (TrialStatus.ERROR, [{"val_acc": 0.95, "latency": 5.0}]),  # beats all, but failed
    "q-4": (TrialStatus.RUNNING, [{"val_acc": 0.85, "latency": 8.0}]),  # beats q-1, not ended
}
TWO_FRONT = ["q-0", "q-1"]
# How the TERMINATED trials ended (the others have no stop kind): a scheduler stopped these early.
STOPPED_EARLY = {"o-4", "q-2"}
TWO_BEST = "q-0"  # no pick: the front's best val_acc
RUN_KEY = "run1"


@dataclass(frozen=True)
class SeededRun:
    experiment: str
    run: int
    suggested: list[dict[str, object]]


def seed_run(store, experiment: str, goal: dict, runs: dict, constraints=None) -> SeededRun:
    """The experiment's run of ``runs``, written as the operator and its poller write it."""
    store.ensure_experiment(experiment, **goal, constraints=constraints)
    run = store.create_experiment_run(experiment, RUN_KEY)
    for i, (trial_id, (status, results)) in enumerate(runs.items()):
        store.upsert_trial(
            trial_id,
            trainable="tests.trainables:counting",
            config={"x": i},
            resources={"cpu": 1},
            max_failures=0,
            experiment_run_id=run,
        )
        store.record_transition(trial_id, Transition.PLACED)
        store.record_progress(
            [
                TrialUpdate(
                    trial_id,
                    results=[
                        {"training_iteration": it, **r} for it, r in enumerate(results, start=1)
                    ],
                    kept_checkpoints=[
                        KeptCheckpoint(f"/ckpt/{trial_id}/{it}", it, None)
                        for it in range(1, len(results) + 1)
                    ],
                    status=TrialStatus.RUNNING,
                )
            ]
        )
        if status is TrialStatus.ERROR:
            store.record_transition(trial_id, Transition.ABANDONED, why="RuntimeError: diverged")
        elif status is TrialStatus.TERMINATED:
            kind = StopKind.SCHEDULER if trial_id in STOPPED_EARLY else StopKind.FINISHED
            store.record_end(TrialEnd(trial_id, experiment, status, stop_kind=kind))
    suggested = [{"trial_id": t, "experiment_run_id": run} for t in runs]
    return SeededRun(experiment, run, suggested)


def seed_one(store) -> SeededRun:
    return seed_run(store, ONE, ONE_GOAL, ONE_RUNS, CONSTRAINTS)


def seed_two(store) -> SeededRun:
    return seed_run(store, TWO, TWO_GOAL, TWO_RUNS)
