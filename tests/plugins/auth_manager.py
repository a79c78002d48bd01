"""A SimpleAuthManager that lets some users read only some DAGs: the per-DAG check, testable.

SimpleAuthManager grants by role alone; real deployments (FAB, Keycloak) grant per DAG. This
subclass keeps everything of SimpleAuthManager and only narrows ``is_authorized_dag`` for the
users in :data:`DAG_GRANTS`, so the dashboard's per-DAG refusal can be tested end to end.
"""

from __future__ import annotations

from airflow.api_fastapi.auth.managers.simple.simple_auth_manager import SimpleAuthManager

# user -> the only DAGs they may read; users not listed keep SimpleAuthManager's role rules.
DAG_GRANTS: dict[str, set[str]] = {"bob": {"other_dag"}}


class DagScopedAuthManager(SimpleAuthManager):
    def is_authorized_dag(self, *, method, user, access_entity=None, details=None) -> bool:
        grants = DAG_GRANTS.get(user.get_name())
        if grants is not None and (details is None or details.id not in grants):
            return False
        return super().is_authorized_dag(
            method=method, user=user, access_entity=access_entity, details=details
        )
