"""select_best with several metrics: the run's Pareto front and the trial ``pick`` chooses
(:mod:`airflow_trials.core.pick`), as XCom and the Asset event's extra."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from airflow.sdk.exceptions import AirflowFailException

from airflow_trials.core.constraints import Constraints
from airflow_trials.core.goal import Goal
from airflow_trials.core.pick import Candidate, Pick
from airflow_trials.experiment.trial_ends import describe_counts, reconcile_trial_ends
from airflow_trials.hooks.trials import TrialsHook
from airflow_trials.operators.suggested_trials import SuggestedTrials
from airflow_trials.store.board import Board, BoardRow

log = logging.getLogger(__name__)


def select_pareto_best(
    experiment_name: str,
    hook: TrialsHook,
    suggested: SuggestedTrials,
    context: Mapping[str, Any],
    pick: Pick,
    constraints: Constraints | None = None,
) -> dict[str, Any]:
    """What ``select_best`` returns with several metrics: the Pareto front of the run's
    finished trials (by each one's last result, as the searcher learnt it) and the trial
    ``pick`` chooses from it; the run is finished SUCCESS when a trial is ranked.

    With the search's ``constraints``, only the feasible trials are ranked while there is one
    (as ``ResultGrid.get_pareto_front`` ranks them), and the XCom says whether the chosen one is
    (``feasible``) and which constraints judged it (``constraints``).

    :raises AirflowFailException: no finished trial reported every metric, or none meets the
        pick's bounds (the message names the pick and the front).
    """
    run_id = context["ti"].run_id
    run_pk = suggested.run_pk
    metrics = list(pick.metrics)
    counts, board, chosen = _pick_and_finish(hook, experiment_name, run_pk, suggested, pick, run_id)
    candidates = board.candidates
    where = f"Experiment {experiment_name}, run {run_id}"
    if not candidates:
        raise AirflowFailException(
            f"{where}: no trial finished with every one of the metrics {metrics!r} as a "
            f"finite number ({describe_counts(counts)}); see the trial tasks' logs."
        )
    front = [c for c in candidates if c.pareto_rank == 0]
    if chosen is None:
        raise AirflowFailException(
            f"{where}: no finished trial meets the pick, {pick.describe()} "
            f"(pick={pick.to_dict()!r}); the Pareto front is "
            f"{[c.to_dict() for c in front]!r}. Loosen the bounds, or pick again from the "
            "front in this task's log."
        )
    log.info(
        "%s: %d trial(s) on the Pareto front of %s; the pick, %s, chose %s with %s.",
        where,
        len(front),
        metrics,
        pick.describe(),
        chosen.trial_id,
        chosen.values,
    )
    row = {r.trial_id: r for r in board.rows}[chosen.trial_id]  # the board is whole
    return {
        "experiment_name": experiment_name,
        "experiment_run_id": run_pk,
        **_chosen_xcom(board, chosen, row, pick, constraints),
        "finished_trials": len(candidates),
        "failed_trials": counts["failed"],
        "never_ran_trials": counts["never_ran"],
        "trials": suggested.count,
    }


def _pick_and_finish(
    hook: TrialsHook,
    experiment_name: str,
    run_pk: int,
    suggested: SuggestedTrials,
    pick: Pick,
    run_id: str,
) -> tuple[dict[str, int], Board, Candidate | None]:
    """Reconcile the trials' ends, read the run's board, record the pick and finish the run
    (SUCCESS when a trial is ranked) and the extension it ends; the trials' counts, the board
    and the chosen candidate."""
    store = hook.get_store()
    try:
        counts = reconcile_trial_ends(hook, store, experiment_name, run_pk, suggested.trial_ids)
        # The run's board (store/board.py): the trials that count, feasible first, ranked.
        board = store.reader.board(run_pk, Goal.of(list(pick.metrics), list(pick.modes)))
        chosen = pick.choose(board.candidates)
        if chosen is not None:
            # In the trials DB too, for the dashboard's Pareto scatter and the run's history.
            store.record_pick(run_pk, chosen.trial_id)
        outcome = "SUCCESS" if board.candidates else "FAILED"
        store.finish_experiment_run(run_pk, outcome)
        # An extension DAG run ends its extension with the run it extended.
        store.end_run_extension(run_pk, run_id, outcome)
    finally:
        store.dispose()
    return counts, board, chosen


def _chosen_xcom(
    board: Board, chosen: Candidate, row: BoardRow, pick: Pick, constraints: Constraints | None
) -> dict[str, Any]:
    """What the XCom says of the chosen trial (``row``, its board row) and the front."""
    # With several metrics no one of them ranks checkpoints: the newest kept one.
    checkpoint = row.latest_checkpoint
    judged = constraints or Constraints()
    return {
        "trial_id": chosen.trial_id,
        "config": row.config,
        "metric": list(pick.metrics),
        "mode": list(pick.modes),
        "values": dict(chosen.values),
        "pareto_rank": chosen.pareto_rank,
        "pick": pick.to_dict(),
        "pareto_front": [c.to_dict() for c in board.candidates if c.pareto_rank == 0],
        "pareto_ranks": {c.trial_id: c.pareto_rank for c in board.candidates},
        "iteration": row.iteration,
        "best_checkpoint": checkpoint,
        "checkpoint": checkpoint,
        "latest_checkpoint": checkpoint,
        **({"constraints": judged.spec, "feasible": row.feasible is True} if judged else {}),
    }
