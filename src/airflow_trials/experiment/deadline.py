"""ExperimentDeadline: the time by which a tuning run must have published its best model, as an
Airflow Deadline Alert on the DAG that holds the experiment.

Deadline Alerts belong to a DAG (``DAG(deadline=...)``), and ``tuning_experiment`` is a task group
inside the user's DAG; it adds its alert to that DAG's list as the file is parsed (the DAG's own
alerts are kept), so that the experiment's one argument says it all. Its callback is
:class:`~airflow_trials.triggers.deadline_notifier.ExperimentDeadlineNotifier`, run in the
triggerer. Example::

    tuning_experiment(..., deadline=ExperimentDeadline(datetime.timedelta(hours=4)))
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Mapping
from typing import Any

from airflow.sdk import DAG
from airflow.sdk.definitions.deadline import AsyncCallback, DeadlineAlert, DeadlineReference
from airflow.sdk.module_loading import is_valid_dotpath

from airflow_trials.triggers.deadline_notifier import ExperimentDeadlineNotifier

__all__ = ["REFERENCES", "ExperimentDeadline", "add_deadline_alert"]

#: What a deadline's interval counts from: when the DAG run was queued (a manual run too), or its
#: logical date (a scheduled run's slot: "by 6:00 after the 2:00 slot").
REFERENCES = {
    "queued_at": DeadlineReference.DAGRUN_QUEUED_AT,
    "logical_date": DeadlineReference.DAGRUN_LOGICAL_DATE,
}


@dataclasses.dataclass(frozen=True)
class ExperimentDeadline:
    """When a tuning run must have published its best model, and who to tell when it has not.

    :param interval: how long after ``reference`` the run is due (a positive timedelta).
    :param reference: ``"queued_at"`` (default) or ``"logical_date"`` (:data:`REFERENCES`).
    :param callback: the import path of the team's own callback, called after the provider's
        warning (a ``BaseNotifier`` subclass, an ``async def`` or a function); default None.
    :param callback_kwargs: its keyword arguments (JSON values); default none.
    """

    interval: dt.timedelta
    reference: str = "queued_at"
    callback: str | None = None
    callback_kwargs: Mapping[str, Any] | None = None

    @classmethod
    def of(cls, value: Any, experiment_name: str) -> ExperimentDeadline | None:
        """The checked deadline of ``tuning_experiment(deadline=value)``: None, a timedelta
        (counted from ``queued_at``) or an ExperimentDeadline; a one-line ValueError otherwise."""
        if value is None:
            return None
        if isinstance(value, dt.timedelta):
            value = cls(value)
        if not isinstance(value, cls):
            raise ValueError(
                f"Experiment {experiment_name}: deadline must be a datetime.timedelta or an "
                f"ExperimentDeadline, got {type(value).__name__}; pass e.g. "
                "ExperimentDeadline(datetime.timedelta(hours=4))."
            )
        value.check(experiment_name)
        return value

    def check(self, experiment_name: str) -> None:
        """Raise a one-line ValueError naming the field that is wrong and how to fix it."""
        owner = f"Experiment {experiment_name}: deadline"
        if not isinstance(self.interval, dt.timedelta) or self.interval <= dt.timedelta(0):
            raise ValueError(
                f"{owner} interval must be a positive datetime.timedelta, got "
                f"{self.interval!r}; give the time the run has, e.g. timedelta(hours=4)."
            )
        if self.reference not in REFERENCES:
            raise ValueError(
                f"{owner} reference must be one of {sorted(REFERENCES)}, got "
                f"{self.reference!r}; use 'logical_date' for a scheduled run's slot."
            )
        if self.callback is not None and not (
            isinstance(self.callback, str) and is_valid_dotpath(self.callback)
        ):
            raise ValueError(
                f"{owner} callback must be an import path such as 'my_team.alerts.page', got "
                f"{self.callback!r}; the triggerer imports it by that path."
            )

    def alert(self, experiment_name: str) -> DeadlineAlert:
        """The Airflow Deadline Alert: due ``interval`` after ``reference``; its callback the
        provider's notifier, run in the triggerer."""
        return DeadlineAlert(
            reference=REFERENCES[self.reference],
            interval=self.interval,
            callback=AsyncCallback(
                ExperimentDeadlineNotifier,
                kwargs={
                    "experiment_name": experiment_name,
                    "callback": self.callback,
                    "callback_kwargs": dict(self.callback_kwargs or {}),
                },
            ),
            name=f"{experiment_name}_deadline",
        )


def add_deadline_alert(dag: DAG | None, deadline: ExperimentDeadline, experiment_name: str) -> None:
    """Add the experiment's alert to its DAG's Deadline Alerts, keeping the DAG's own."""
    if dag is None:
        raise ValueError(
            f"Experiment {experiment_name}: deadline= needs the DAG the experiment is in; "
            "declare tuning_experiment inside a `with DAG(...)` block."
        )
    own: list[DeadlineAlert] = list(dag.deadline or [])  # type: ignore[arg-type]
    dag.deadline = [*own, deadline.alert(experiment_name)]
