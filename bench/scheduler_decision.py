"""Benchmark: the cost of one ASHA decision from the trials store (``SchedulerState.record_rung``
within ``TrialStore.record_progress``, as the triggerer writes it).

A run of N trials x R results under ASHA's defaults (grace_period 1, reduction_factor 4,
max_t R) keeps rung rows only at the milestones (1, 4, 16, 64 for R = 100): at most one per trial
and milestone, and since ASHA keeps the top 1/4 at each rung, about N * (1 + 1/4 + 1/16 + 1/64)
rows. The fixture bulk-loads exactly those rows, then times ``record_rung`` for new trials at the
lowest rung, the one holding N values already (the most a decision ever reads), and at the
highest. Target: <= 5 ms per decision at N = 10,000 on PostgreSQL.

The anchor, run on the same work in the same run: Optuna's own distributed pruning, a study on
``optuna.storages.RDBStorage`` on the same backend (a file next to ours in SQLite, a fresh schema
of its own on the same PostgreSQL server) with ``SuccessiveHalvingPruner(min_resource=1,
reduction_factor=4)``, Optuna's ASHA. It holds the same history: N finished trials with
intermediate values at the same milestones and the same values, and the pruner's
``completed_rung_<k>`` system attributes for each rung a trial reached (what the pruner compares
against). One decision is ``trial.report(value, step=milestone); trial.should_prune()`` for a new
trial from ``study.ask()`` (``ask`` is not timed; a trial decided at the highest milestone has
passed the lower rungs beforehand, untimed, so each figure is one rung's decision). Optuna reads
every trial of the study with all its attributes and values on each ``should_prune``, so its cost
grows with N (optuna issues #272, #3048); that is the design ``record_rung`` is measured against,
and each backend prints ``ours / optuna``, median over median. ``--no-optuna`` skips it; loading
its fixture (one transaction per trial through ``study.add_trials``) takes a while at N = 10,000.

    .venv/bin/python -m bench.scheduler_decision --postgres-url postgresql+psycopg://postgres@127.0.0.1:5432/test
    .venv/bin/python -m bench.scheduler_decision --trials 500      # a quick look; N=10,000 and
    R=100 by default

Without --postgres-url (or AIRFLOW_TRIALS_TEST_POSTGRES_URL) only SQLite runs. A fresh decision
commits a write, so the disk's flush time is part of every figure.

PostgreSQL runs in fresh schemas, ours and Optuna's (each dropped at the end, on error too), so any
database the user may write to works.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import tempfile
import time

import optuna
from sqlalchemy import insert

from airflow_trials.schedulers.asha.asha_rungs import AshaRungs
from airflow_trials.store import TrialStore
from airflow_trials.store.models import TrialRungRow, utcnow
from airflow_trials.store.scheduler_state import judge_alone
from bench.store_ingest import _register_trials, fresh_postgres_schema

TARGET_MS = 5.0
REDUCTION_FACTOR = 4


def fixture_values(num_trials: int, milestones: tuple[float, ...]) -> list[dict[float, float]]:
    """Per trial, its value at each milestone it reached; trial i reaches rung k when i % 4**k ==
    0."""
    rng = random.Random(0)
    return [
        {
            float(m): rng.gauss(0, 1)
            for k, m in enumerate(sorted(milestones))
            if i % REDUCTION_FACTOR**k == 0
        }
        for i in range(num_trials)
    ]


def summary(timings: list[float]) -> tuple[float, float]:
    """Median and p95 of ``timings``."""
    return statistics.median(timings), sorted(timings)[int(0.95 * (len(timings) - 1))]


def rung_rows(num_trials: int, milestones: tuple[float, ...]) -> int:
    """Rows a run of ``num_trials`` leaves: trial i reaches rung k when i % 4**k == 0."""
    lowest_first = sorted(milestones)
    return sum(
        1
        for i in range(num_trials)
        for k in range(len(lowest_first))
        if i % REDUCTION_FACTOR**k == 0
    )


def load_fixture(
    store: TrialStore, num_trials: int, milestones: tuple[float, ...], extra: int
) -> int:
    run = store.create_experiment_run("bench-asha", f"n{num_trials}")
    ids = [f"t{i}" for i in range(num_trials + extra)]
    _register_trials(store, run, ids)
    now = utcnow()
    rows = [
        {
            "experiment_run_id": run,
            "trial_id": f"t{i}",
            "bracket": 0,
            "milestone": milestone,
            "iteration": int(milestone),
            "value": value,
            "decision": "CONTINUE",
            "reason": None,
            "created_at": now,
        }
        for i, values in enumerate(fixture_values(num_trials, milestones))
        for milestone, value in values.items()
    ]
    with store._engine.begin() as connection:
        for start in range(0, len(rows), 5_000):
            connection.execute(insert(TrialRungRow), rows[start : start + 5_000])
    if store._engine.dialect.name == "postgresql":
        # What autovacuum does after a bulk insert (insert-triggered since PostgreSQL 13): without
        # the visibility map, an index-only count visits the heap for every one of the rung's rows.
        with store._engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
            connection.exec_driver_sql("VACUUM ANALYZE at_trial_rungs")
    return run


def time_decisions(
    store: TrialStore, run: int, rungs: AshaRungs, trial_ids: list[str], milestone: float
) -> list[float]:
    rng, timings = random.Random(1), []
    for trial_id in trial_ids:
        value = rng.gauss(0, 1)
        decide = rungs.decide(0, milestone, milestone, value)
        begin = time.perf_counter()
        # A decision as production writes it: within a record_progress of its trial.
        judge_alone(
            store,
            trial_id,
            lambda state, trial_id=trial_id, value=value, decide=decide: state.record_rung(
                run, trial_id, bracket=0, milestone=milestone, value=value, decide=decide
            ),
        )
        timings.append((time.perf_counter() - begin) * 1000)
    return timings


def run_backend(name: str, url: str, args: argparse.Namespace) -> dict[float, float]:
    """Time ``record_rung``; returns the median milliseconds per decision at each timed
    milestone."""
    rungs = AshaRungs(
        metric="loss",
        mode="min",
        max_t=args.results,
        grace_period=1,
        reduction_factor=REDUCTION_FACTOR,
    )
    milestones = rungs.milestones(0)
    store = TrialStore(url, create=True)
    try:
        begin = time.perf_counter()
        run = load_fixture(store, args.trials, milestones, args.decisions)
        print(
            f"[{name}] fixture: {args.trials:,} trials x {args.results} results -> "
            f"{rung_rows(args.trials, milestones):,} rung rows at milestones "
            f"{sorted(milestones)} (at most {args.trials * len(milestones):,}), loaded in "
            f"{time.perf_counter() - begin:.1f} s",
            flush=True,
        )
        extra = [f"t{i}" for i in range(args.trials, args.trials + args.decisions)]
        half = len(extra) // 2
        medians = {}
        for milestone, ids in ((min(milestones), extra[:half]), (max(milestones), extra[half:])):
            timings = time_decisions(store, run, rungs, ids, milestone)
            median, p95 = summary(timings)
            medians[milestone] = median
            print(
                f"[{name}] record_rung at milestone {milestone:g}: median {median:.2f} ms, p95 "
                f"{p95:.2f} ms "
                f"per decision over {len(ids)}  (target <= {TARGET_MS:.0f} ms, ratio "
                f"{median / TARGET_MS:.2f})",
                flush=True,
            )
        begin = time.perf_counter()
        for trial_id in extra[:half]:
            judge_alone(
                store,
                trial_id,
                lambda state, trial_id=trial_id: state.record_rung(
                    run, trial_id, bracket=0, milestone=min(milestones), value=0.0, decide=_never
                ),
            )
        print(
            f"[{name}] a repeat (stored verdict returned): "
            f"{(time.perf_counter() - begin) * 1000 / max(half, 1):.2f} ms per call",
            flush=True,
        )
        return medians
    finally:
        store.dispose()


def load_optuna_fixture(study: optuna.Study, num_trials: int, milestones: tuple[float, ...]) -> int:
    """Add the fixture's history as finished trials; returns how many intermediate values it
    holds."""
    history = fixture_values(num_trials, milestones)
    for start in range(0, num_trials, 1_000):
        study.add_trials(
            [
                optuna.trial.create_trial(
                    state=optuna.trial.TrialState.COMPLETE,
                    value=list(values.values())[-1],
                    intermediate_values={int(m): v for m, v in values.items()},
                    # What SuccessiveHalvingPruner records for each rung a trial reached and
                    # compares against.
                    system_attrs={f"completed_rung_{k}": v for k, v in enumerate(values.values())},
                )
                for values in history[start : start + 1_000]
            ]
        )
    return sum(len(values) for values in history)


def time_optuna_decisions(
    study: optuna.Study, milestones: tuple[float, ...], milestone: float, count: int
) -> list[float]:
    rng, timings = random.Random(1), []
    lower = [m for m in sorted(milestones) if m < milestone]
    for _ in range(count):
        value = rng.gauss(0, 1)
        trial = study.ask()
        for k, passed in enumerate(lower):
            # The trial has passed the lower rungs, so should_prune decides this rung only. The
            # pruner writes this same attribute itself; Optuna has no public setter for it.
            trial.report(value, step=int(passed))
            trial.storage.set_trial_system_attr(trial._trial_id, f"completed_rung_{k}", value)
        begin = time.perf_counter()
        trial.report(value, step=int(milestone))
        trial.should_prune()
        timings.append((time.perf_counter() - begin) * 1000)
    return timings


def run_optuna(name: str, url: str, args: argparse.Namespace, ours: dict[float, float]) -> None:
    """Time Optuna's RDB pruning on the same history, and print ``ours / optuna`` per milestone."""
    milestones = AshaRungs(
        metric="loss",
        mode="min",
        max_t=args.results,
        grace_period=1,
        reduction_factor=REDUCTION_FACTOR,
    ).milestones(0)
    storage = optuna.storages.RDBStorage(url)
    try:
        study = optuna.create_study(
            storage=storage,
            study_name=f"bench-asha-n{args.trials}",
            direction="minimize",
            sampler=optuna.samplers.RandomSampler(seed=0),
            pruner=optuna.pruners.SuccessiveHalvingPruner(
                min_resource=1, reduction_factor=REDUCTION_FACTOR
            ),
        )
        begin = time.perf_counter()
        values = load_optuna_fixture(study, args.trials, milestones)
        print(
            f"[{name}] optuna fixture: {args.trials:,} finished trials with {values:,} "
            "intermediate values "
            f"at milestones {sorted(milestones)} (study.add_trials), loaded in "
            f"{time.perf_counter() - begin:.1f} s",
            flush=True,
        )
        count = args.decisions // 2
        for milestone in (min(milestones), max(milestones)):
            median, p95 = summary(time_optuna_decisions(study, milestones, milestone, count))
            print(
                f"[{name}] optuna RDB SuccessiveHalvingPruner at milestone {milestone:g}: median "
                f"{median:.2f} ms, "
                f"p95 {p95:.2f} ms per decision over {count}  (ours / optuna = "
                f"{ours[milestone] / median:.3f})",
                flush=True,
            )
    finally:
        # Before the caller drops the schema: a pooled connection must not hold its tables.
        storage.remove_session()
        storage.engine.dispose()


def _never(values: object) -> object:
    raise AssertionError(
        "a repeated record_rung must return the stored verdict without deciding again"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--postgres-url", default=os.environ.get("AIRFLOW_TRIALS_TEST_POSTGRES_URL")
    )
    parser.add_argument("--trials", type=int, default=10_000, help="N, the trials of the run")
    parser.add_argument("--results", type=int, default=100, help="R, results per trial (max_t)")
    parser.add_argument(
        "--decisions", type=int, default=400, help="timed decisions, half at each end"
    )
    parser.add_argument("--skip-sqlite", action="store_true")
    parser.add_argument(
        "--no-optuna", action="store_true", help="skip the anchor, Optuna's RDB pruning"
    )
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # it logs every study it creates otherwise
    if not args.skip_sqlite:
        with tempfile.TemporaryDirectory(prefix="bench_rungs_") as tmp:
            ours = run_backend("sqlite", f"sqlite:///{os.path.join(tmp, 'trials.db')}", args)
            if not args.no_optuna:
                run_optuna("sqlite", f"sqlite:///{os.path.join(tmp, 'optuna.db')}", args, ours)
    if args.postgres_url:
        with fresh_postgres_schema(args.postgres_url) as url:
            ours = run_backend("postgresql", url, args)
        if not args.no_optuna:
            with fresh_postgres_schema(args.postgres_url) as url:
                run_optuna("postgresql", url, args, ours)
    else:
        print("[postgresql] skipped: pass --postgres-url or set AIRFLOW_TRIALS_TEST_POSTGRES_URL")


if __name__ == "__main__":
    main()
