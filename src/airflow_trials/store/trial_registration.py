"""The statement that registers a trial, or refreshes one registered already: ``upsert_trial``'s
one ``INSERT ... ON CONFLICT DO UPDATE``, fenced by the Airflow try as the status setter is, its
columns and its run in a transaction."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import and_, case, func, or_
from sqlalchemy.orm import Session

from airflow_trials.core.jsonsafe import json_safe
from airflow_trials.core.resources import Resources
from airflow_trials.core.status import TrialStatus
from airflow_trials.core.status_cause import StatusCause
from airflow_trials.store.base import StoreBase
from airflow_trials.store.database import check_id
from airflow_trials.store.models import TrialRow, utcnow
from airflow_trials.store.run_summaries import trials_written

log = logging.getLogger(__name__)


def registered(now: Any) -> dict[str, Any]:
    """The fields of a trial as it is first registered: PENDING, no failures, not started."""
    return {
        "status": TrialStatus.PENDING.value,
        "status_cause": StatusCause.REGISTERED.value,
        "num_failures": 0,
        "created_at": now,
        "updated_at": now,
        "started_at": None,
        "ended_at": None,
    }


def refreshing_airflow_ids(insert: Any, table: Any) -> Any:
    """``insert`` that, for a trial registered already, only refreshes the Airflow ids given, and
    only from a try no older than the one registered (the try fence of
    :func:`~airflow_trials.store.trial_writes.from_an_older_try`): a cleared task's older try that
    runs again writes nothing, so the registered try never goes down. A trial that never started
    takes the config it starts with: a sweep registers the trials its searcher suggests with an
    empty config (:meth:`RunTrialsWriter.register_trials`)."""
    new = insert.excluded
    never_started = and_(
        table.c.status == TrialStatus.PENDING.value,
        table.c.started_at.is_(None),
        table.c.num_failures == 0,
    )
    return insert.on_conflict_do_update(
        index_elements=[table.c.trial_id],
        set_={
            "config": case((never_started, new.config), else_=table.c.config),
            "dag_id": func.coalesce(new.dag_id, table.c.dag_id),
            "run_id": func.coalesce(new.run_id, table.c.run_id),
            "task_id": func.coalesce(new.task_id, table.c.task_id),
            "map_index": case((new.task_id.is_not(None), new.map_index), else_=table.c.map_index),
            "try_number": func.coalesce(new.try_number, table.c.try_number),
            "updated_at": new.updated_at,
        },
        where=not_from_an_older_try(new.try_number, table.c.try_number),
    )


def not_from_an_older_try(try_number: Any, registered_try: Any) -> Any:
    """SQL for the negation of the try fence: no try on either side, or ``try_number`` is the
    registered try or a later one."""
    return or_(try_number.is_(None), registered_try.is_(None), try_number >= registered_try)


def definition_columns(
    trainable: str,
    config: Mapping[str, Any],
    resources: Mapping[str, Any] | Resources,
    max_failures: int,
    warm_start: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """The columns that define a trial, stored as JSON (see :mod:`~airflow_trials.core.jsonsafe`)
    where they are dicts; set once, at its registration."""
    resources_dict = resources.to_dict() if isinstance(resources, Resources) else resources
    return {
        "trainable": trainable,
        "config": json_safe(dict(config)),
        "resources": json_safe(dict(resources_dict)),
        "max_failures": max_failures,
        "warm_start": json_safe(dict(warm_start)) if warm_start is not None else None,
    }


def register_unless_later_try(
    session: Session,
    insert: Any,
    trial_id: str,
    try_number: int | None,
    experiment_run_id: int | None,
) -> None:
    """Run the registration's insert; a later try's registration (no row returned) is kept."""
    if session.execute(insert).first() is None:
        log.info(
            "Trial %s: try %s's registration is skipped: a later try of its task "
            "registered it since.",
            trial_id,
            try_number,
        )
        return
    # A trial registered in a run that ended changes its history line.
    trials_written(session, [experiment_run_id])


#: One trial of a run as :meth:`RunTrialsWriter.register_trials` takes it: its id, its config and
#: where it came from when it is warm-started (None for any other).
PlannedTrial = tuple[str, Mapping[str, Any], Mapping[str, Any] | None]

#: Rows per INSERT statement: a 100,000-trial run is registered in one transaction, in batches.
_BATCH_ROWS = 1000


class RunTrialsWriter(StoreBase):
    """Registers all the trials of one run at once: a sweep's ``suggest_configs`` does, so that
    its task and driver read the run's trials from the trials DB by the run's id, and no list of
    them travels in XCom or in the trigger's kwargs."""

    def register_trials(
        self,
        experiment_run_id: int,
        trials: Sequence[PlannedTrial],
        definition: tuple[str, Mapping[str, Any] | Resources, int],
    ) -> None:
        """Register ``trials`` (PENDING) in run ``experiment_run_id``, in one transaction, each
        with ``definition``: the trainable, resources and ``max_failures`` they share. A trial
        registered already is left as it is: a retry of the task that registers them writes
        nothing twice, and a trial that ended keeps its end."""
        trainable, resources, max_failures = definition
        for trial_id, _, _ in trials:
            check_id("Trial id", trial_id)
        table = TrialRow.__table__
        operation = f"register {len(trials)} trials in experiment run {experiment_run_id}"
        now = utcnow()

        def rows(start: int) -> list[dict[str, Any]]:
            return [
                {
                    "trial_id": trial_id,
                    "experiment_run_id": experiment_run_id,
                    **definition_columns(trainable, config, resources, max_failures, warm_start),
                    "dag_id": None,
                    "run_id": None,
                    "task_id": None,
                    "map_index": -1,
                    "try_number": None,
                    **registered(now),
                }
                for trial_id, config, warm_start in trials[start : start + _BATCH_ROWS]
            ]

        def work(session: Session) -> None:
            self._find_run_or_raise(session, experiment_run_id, operation)
            insert = self._insert(table).on_conflict_do_nothing(index_elements=[table.c.trial_id])
            for start in range(0, len(trials), _BATCH_ROWS):
                session.execute(insert, rows(start))
            trials_written(session, [experiment_run_id])

        self._transaction(operation, work)
