"""check_regression: fail a run whose best is worse than the previous successful run's by more
than the experiment's ``regression_tolerance`` (the rule is
:mod:`airflow_trials.core.regression_tolerance`).

The task runs after ``select_best``, so the run's best is recorded and published (XCom, Asset
event) whatever it finds; a regression is its own failed task in the grid view, and Airflow's
failure callbacks and alerts take it from there. Both runs are read from the trials DB, never from
Airflow's metadata DB: the previous run is the newest earlier run of the same experiment whose
status there is SUCCESS, and both runs are ranked as ``select_best`` ranks them.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk.exceptions import AirflowFailException

from airflow_trials.core.goal import Goal
from airflow_trials.core.regression_tolerance import (
    Comparison,
    RegressionTolerance,
    compare_best,
    compare_fronts,
)
from airflow_trials.exceptions import RegressionError
from airflow_trials.hooks.trials import TrialsHook
from airflow_trials.store.records import ExperimentRunRecord, ExperimentRunStatus

if TYPE_CHECKING:
    from airflow_trials.experiment.plan import TuningPlan
    from airflow_trials.experiment.settings import ExperimentSettings
    from airflow_trials.store import TrialStore

log = logging.getLogger(__name__)

# What a user can do. select_best has already recorded the run SUCCESS in the trials DB, so the
# next run compares with it whatever this task's state; what the failure holds back is only the
# tasks downstream of the task group (upstream_failed), and a re-run of this task fails again.
WAYS_OUT = (
    "The next run is compared with this one whatever this task's state (select_best recorded "
    "this run SUCCESS in the trials DB). To run the tasks after the task group with this best "
    "anyway, mark this check_regression task success, then clear those tasks (clearing this one "
    "only fails it again: the same runs compare the same); to check less strictly, raise "
    "regression_tolerance in the DAG file, or leave it out to stop the check."
)


class RegressionCheckFailed(RegressionError, AirflowFailException):
    """The :class:`~airflow_trials.exceptions.RegressionError` the task raises: an
    AirflowFailException, so Airflow fails it without retrying (the same runs compare the same)."""


def checked_tolerance(
    experiment_name: str, spec: Any, settings: ExperimentSettings
) -> RegressionTolerance | None:
    """``tuning_experiment``'s ``regression_tolerance`` parsed when the DAG file is parsed;
    ValueError naming the experiment, the value and the spelling."""
    try:
        tolerance = RegressionTolerance.of(spec)
        if tolerance is not None:
            tolerance.check_metrics(settings.several_metrics)
    except ValueError as e:
        raise ValueError(f"Experiment {experiment_name}: {e}") from e
    return tolerance


def previous_successful_run(
    runs: Sequence[ExperimentRunRecord], experiment_run_id: int
) -> ExperimentRunRecord | None:
    """The newest run before ``experiment_run_id`` (``runs`` oldest first, as
    ``list_experiment_runs`` gives them) whose status is SUCCESS; None when there is none."""
    ids = [r.id for r in runs]
    earlier = runs[: ids.index(experiment_run_id)] if experiment_run_id in ids else runs
    done = [r for r in earlier if r.status is ExperimentRunStatus.SUCCESS]
    return done[-1] if done else None


def run_best_value(
    store: TrialStore, experiment_run_id: int, metric: str, mode: str
) -> float | None:
    """The run's best value as ``select_best`` takes it: the leaderboard's first finished trial
    with the metric (feasible first, with constraints); None when none finished with it."""
    best = store.reader.board(experiment_run_id, Goal.of(metric, mode)).best
    return None if best is None or best.value is None else float(best.value)


def run_front_points(
    store: TrialStore, experiment_run_id: int, metrics: list[str], modes: list[str]
) -> list[list[float]]:
    """Each finished trial's values (its last result, in ``metrics``' order) with every metric
    reported; with constraints, only the feasible trials'. Dominated points add no volume, so
    these are as good as the front."""
    board = store.reader.board(experiment_run_id, Goal.of(metrics, modes))
    return [
        [float(v) for v in row.values.values() if v is not None]
        for row in board.rows
        if row.counted and row.feasible is not False
    ]


def optuna_hypervolume(losses: list[list[float]], reference: list[float]) -> float:
    """Optuna's exact hypervolume (WFG) of loss vectors up to ``reference``."""
    import numpy as np
    from optuna._hypervolume import compute_hypervolume

    return float(compute_hypervolume(np.asarray(losses, dtype=float), np.asarray(reference)))


def check_regression(
    plan: TuningPlan, best: Mapping[str, Any], context: Mapping[str, Any]
) -> dict[str, Any]:
    """The ``check_regression`` task: compare the run ``select_best`` returned (``best``) with
    the previous successful run of the experiment; what was compared, as XCom.

    :raises RegressionCheckFailed: the run is worse by more than the tolerance; the message
        names both runs, both values, the tolerance and how to silence it.
    """
    tolerance = plan.regression_tolerance
    if tolerance is None:  # the task is declared only with a tolerance
        raise ValueError("check_regression needs the experiment's regression_tolerance")
    run = plan.settings_for_run(context)
    run_id = context["ti"].run_id
    run_pk = int(best["experiment_run_id"])
    where = f"Experiment {plan.experiment_name}, DAG run {run_id}"
    store = TrialsHook(plan.ray_conn_id, plan.trials_conn_id).get_store()
    try:
        previous = previous_successful_run(
            store.reader.list_experiment_runs(plan.experiment_name), run_pk
        )
        comparison = None if previous is None else _compare(store, run, run_pk, previous, tolerance)
    finally:
        store.dispose()
    outcome: dict[str, Any] = {
        "experiment_name": plan.experiment_name,
        "experiment_run_id": run_pk,
        "metric": run.metric,
        "mode": run.mode,
        "tolerance": tolerance.to_dict(),
        "previous_run": None if previous is None else _describe_run(previous),
        "checked": comparison is not None,
        **({} if comparison is None else comparison.to_dict()),
    }
    if previous is not None and comparison is not None and comparison.regressed:
        raise RegressionCheckFailed(
            _message(
                where, run, previous, comparison, tolerance, approval=plan.approval is not None
            )
        )
    _log_passed(where, run, previous, comparison, tolerance)
    return outcome


def _log_passed(
    where: str,
    run: ExperimentSettings,
    previous: ExperimentRunRecord | None,
    comparison: Comparison | None,
    tolerance: RegressionTolerance,
) -> None:
    """Say why the check passed: no previous run, nothing to compare, or within tolerance."""
    if previous is None:
        log.info(
            "%s: no earlier run of the experiment succeeded in the trials DB, so there is "
            "nothing to compare this run's best with; the check passes.",
            where,
        )
    elif comparison is None:
        log.info(
            "%s: the previous successful run, %s, has no finished trial that reported %s, so "
            "there is nothing to compare; the check passes.",
            where,
            previous.run_key,
            run.metric,
        )
    else:
        log.info(
            "%s: %s is %s; the previous successful run %s had %s; worse by %s, within "
            "regression_tolerance %s (%s allowed).",
            where,
            _what(run),
            _num(comparison.current),
            previous.run_key,
            _num(comparison.previous),
            _num(comparison.worse_by),
            tolerance.to_dict(),
            _num(comparison.allowed),
        )


def _compare(
    store: TrialStore,
    run: ExperimentSettings,
    run_pk: int,
    previous: ExperimentRunRecord,
    tolerance: RegressionTolerance,
) -> Comparison | None:
    """The comparison, or None when the previous run has nothing to compare with."""
    if isinstance(run.metric, str) and isinstance(run.mode, str):
        before = run_best_value(store, previous.id, run.metric, run.mode)
        now = run_best_value(store, run_pk, run.metric, run.mode)
        if before is None or now is None:  # now: select_best has failed the run already
            return None
        return compare_best(now, before, run.mode, tolerance)
    metrics, modes = list(run.metric), list(run.mode)
    before_points = run_front_points(store, previous.id, metrics, modes)
    if not before_points:
        return None
    now_points = run_front_points(store, run_pk, metrics, modes)
    return compare_fronts(now_points, before_points, modes, tolerance, optuna_hypervolume)


def _what(run: ExperimentSettings) -> str:
    if isinstance(run.metric, str):
        return f"the best {run.metric} ({run.mode})"
    goals = ", ".join(f"{mode} {metric}" for metric, mode in zip(run.metric, run.mode, strict=True))
    return f"the hypervolume of the Pareto front of [{goals}]"


def _describe_run(run: ExperimentRunRecord) -> dict[str, Any]:
    return {
        "experiment_run_id": run.id,
        "run_key": run.run_key,
        "dag_id": run.dag_id,
        "run_id": run.run_id,
    }


def _message(
    where: str,
    run: ExperimentSettings,
    previous: ExperimentRunRecord,
    comparison: Comparison,
    tolerance: RegressionTolerance,
    *,
    approval: bool = False,
) -> str:
    of_dag = f" of DAG {previous.dag_id}" if previous.dag_id else ""
    text = (
        f"{where}: {_what(run)} is {_num(comparison.current)}, worse than "
        f"{_num(comparison.previous)} in the previous successful run, {previous.run_key}{of_dag} "
        f"(experiment run {previous.id}), by {_num(comparison.worse_by)}: more than "
        f"regression_tolerance {tolerance.to_dict()!r} allows ({_num(comparison.allowed)})."
    )
    if comparison.reference_point is not None:
        point = {
            metric: float(_num(value))
            for metric, value in zip(run.metric, comparison.reference_point, strict=True)
        }
        text += (
            f" Both hypervolumes are measured up to the reference point {point!r} (each "
            "metric's worst value over both fronts, plus a tenth of its range)."
        )
    if approval:  # approval=True: publish_best waits for approve_best, beside this check
        published = "Publishing this run's best waits for approve_best's answer all the same."
    else:
        published = "select_best has published this run's best all the same."
    return f"{text} {published} {WAYS_OUT}"


def _num(value: float) -> str:
    return f"{value:.6g}"
