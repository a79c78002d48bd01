"""The worker's side of a trial's start, for ``RunTrialOperator.execute``: whether the cluster
can take it, the start action :func:`~airflow_trials.core.fate.on_start` chose as the store
records it (a restart from scratch, a reset), and the launch on Ray from its latest checkpoint."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow_trials.core.fate import Start, StartAction
from airflow_trials.core.trial import Trial
from airflow_trials.exceptions import TrialNotFoundError
from airflow_trials.execution.resume import adopt_checkpoints

if TYPE_CHECKING:
    from airflow_trials.execution.driver.actor_client import TrialActorClient


def ran_before(store: Any, trial_id: str) -> bool:
    """Whether the trial started on Ray before: then it fitted the cluster, and a cluster short
    of its resources now has lost nodes it will get back."""
    try:
        return store.reader.get_trial(trial_id).started_at is not None
    except TrialNotFoundError:
        return False


def check_capacity(client: TrialActorClient, trial: Trial, started_before: bool, log: Any) -> None:
    """Refuse a new trial the cluster can never fit; a trial that fitted when it started waits,
    PENDING and deferred, for the node it lost (a lost GPU node, a preempted machine)."""
    if not started_before:
        client.check_fits_cluster(trial)
    elif not client.fits_cluster(trial.resources):
        log.warning(
            "Trial %s needs %s; the Ray cluster has %s now. It waits for a node with room to join.",
            trial.trial_id,
            trial.resources.summary_string(),
            client.resource_string(),
        )


def record_start(
    store: Any,
    client: TrialActorClient,
    action: StartAction,
    trial_id: str,
    try_number: int,
    log: Any,
) -> None:
    """Record the start ``action`` asks for before the launch: a restart from scratch (its
    dropped checkpoints' files deleted), then its transition."""
    if action.start is Start.RESTART:
        from airflow_trials.store.transitions import RestartFromScratch

        # As Airflow replaces a cleared task's XComs, the new results replace the old.
        dropped = store.record_transition(
            trial_id, RestartFromScratch(try_number=try_number)
        ).dropped_checkpoints
        for path in dropped:
            client.storage.delete(path)
        log.info(
            "Trial %s: its stored results and %d checkpoints are replaced.", trial_id, len(dropped)
        )
    if action.transition is not None:
        # Fenced by the try: a zombie older try's RESET or QUEUED changes nothing.
        store.record_transition(trial_id, action.transition, try_number=try_number)


def launch(
    store: Any, client: TrialActorClient, trial: Trial, holds: Any, started_before: bool, log: Any
) -> bool:
    """Start the trial on Ray from its latest stored checkpoint, with its scheduler's ``holds``;
    whether Ray placed it already. A trial that ran before waits for capacity the cluster lost."""
    # Its recorded checkpoints become its kept set again: the actor drops them, in turn, as the
    # keep policy says, once newer ones are recorded.
    latest = adopt_checkpoints(trial, store, client.storage)
    if latest is not None:
        log.info("Trial %s resumes from checkpoint %s", trial.trial_id, latest.path)
    # Do not wait for Ray to place it: a trial queued for resources waits deferred, holding no
    # worker slot, and starts when Ray places it.
    actor = client.launch(
        trial, start_timeout_s=None, holds=holds, wait_for_capacity=started_before
    )
    placed = client.is_placed(actor)
    log.info("Started trial %s of experiment %s on Ray.", trial.trial_id, trial.experiment_name)
    return placed
