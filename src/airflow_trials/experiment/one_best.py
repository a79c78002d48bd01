"""select_best with one metric: the run's best trial on its board
(:mod:`~airflow_trials.store.board`), as XCom and the Asset event's extra (``publish_best``
hands it on as it is)."""

from __future__ import annotations

from typing import Any

from airflow.sdk.exceptions import AirflowFailException

from airflow_trials.core.constraints import Constraints
from airflow_trials.core.goal import Goal
from airflow_trials.experiment.trial_ends import describe_counts, reconcile_trial_ends
from airflow_trials.hooks.trials import TrialsHook
from airflow_trials.operators.suggested_trials import SuggestedTrials


def select_one_best(
    experiment_name: str,
    hook: TrialsHook,
    suggested: SuggestedTrials,
    run_id: str,
    goal: tuple[str, str],
    constraints: Constraints,
) -> dict[str, Any]:
    """What ``select_best`` returns with one metric (``goal``: the metric and its mode): the
    run's best trial on its board, recorded as the run's pick; the run is finished SUCCESS when
    a trial counts (docs/store.md "Which trials count").

    :raises AirflowFailException: no trial that counts reported the metric.
    """
    metric, mode = goal
    run_pk = suggested.run_pk
    store = hook.get_store()
    try:
        counts = reconcile_trial_ends(hook, store, experiment_name, run_pk, suggested.trial_ids)
        # The run's board (store/board.py): its best is the one every screen names.
        board = store.reader.board(run_pk, Goal.of(metric, mode))
        # The trials that count (docs/store.md "Which trials count").
        finished = [r for r in board.rows if r.counted]
        if board.best is not None:
            store.record_pick(run_pk, board.best.trial_id)
        store.finish_experiment_run(run_pk, "SUCCESS" if finished else "FAILED")
        # An extension DAG run ends its extension with the run it extended.
        store.end_run_extension(run_pk, run_id, "SUCCESS" if finished else "FAILED")
    finally:
        store.dispose()
    top = board.best
    if top is None:
        raise AirflowFailException(
            f"Experiment {experiment_name}: no trial of run {run_id} finished "
            f"with metric {metric!r} ({describe_counts(counts)}); see the trial tasks' logs."
        )
    return {
        "experiment_name": experiment_name,
        "experiment_run_id": run_pk,
        "trial_id": top.trial_id,
        "config": top.config,
        "metric": metric,
        "mode": mode,
        "value": top.value,
        "iteration": top.iteration,
        # "checkpoint" is best_checkpoint too (its name before both were handed over).
        "best_checkpoint": top.best_checkpoint,
        "checkpoint": top.best_checkpoint,
        "latest_checkpoint": top.latest_checkpoint,
        "finished_trials": len(finished),
        "failed_trials": counts["failed"],
        "never_ran_trials": counts["never_ran"],
        "trials": suggested.count,
        # The board ranks feasible trials first: infeasible only when none is.
        **({"constraints": constraints.spec, "feasible": top.feasible} if constraints else {}),
    }
