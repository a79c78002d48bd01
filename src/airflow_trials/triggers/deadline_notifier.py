"""ExperimentDeadlineNotifier: what runs in the triggerer when a tuning run misses its deadline.

``tuning_experiment(deadline=...)`` (:mod:`airflow_trials.experiment.deadline`) adds an Airflow
Deadline Alert to the DAG whose callback is this notifier, as an ``AsyncCallback``: Airflow's
scheduler finds the missed deadline and queues the callback; the triggerer builds the notifier
with the alert's kwargs and the run's context (``dag_run``, ``deadline``) and awaits it.

It logs one warning naming the experiment, the DAG run and the time it was due, then awaits the
team's own callback when one is given (an import path: a ``BaseNotifier`` such as Slack's, or an
``async def``; a plain function runs in a thread), called with ``experiment_name``, ``context``
and the callback's kwargs. It touches neither Airflow's metadata DB nor the run's trials: the
trials go on and ``select_best`` publishes the best when they end (docs/airflow.md says why).
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Mapping
from typing import Any

from airflow.sdk import BaseNotifier
from airflow.sdk.module_loading import import_string

__all__ = ["ExperimentDeadlineNotifier"]


class ExperimentDeadlineNotifier(BaseNotifier):
    """Log a tuning run's missed deadline, then call the team's callback, if any.

    :param experiment_name: the experiment whose run missed its deadline.
    :param callback: the import path of the team's own callback; default None.
    :param callback_kwargs: more keyword arguments for it (JSON values); default none.
    :param context: the run's context, as Airflow's deadline callbacks get it (``dag_run``: the
        DAG run as the REST API shows it; ``deadline``: its id and ``deadline_time``).
    """

    template_fields = ()

    def __init__(
        self,
        *,
        experiment_name: str,
        callback: str | None = None,
        callback_kwargs: Mapping[str, Any] | None = None,
        context: Any = None,
    ) -> None:
        super().__init__(context)
        self.experiment_name = experiment_name
        self.callback = callback
        self.callback_kwargs = dict(callback_kwargs or {})

    async def async_notify(self, context: Any) -> None:
        dag_run = context.get("dag_run") or {}
        deadline = context.get("deadline") or {}
        self.log.warning(
            "Experiment %s, DAG run %s of DAG %s, missed its deadline (due %s): its best model "
            "may not be published yet; its trials go on and select_best publishes the best when "
            "they end.",
            self.experiment_name,
            dag_run.get("dag_run_id"),
            dag_run.get("dag_id"),
            deadline.get("deadline_time"),
        )
        if self.callback is not None:
            await self._chain(dict(context))

    async def _chain(self, context: dict[str, Any]) -> None:
        """Call the team's callback: a notifier (built with the callback's kwargs, the context
        holding ``experiment_name``) or an ``async def`` is awaited; a plain function runs in a
        thread (it may block)."""
        target = import_string(str(self.callback))
        if isinstance(target, type) and issubclass(target, BaseNotifier):
            notifier = target(**self.callback_kwargs)
            notified = {**context, "experiment_name": self.experiment_name}
            notifier.context = notified  # type: ignore[assignment]
            await notifier
            return
        kwargs = {**self.callback_kwargs, "experiment_name": self.experiment_name}
        if inspect.iscoroutinefunction(target):
            await target(**kwargs, context=context)
        else:
            await asyncio.to_thread(target, **kwargs, context=context)
