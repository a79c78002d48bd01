"""Runs whose schedulers really decided: ASHA, HyperBand and MOASHA judged by their rules in core/
over the trials store (as the trials' triggers judge them), and a PBT population whose exploits are
recorded as the runner's TrialsDbCallback records them. Shared by the run-decisions tests."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import insert

from airflow_trials.core.scheduler import Decision
from airflow_trials.schedulers.asha.asha_rungs import AshaRungs, MemoryRung, MemoryRungs
from airflow_trials.schedulers.asha.stored_rungs import StoredRungs, StoredVectorRungs
from airflow_trials.schedulers.moasha.moasha_scheduler import MOASHARungs
from airflow_trials.store import TrialStore
from airflow_trials.store.models import TrialRow, TrialRungRow, utcnow
from tests.scheduler_writes import OneWriteEach


@dataclass
class SeededRun:
    """A run and what its scheduler did, as the seeding saw it."""

    run: int
    trials: list[str]
    stopped: dict[str, str] = field(default_factory=dict)  # trial id -> its stop reason
    exploits: list[tuple[str, str, int]] = field(default_factory=list)  # (trial, donor, iteration)


class RecordedRungs(MemoryRungs):
    """The runner's rungs in memory, keeping each record as a row of ``at_trial_rungs`` for one
    bulk INSERT: the same rule and verdicts, without a transaction per verdict (a 1,000-trial run
    in seconds)."""

    def __init__(self, run: int) -> None:
        super().__init__()
        self.run = run
        self.rows: list[dict[str, Any]] = []

    def record(self, trial_id: str, *, bracket, milestone, value, iteration, at_end, decide):
        known = len(self.trial_rungs(trial_id))
        rung: MemoryRung = super().record(
            trial_id,
            bracket=bracket,
            milestone=milestone,
            value=value,
            iteration=iteration,
            at_end=at_end,
            decide=decide,
        )
        if len(self.trial_rungs(trial_id)) > known:  # a new record, not one judged before
            self.rows.append(
                {
                    "experiment_run_id": self.run,
                    "trial_id": trial_id,
                    "bracket": bracket,
                    "milestone": float(milestone),
                    "iteration": iteration,
                    "value": None if math.isnan(value) else value,
                    "decision": rung.decision.value,
                    "reason": rung.reason,
                    "at_end": at_end,
                    "created_at": utcnow(),
                }
            )
        return rung


def _config(index: int) -> dict[str, Any]:
    return {"lr": round(0.001 * (index % 17 + 1), 6), "width": 32 * (index % 4 + 1)}


def _run(
    store: TrialStore,
    name: str,
    metrics,
    modes,
    dag_id: str,
    count: int,
    prefix: str,
    bulk: bool = False,
):
    store.ensure_experiment(name, metric=metrics, mode=modes)
    run = store.create_experiment_run(name, f"{name}-r1", dag_id=dag_id, run_id=f"{name}-r1")
    trials = [f"{prefix}-{i:04d}" for i in range(count)]
    if bulk:  # one INSERT: upsert_trial one by one would take most of a 1,000-trial fixture
        now = utcnow()
        rows = [
            {
                "trial_id": trial_id,
                "experiment_run_id": run,
                "trainable": "pkg.train:fn",
                "config": _config(i),
                "resources": {"cpu": 1},
                "status": "TERMINATED",
                "num_failures": 0,
                "max_failures": 0,
                "dag_id": dag_id,
                "run_id": f"{name}-r1",
                "task_id": f"{name}.trial",
                "map_index": i,
                "created_at": now,
                "updated_at": now,
            }
            for i, trial_id in enumerate(trials)
        ]
        with store._engine.begin() as connection:
            connection.execute(insert(TrialRow), rows)
        return run, trials
    for i, trial_id in enumerate(trials):
        store.upsert_trial(
            trial_id,
            trainable="pkg.train:fn",
            config=_config(i),
            resources={"cpu": 1},
            max_failures=0,
            experiment_run_id=run,
            dag_id=dag_id,
            run_id=f"{name}-r1",
            task_id=f"{name}.trial",
            map_index=i,
        )
    return run, trials


def asha_run(
    store: TrialStore,
    name: str,
    count: int,
    *,
    brackets: int = 1,
    max_t: int = 27,
    dag_id: str = "tune_mnist",
    seed: int = 7,
    bulk: bool = False,
) -> SeededRun:
    """``count`` trials reporting loss (min) each iteration, round-robin as an asynchronous run
    interleaves them, judged by AshaRungs (grace 1, reduction factor 3) over the store's rungs;
    a stopped trial reports no more, and every trial's last result is recorded at its end.
    ``bulk``: the trials and the rung rows in one INSERT each (:class:`RecordedRungs`)."""
    rng = random.Random(seed)
    rungs = AshaRungs(
        metric="loss",
        mode="min",
        max_t=max_t,
        grace_period=1,
        reduction_factor=3,
        brackets=brackets,
    )
    run, trials = _run(store, name, "loss", "min", dag_id, count, name, bulk)
    state: Any = RecordedRungs(run) if bulk else StoredRungs(OneWriteEach(store), run)
    quality = {t: rng.uniform(0.0, 1.0) for t in trials}
    bracket = {t: rungs.draw_bracket(rng.random()) for t in trials}
    seeded = SeededRun(run, trials)
    running = list(trials)
    for iteration in range(1, max_t + 1):
        still = []
        for trial_id in running:
            loss = quality[trial_id] + 1.0 / iteration + rng.gauss(0, 0.05)
            decision, reason = rungs.judge(
                state, trial_id, bracket[trial_id], time=iteration, value=loss, iteration=iteration
            )
            if decision is Decision.STOP:
                rungs.judge(
                    state,
                    trial_id,
                    bracket[trial_id],
                    time=iteration,
                    value=loss,
                    iteration=iteration,
                    at_end=True,
                )
                seeded.stopped[trial_id] = str(reason)
            else:
                still.append(trial_id)
        running = still
    if bulk:
        with store._engine.begin() as connection:
            connection.execute(insert(TrialRungRow), state.rows)
    return seeded


def moasha_run(
    store: TrialStore, name: str, count: int, *, dag_id: str = "tune_mnist"
) -> SeededRun:
    """MOASHA (loss min, latency min; NaN now and then) over the store's vector rungs."""
    rng = random.Random(11)
    rule = MOASHARungs(metric=["loss", "latency"], mode=["min", "min"], max_t=9, grace_period=1)
    run, trials = _run(store, name, ["loss", "latency"], ["min", "min"], dag_id, count, name)
    state = StoredVectorRungs(OneWriteEach(store), run)
    seeded = SeededRun(run, trials)
    running = list(trials)
    for iteration in range(1, 10):
        still = []
        for i, trial_id in enumerate(running):
            loss = math.nan if (i + iteration) % 13 == 0 else rng.uniform(0, 1) + 1 / iteration
            values = (loss, rng.uniform(5, 50))
            decision, reason = rule.judge(
                state, trial_id, 0, time=iteration, values=values, iteration=iteration
            )
            if decision is Decision.STOP:
                seeded.stopped[trial_id] = str(reason)
            else:
                still.append(trial_id)
        running = still
    return seeded


def pbt_run(
    store: TrialStore,
    name: str,
    count: int,
    *,
    generations: int = 4,
    interval: int = 4,
    dag_id: str = "tune_mnist",
    seed: int = 3,
    bulk: bool = False,
) -> SeededRun:
    """A PBT population: every ``interval`` iterations its bottom quarter copies a trial of its
    top quarter (``record_exploit``, as TrialsDbCallback.on_trial_exploit records it) with lr
    explored by x0.8 or x1.2."""
    rng = random.Random(seed)
    run, trials = _run(store, name, "loss", "min", dag_id, count, name, bulk)
    config = {t: _config(i) for i, t in enumerate(trials)}
    seeded = SeededRun(run, trials)
    quarter = max(1, count // 4)
    for generation in range(1, generations + 1):
        iteration = generation * interval
        score = {t: abs(math.log10(config[t]["lr"]) + 2.5) + rng.gauss(0, 0.2) for t in trials}
        ranked = sorted(trials, key=lambda t: score[t])
        top, bottom = ranked[:quarter], ranked[-quarter:]
        for trial_id in bottom:
            donor = rng.choice(top[: max(1, quarter // 3)] if rng.random() < 0.7 else top)
            factor = rng.choice([0.8, 1.2])
            old = dict(config[trial_id])
            new = {**config[donor], "lr": round(config[donor]["lr"] * factor, 8)}
            store.record_exploit(
                trial_id,
                iteration=iteration,
                donor_trial_id=donor,
                donor_checkpoint=f"/ckpt/{donor}/checkpoint_{iteration:06d}",
                old_config=old,
                new_config=new,
                operations={"lr": f"{config[donor]['lr']:g} * {factor}"},
            )
            config[trial_id] = new
            seeded.exploits.append((trial_id, donor, iteration))
    return seeded
