"""Who may see what on the dashboard: Airflow's own user and per-DAG checks, fed with the store's
dag_id.

Authentication is Airflow's: :func:`airflow.api_fastapi.core_api.security.get_user` reads the
JWT from the ``Authorization: Bearer`` header or the UI's ``_token`` cookie (401 without one,
403 for an invalid one). Authorisation is the call Airflow's ``requires_access_dag`` makes,
``auth_manager.is_authorized_dag(method="GET", access_entity=..., details=DagDetails(id=dag_id))``,
with the DAG id taken from the trials store (the run or trial records which DAG run made it),
never from the URL.
"""

from __future__ import annotations

from typing import Annotated

from airflow.api_fastapi.app import get_auth_manager
from airflow.api_fastapi.auth.managers.models.base_user import BaseUser
from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity, DagDetails
from airflow.api_fastapi.core_api.security import get_user
from airflow.configuration import conf
from fastapi import Depends, HTTPException, status

UserDep = Annotated[BaseUser, Depends(get_user)]

# A run page shows a DAG run's data, a trial page a task instance's (and links to its logs).
RUN_ACCESS = DagAccessEntity.RUN
TRIAL_ACCESS = DagAccessEntity.TASK_INSTANCE


def _team_name(dag_id: str) -> str | None:
    if not conf.getboolean("core", "multi_team", fallback=False):
        return None  # no teams: skip the query to Airflow's DB that would return None
    from airflow.models.dag import DagModel

    return DagModel.get_team_name(dag_id)


def may_read(user: BaseUser, dag_id: str | None, access_entity: DagAccessEntity) -> bool:
    """Whether ``user`` may read ``access_entity`` of the DAG ``dag_id``.

    A run or trial recorded without a DAG (started outside Airflow) is checked as Airflow
    checks access to all DAGs (``details=None``): only users who may read every DAG see it.
    """
    details = DagDetails(id=dag_id, team_name=_team_name(dag_id)) if dag_id else None
    return get_auth_manager().is_authorized_dag(
        method="GET", access_entity=access_entity, details=details, user=user
    )


def require_read(
    user: BaseUser, dag_id: str | None, access_entity: DagAccessEntity, what: str
) -> None:
    """Raise 403, naming ``what`` and the DAG, unless :func:`may_read` allows it."""
    if not may_read(user, dag_id, access_entity):
        dag = f"DAG {dag_id}" if dag_id else "all DAGs (it was not started by a DAG)"
        raise HTTPException(
            status_code=status.HTTP_403_FORBIDDEN,
            detail=(
                f"User {user.get_name()} may not read {what}: it needs read access to "
                f"{access_entity.value} of {dag}. Ask an Airflow admin for that permission."
            ),
        )
