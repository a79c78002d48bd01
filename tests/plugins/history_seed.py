"""Nightly runs of one experiment for the history tests, written through TrialStore's API as the
operator and trigger write them; only the runs' dates are set afterwards (a test cannot wait for
nights to pass)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from sqlalchemy import update

from airflow_trials.core.end import TrialEnd
from airflow_trials.core.fate import CRITERION_MET, TRAINABLE_FINISHED, Transition
from airflow_trials.core.status import TrialStatus
from airflow_trials.core.stop_kind import StopKind
from airflow_trials.schedulers.asha.rung_math import REACHED_MAX_T
from airflow_trials.store.models import ExperimentRunRow
from tests.factories import add_results, update_trial

EXPERIMENT = "nightly"
DAG_ID = "tune_nightly"
FIRST_NIGHT = datetime(2026, 11, 1, 2, 0, tzinfo=UTC)
EARLY = "stopped by ASHA at training_iteration=2 (rung 1 of 3): loss {loss} is worse than {cut}"
AT_MAX_T = f"stopped by ASHA at training_iteration=4{REACHED_MAX_T}4"


@dataclass
class Night:
    """What one seeded run holds, to assert against."""

    run: int
    run_key: str
    best_value: float
    best_trial: str
    best_config: dict
    trials: int
    errored: int
    failed_tries: int
    early_stopped: int
    completed: int
    unfinished: int
    warm_from: int | None = None


@dataclass
class History:
    nights: list[Night] = field(default_factory=list)


# Per night: the best trial's config; night 2 changes lr, night 3 changes layers and adds a key.
BEST_CONFIGS = [
    {"lr": 0.01, "layers": 2},
    {"lr": 0.01, "layers": 2},
    {"lr": 0.003, "layers": 2},
    {"lr": 0.003, "layers": 4, "dropout": 0.1},
]
BEST_VALUES = [0.5, 0.42, 0.45, 0.31]


def seed_nightly(store, nights: int = 4, big_night_trials: int | None = None) -> History:
    """``nights`` nightly runs of experiment ``nightly`` (loss, min) on DAG ``tune_nightly``.

    Each run has 6 trials: the best, one stopped early by ASHA, one stopped at max_t (completed),
    one that met its criterion, one that failed twice and ended ERROR, one still RUNNING. The
    last run is warm-started from the one before. With ``big_night_trials``, one more run (the
    newest) of that many trials, for a history at size.
    """
    store.ensure_experiment(EXPERIMENT, metric="loss", mode="min")
    seeded = History()
    for night in range(nights):
        key = f"scheduled__2026-11-{night + 1:02d}"
        run = store.create_experiment_run(EXPERIMENT, key, dag_id=DAG_ID, run_id=key)
        warm_from = seeded.nights[-1] if night == nights - 1 and night > 0 else None
        best = f"n{night}-best"
        _trial(store, run, key, best, BEST_CONFIGS[night % 4], 0, warm_from=warm_from)
        add_results(
            store,
            best,
            [_result(1, BEST_VALUES[night % 4] + 0.1), _result(2, BEST_VALUES[night % 4])],
        )
        store.record_end(
            TrialEnd(
                best,
                EXPERIMENT,
                TrialStatus.TERMINATED,
                stop_reason=TRAINABLE_FINISHED,
                stop_kind=StopKind.FINISHED,
            )
        )
        ends = [
            ("early", EARLY.format(loss=0.9, cut=0.7), StopKind.SCHEDULER, 0.9),
            ("maxt", AT_MAX_T, StopKind.MAX_T, 0.8),
            ("criterion", CRITERION_MET, StopKind.CRITERION, 0.7),
        ]
        for index, (name, reason, kind, loss) in enumerate(ends, start=1):
            trial_id = f"n{night}-{name}"
            _trial(store, run, key, trial_id, {"lr": 0.1, "layers": index}, index)
            add_results(store, trial_id, [_result(1, loss + night / 100)])
            store.record_end(
                TrialEnd(
                    trial_id,
                    EXPERIMENT,
                    TrialStatus.TERMINATED,
                    stop_reason=reason,
                    stop_kind=kind,
                )
            )
        failed = f"n{night}-failed"
        _trial(store, run, key, failed, {"lr": 1.0, "layers": 1}, 4)
        store.record_transition(failed, Transition.PLACED)
        update_trial(store, failed, num_failures=2, error_msg="RuntimeError: diverged")
        store.record_transition(failed, Transition.ABANDONED, why="RuntimeError: diverged")
        running = f"n{night}-running"
        _trial(store, run, key, running, {"lr": 0.05, "layers": 3}, 5)
        store.record_transition(running, Transition.PLACED)
        store.finish_experiment_run(run, "SUCCESS")
        seeded.nights.append(
            Night(
                run=run,
                run_key=key,
                best_value=BEST_VALUES[night % 4],
                best_trial=best,
                best_config=BEST_CONFIGS[night % 4],
                trials=6,
                errored=1,
                failed_tries=2,
                early_stopped=1,
                completed=3,
                unfinished=1,
                warm_from=warm_from.run if warm_from else None,
            )
        )
    if big_night_trials:
        seeded.nights.append(_big_night(store, nights, big_night_trials))
    with store._engine.begin() as connection:
        for night, seeded_night in enumerate(seeded.nights):
            connection.execute(
                update(ExperimentRunRow)
                .where(ExperimentRunRow.id == seeded_night.run)
                .values(created_at=FIRST_NIGHT + timedelta(days=night))
            )
    return seeded


def _big_night(store, night: int, trials: int) -> Night:
    key = f"scheduled__2026-11-{night + 1:02d}"
    run = store.create_experiment_run(EXPERIMENT, key, dag_id=DAG_ID, run_id=key)
    for i in range(trials):
        trial_id = f"big-{i:04d}"
        _trial(store, run, key, trial_id, {"lr": 0.001 * (i % 7 + 1), "layers": 2}, i)
        add_results(store, trial_id, [_result(1, round(0.3 + (i * 37 % 1000) / 1000, 6))])
        store.record_end(
            TrialEnd(
                trial_id,
                EXPERIMENT,
                TrialStatus.TERMINATED,
                stop_reason=TRAINABLE_FINISHED,
                stop_kind=StopKind.FINISHED,
            )
        )
    store.finish_experiment_run(run, "SUCCESS")
    # i * 37 % 1000 == 0 first at i == 0: big-0000 is the best, 0.3.
    return Night(
        run=run,
        run_key=key,
        best_value=0.3,
        best_trial="big-0000",
        best_config={"lr": 0.001, "layers": 2},
        trials=trials,
        errored=0,
        failed_tries=0,
        early_stopped=0,
        completed=trials,
        unfinished=0,
    )


def _trial(store, run, key, trial_id, config, index, warm_from: Night | None = None) -> None:
    warm = None
    if warm_from is not None:
        warm = {
            "run_key": warm_from.run_key,
            "experiment_run_id": warm_from.run,
            "trial_id": warm_from.best_trial,
            "value": warm_from.best_value,
            "checkpoint": None,
        }
    store.upsert_trial(
        trial_id,
        trainable="pkg.train:fn",
        config=config,
        resources={"cpu": 1},
        max_failures=2,
        experiment_run_id=run,
        dag_id=DAG_ID,
        run_id=key,
        task_id="nightly.trial",
        map_index=index,
        try_number=1,
        warm_start=warm,
    )


def _result(iteration: int, loss: float) -> dict:
    return {"training_iteration": iteration, "loss": loss}
