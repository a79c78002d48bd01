"""The end of a DAG run's trials, as ``select_best`` finds it: ends that were never recorded are
recorded, and the ends are counted."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from airflow_trials.core.fate import Transition
from airflow_trials.hooks.trials import TrialsHook

log = logging.getLogger(__name__)


def reconcile_trial_ends(
    hook: TrialsHook,
    store: Any,
    experiment_name: str,
    run_pk: int,
    trial_ids: Sequence[str] | None,
) -> dict[str, int]:
    """Make the store tell the truth once every trial task of a run is done, and count the ends.

    A trial still PENDING, RUNNING or PAUSED here lost its task for good (a worker killed, a
    trigger that failed) without its end being recorded: it is stopped on Ray, if anything of it
    is left there, and recorded as ERROR. A suggested trial the store never saw never ran.
    ``trial_ids`` None: the run's trials are those registered in the store (a sweep's, registered
    before its driver starts), and one its driver never started never ran.
    Returns counts of ``finished`` (TERMINATED), ``failed`` (ERROR) and ``never_ran`` trials.
    """
    states = store.reader.run_trial_states(run_pk)
    registered = trial_ids is None
    never_started = [s for s in states if registered and s.never_started]
    stuck = [
        s for s in states if not s.status.is_terminal() and not (registered and s.never_started)
    ]
    if stuck:
        executor = hook.get_actor_client()
        for state in stuck:
            executor.terminate(experiment_name, state.trial_id)
            store.record_transition(
                state.trial_id,
                Transition.ABANDONED,
                why=(
                    f"Trial {state.trial_id} of experiment {experiment_name} was still "
                    f"{state.status.value} when "
                    f"every trial task of its run had ended: its task (try {state.try_number}) "
                    "failed without "
                    "recording the trial's end. It was stopped on Ray; see that task's log for the "
                    "cause."
                ),
            )
        log.warning(
            "Recorded %d trial(s) whose tasks ended without recording their end as ERROR: %s",
            len(stuck),
            ", ".join(s.trial_id for s in stuck),
        )
    statuses = [s.status.value for s in states]
    unseen = set(trial_ids or ()) - {s.trial_id for s in states}
    counts = {
        "finished": statuses.count("TERMINATED"),
        "failed": statuses.count("ERROR") + len(stuck),
        "never_ran": len(unseen) + len(never_started),
    }
    log.info("Experiment %s, run %s: %s.", experiment_name, run_pk, describe_counts(counts))
    return counts


def describe_counts(counts: Mapping[str, int]) -> str:
    return (
        f"{counts['finished']} trial(s) finished, {counts['failed']} failed, "
        f"{counts['never_ran']} never ran"
    )
