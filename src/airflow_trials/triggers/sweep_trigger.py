"""SweepTrigger: watches a sweep's driver on Ray from the triggerer, logging its progress."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Sequence
from typing import Any

from airflow.triggers.base import TaskSuccessEvent, TriggerEvent

from airflow_trials.core.sweep_progress import end_line, sweep_summary
from airflow_trials.execution.triggerer.outage import RAY_OUTAGE_TIMEOUT_SECONDS
from airflow_trials.execution.triggerer.sweep_watch import SweepWatch
from airflow_trials.hooks.trials import DEFAULT_RAY_CONN_ID, DEFAULT_TRIALS_CONN_ID, TrialsHook
from airflow_trials.triggers.trial_trigger import TrialsTrigger

#: How long a sweep whose task was cleared or marked runs on, waiting for a new try to re-attach.
CLEAR_GRACE_SECONDS = 60.0


class SweepTrigger(TrialsTrigger):
    """Watches an experiment run's sweep driver
    (:mod:`~airflow_trials.execution.driver.sweep_driver`) and yields one event of plain values
    when the run ends or the driver is gone: a :class:`~airflow_trials.core.end.SweepEnd`, which
    the operator's ``execute_complete`` reads.

    Every ``poll_interval_seconds`` it asks the driver for its progress (in a thread, bounded) and,
    at most every ``progress_interval_seconds`` and whenever a trial ends, logs one line to the task
    log: trials done, running and pending, the best so far, the ETA. Between two polls it waits on
    the driver (a long poll), so it sees the run's end as it happens. Under a triggerer, a run that
    finished ends the task from here: it pushes the task's XComs and yields ``TaskSuccessEvent``,
    so the task does not start again in a worker only to push them. A triggerer restart runs it
    again, and it re-attaches to the same driver: the trigger never starts one. A driver that has
    ended is killed by the trigger once it has read the last progress; a trigger that runs again
    after that finds no driver and reads the run's end from the trials DB. When the user clears or
    marks the task, :meth:`on_kill` asks the driver to stop the run's trials after a grace period
    in which a newer try may claim it (fenced by try number).

    :param experiment_name: the experiment.
    :param run_key: the experiment run's key (the Airflow run id).
    :param experiment_run_id: the run's id in the trials DB.
    :param num_trials: how many trials the run has (how the trials DB tells that the run ended,
        once the driver is gone): a number, so that the kwargs do not grow with the trials.
    :param trial_ids: read only from a trigger serialized before ``num_trials`` (a task deferred
        across the upgrade), which carried the run's ids: their number is taken.
    :param try_number: the try that deferred; a stop from an older try never ends a newer try's run.
    :param ray_conn_id: default ``ray_default``. :param trials_conn_id: default ``trials_default``.
    :param poll_interval_seconds: time between polls; default 2.
    :param progress_interval_seconds: the most time between two progress lines; default 30.
    :param ray_outage_timeout_seconds: how long Ray may not answer before the driver counts as lost;
        default 120.
    :param warm_started_trials: how many of the run's trials were warm-started (for the summary).
    :param push_return_value: push the summary as the task's ``return_value`` too (the operator's
        ``do_xcom_push``); default True.
    :param end_in_trigger: end a finished run's task from the triggerer; default True. False for a
        task with ``outlets``: Airflow emits a task's asset events only when a worker ends it.
    """

    serialized_fields = (
        "experiment_name",
        "run_key",
        "experiment_run_id",
        "num_trials",
        "try_number",
        "ray_conn_id",
        "trials_conn_id",
        "poll_interval_seconds",
        "progress_interval_seconds",
        "ray_outage_timeout_seconds",
        "warm_started_trials",
        "push_return_value",
        "end_in_trigger",
    )

    def __init__(
        self,
        experiment_name: str,
        run_key: str,
        experiment_run_id: int,
        num_trials: int | None = None,
        try_number: int = 1,
        ray_conn_id: str = DEFAULT_RAY_CONN_ID,
        trials_conn_id: str = DEFAULT_TRIALS_CONN_ID,
        poll_interval_seconds: float = 2.0,
        progress_interval_seconds: float = 30.0,
        ray_outage_timeout_seconds: float = RAY_OUTAGE_TIMEOUT_SECONDS,
        warm_started_trials: int = 0,
        push_return_value: bool = True,
        end_in_trigger: bool = True,
        trial_ids: Sequence[str] | None = None,
    ) -> None:
        super().__init__(trials_conn_id, poll_interval_seconds)
        if num_trials is None:  # a trigger serialized before num_trials: it carried the ids
            if trial_ids is None:
                raise TypeError(
                    f"SweepTrigger of run {run_key} of experiment {experiment_name} needs "
                    "num_trials (the run's number of trials)."
                )
            num_trials = len(trial_ids)
        self.experiment_name = experiment_name
        self.run_key = run_key
        self.experiment_run_id = experiment_run_id
        self.num_trials = num_trials
        self.try_number = try_number
        self.ray_conn_id = ray_conn_id
        self.progress_interval_seconds = progress_interval_seconds
        self.ray_outage_timeout_seconds = ray_outage_timeout_seconds
        self.warm_started_trials = warm_started_trials
        self.push_return_value = push_return_value
        self.end_in_trigger = end_in_trigger

    async def run(self) -> AsyncIterator[TriggerEvent]:
        watch = SweepWatch(
            self.experiment_name,
            self.run_key,
            self.experiment_run_id,
            self.num_trials,
            find=functools.partial(
                connected_driver,
                TrialsHook(self.ray_conn_id, self.trials_conn_id),
                self.experiment_name,
                self.run_key,
            ),
            open_store=self.connect,
            log=self.log,
            poll_interval_seconds=self.poll_interval_seconds,
            progress_interval_seconds=self.progress_interval_seconds,
            ray_outage_timeout_seconds=self.ray_outage_timeout_seconds,
        )
        end = await self.watch_fenced(watch.until_end)
        if not end.finished or self.task_instance is None or not self.end_in_trigger:
            # A lost or failed driver resumes the task, which raises for Airflow's retry; every
            # event outside a triggerer (dag.test, deferrable=False) and a task with outlets end
            # in the task too.
            yield TriggerEvent(end.to_event())
            return
        summary = sweep_summary(self.run_key, end.progress, self.warm_started_trials)
        await asyncio.to_thread(self._push, summary)
        self.log.info("%s", end_line(summary))
        yield TaskSuccessEvent()

    def _push(self, summary: dict[str, Any]) -> None:
        """Push the task's XComs as its worker would (through the triggerer's supervisor and
        Airflow's XCom backend), so that a downstream task pulls a dict. A TaskSuccessEvent's own
        ``xcoms`` are stored JSON-encoded and come back to a task as a string."""
        from airflow.sdk.execution_time.xcom import XCom

        ti = self.task_instance
        assert ti is not None  # run() pushes only under a triggerer
        keys = {"sweep": summary, **({"return_value": summary} if self.push_return_value else {})}
        for key, value in keys.items():
            XCom.set(
                key,
                value,
                dag_id=ti.dag_id,
                task_id=ti.task_id,
                run_id=ti.run_id,
                map_index=ti.map_index,
            )

    async def on_kill(self) -> None:
        """The user cleared or marked the deferred task: the driver stops the run's trials and ends
        after ``CLEAR_GRACE_SECONDS`` unless a newer try claims it first (a cleared task's next
        try re-attaches to the live run; a task marked failed or success has none)."""
        from airflow_trials.execution.driver.sweep_client import stop_driver

        if await self.moved_to_another_triggerer():
            return
        hook = TrialsHook(self.ray_conn_id, self.trials_conn_id)
        try:
            namespace = await asyncio.to_thread(connected_namespace, hook)
            stopped = await asyncio.to_thread(
                stop_driver,
                self.experiment_name,
                self.run_key,
                namespace,
                self.try_number,
                CLEAR_GRACE_SECONDS,
            )
        except Exception as e:  # noqa: BLE001 - Ray down: the driver went with it
            self.log.warning("Could not stop the sweep of run %s on Ray: %s", self.run_key, e)
            return
        self.log.info(
            "Sweep %s: %s.",
            self.run_key,
            f"its trials stop in {CLEAR_GRACE_SECONDS:.0f} s unless a newer try re-attaches first"
            if stopped
            else "left to the newer try that watches it",
        )


def connected_namespace(hook: TrialsHook, verify: bool = False) -> str:
    """Connect this process to the Ray connection's cluster (reconnecting after a restart with
    ``verify``) and return its namespace. It reads the Airflow connection and may wait on Ray:
    call it in a thread, never on the triggerer's event loop."""
    hook.get_actor_client(verify=verify)
    return str(hook.ray_hook.settings()["namespace"])


def connected_driver(hook: TrialsHook, experiment_name: str, run_key: str) -> Any:
    """The run's live driver actor, or None, on the hook's Ray cluster (reconnecting after a
    restart): what the sweep's watch looks for. It may wait on Ray: call it in a thread."""
    from airflow_trials.execution.driver.sweep_client import find_driver

    namespace = connected_namespace(hook, verify=True)
    return find_driver(experiment_name, run_key, namespace)
