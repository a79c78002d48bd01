"""TrialTrigger: watches a trial on Ray from the triggerer, recording its results, without blocking."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import TriggerEvent

from airflow_trials.core.status import TrialStatus
from airflow_trials.hooks.trials import DEFAULT_RAY_CONN_ID, DEFAULT_TRIALS_CONN_ID, TrialsHook
from airflow_trials.triggers.base import MIN_DEFERRAL_SECONDS, TrialsTrigger
from airflow_trials.triggers.watch import (
    BATCHED_POLLS_ENV,
    POLL_GRACE_SECONDS,
    TrialWatch,
    stored_end_event,
)

__all__ = [
    "BATCHED_POLLS_ENV", "MIN_DEFERRAL_SECONDS", "POLL_GRACE_SECONDS", "RAY_OUTAGE_TIMEOUT_SECONDS",
    "STOPPED_BY_USER", "TrialStatusTrigger", "TrialTrigger", "stored_end_event", "trials_status",
]

# How long a trigger keeps trying while Ray does not answer (its head restarting, say) before it
# gives the trial up as lost to infrastructure; the task then resumes it from its latest checkpoint.
RAY_OUTAGE_TIMEOUT_SECONDS = 120.0
STOPPED_BY_USER = "Stopped because its Airflow task was cleared or marked while deferred."


class TrialTrigger(TrialsTrigger):
    """Watches a trial's Ray actor, writes its new results and checkpoints to the trials store,
    and yields one event when the trial ends (or its actor is gone).

    The watch itself is a :class:`~airflow_trials.triggers.watch.TrialWatch`. Its polls go through
    the triggerer's shared :mod:`~airflow_trials.execution.triggerer.poller`: one
    thread makes every trigger's Ray calls and writes their progress in one transaction per tick,
    so the event loop never waits on Ray or the database. The trigger's other Ray and database
    calls (attach, release, reads) run in threads. Results are written idempotently, so a trigger
    that runs again after a triggerer restart re-sends them harmlessly. ``AIRFLOW_TRIALS_BATCHED_POLLS=0``
    in the triggerer's environment selects the per-trial path instead, to measure against.

    When a user clears or marks the deferred task, :meth:`on_kill` stops the trial on Ray; a
    triggerer restart (which also cancels the trigger) leaves it running for the next trigger.

    :param experiment_name: the trial's experiment.
    :param trial_id: the trial.
    :param ray_conn_id: Ray connection; default ``ray_default``.
    :param trials_conn_id: trials DB connection; default ``trials_default``.
    :param poll_interval_seconds: time between polls; default 2.
    :param ray_outage_timeout_seconds: how long to keep trying while Ray does not answer before
        the trial counts as lost to infrastructure; default 120.
    :param ray_cluster_id: hex id of the Ray cluster the trial was launched on; when the cluster
        at Ray's address is another one and the actor is gone, the trial was lost with the old
        cluster (infrastructure), not through its own code. Default None: not checked.
    :param scheduler: the scheduler's settings (``AshaRungs.to_dict()`` or ``MedianRule.to_dict()``):
        the trigger judges each result against the run's state in the trials store (ASHA's rungs,
        the median rule's running means) and gives the actor its verdict
        (:mod:`~airflow_trials.triggers.judge`). Default None: the trial runs to its criterion.
    :param bracket: the trial's ASHA bracket; default 0.
    :param experiment_run_id: the run whose trials the scheduler compares; required with ``scheduler``.
    """

    serialized_fields = (
        "experiment_name", "trial_id", "ray_conn_id", "trials_conn_id", "poll_interval_seconds",
        "ray_outage_timeout_seconds", "ray_cluster_id", "scheduler", "bracket", "experiment_run_id",
    )

    def __init__(
        self,
        experiment_name: str,
        trial_id: str,
        ray_conn_id: str = DEFAULT_RAY_CONN_ID,
        trials_conn_id: str = DEFAULT_TRIALS_CONN_ID,
        poll_interval_seconds: float = 2.0,
        ray_outage_timeout_seconds: float = RAY_OUTAGE_TIMEOUT_SECONDS,
        ray_cluster_id: str | None = None,
        scheduler: dict[str, Any] | None = None,
        bracket: int = 0,
        experiment_run_id: int | None = None,
    ) -> None:
        super().__init__(trials_conn_id, poll_interval_seconds)
        if scheduler is not None and experiment_run_id is None:
            raise ValueError(
                f"TrialTrigger for trial {trial_id}: a scheduler judges a trial against the other trials of "
                "its experiment run, so it needs experiment_run_id."
            )
        self.experiment_name = experiment_name
        self.trial_id = trial_id
        self.ray_conn_id = ray_conn_id
        self.ray_outage_timeout_seconds = ray_outage_timeout_seconds
        self.ray_cluster_id = ray_cluster_id
        self.scheduler = scheduler
        self.bracket = bracket
        self.experiment_run_id = experiment_run_id
        self._watch: TrialWatch | None = None

    async def run(self) -> AsyncIterator[TriggerEvent]:
        yield TriggerEvent(await self.watch_fenced(self._until_end))

    async def _until_end(self) -> dict[str, Any]:
        hook = TrialsHook(self.ray_conn_id, self.trials_conn_id)
        watch = self._watch = TrialWatch(self, hook, await self.connect())
        return await watch.until_end()

    async def on_kill(self) -> None:
        """The user cleared or marked the deferred task: stop the trial on Ray and record it.

        Airflow runs this only for a user's action, never when the triggerer restarts (see
        ``BaseTrigger.on_kill``), after ``run()`` was cancelled and before :meth:`cleanup`.
        """
        store = await self.connect()
        # Fenced by the try number: Airflow may start the task's next try before this runs, and
        # a stop sent by try N must never end the trial that try N+1 took over.
        try_number = getattr(self.task_instance, "try_number", None)
        stopped = await asyncio.to_thread(store.stop_trial_for_try, self.trial_id, try_number, STOPPED_BY_USER)
        if not stopped:
            self.log.info("Task of trial %s was cleared; a later try took the trial over, leaving it running.",
                          self.trial_id)
            return
        self.log.info("Task of trial %s was cleared or marked while deferred; stopping the trial on Ray.",
                      self.trial_id)
        hook = TrialsHook(self.ray_conn_id, self.trials_conn_id)
        watch = self._watch or TrialWatch(self, hook, store)
        await watch.release()  # the actor it watched, never one a later try started

    async def cleanup(self) -> None:
        """Stop polling and free the store's connections (never the trial: see :meth:`on_kill`)."""
        if self._watch is not None:
            self._watch.close()
        await super().cleanup()


def trials_status(store: Any, experiment_name: str, trial_id: str | None, run_key: str | None) -> dict[str, Any]:
    """What a TrialSensor waits on, read from the trials store: done or not, and the statuses."""
    if trial_id is not None:
        trials = [store.get_trial(trial_id)]
    else:
        runs = [r for r in store.list_experiment_runs(experiment_name) if r.run_key == run_key]
        if not runs:
            return {"done": False, "statuses": {}, "failed": []}
        trials = store.list_trials(experiment_run_id=runs[0].id)
    statuses = {t.trial_id: t.status.value for t in trials}
    done = bool(trials) and all(t.status.is_terminal() for t in trials)
    failed = sorted(t.trial_id for t in trials if t.status is TrialStatus.ERROR)
    return {"done": done, "statuses": statuses, "failed": failed}


class TrialStatusTrigger(TrialsTrigger):
    """Polls the trials store until a trial, or every trial of an experiment run, has ended.

    :param experiment_name: the experiment.
    :param trial_id: the trial to wait for; or
    :param run_key: the experiment run (its Airflow run_id) whose trials to wait for.
    :param trials_conn_id: trials DB connection; default ``trials_default``.
    :param poll_interval_seconds: default 30.
    """

    serialized_fields = ("experiment_name", "trial_id", "run_key", "trials_conn_id", "poll_interval_seconds")

    def __init__(
        self,
        experiment_name: str,
        trial_id: str | None = None,
        run_key: str | None = None,
        trials_conn_id: str = DEFAULT_TRIALS_CONN_ID,
        poll_interval_seconds: float = 30.0,
    ) -> None:
        super().__init__(trials_conn_id, poll_interval_seconds)
        self.experiment_name = experiment_name
        self.trial_id = trial_id
        self.run_key = run_key

    async def run(self) -> AsyncIterator[TriggerEvent]:
        try:
            state = await self.poll_store(self._done)
        finally:
            await self.cleanup()
        yield TriggerEvent(state)

    def _done(self, store: Any) -> dict[str, Any] | None:
        state = trials_status(store, self.experiment_name, self.trial_id, self.run_key)
        return state if state["done"] else None
