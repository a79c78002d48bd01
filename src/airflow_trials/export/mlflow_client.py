"""The MLflow client an export writes through (:func:`mlflow_client`), and what it says when it
has none: mlflow not installed (``INSTALL_HINT``, the ``mlflow`` extra), no tracking URI, or a
URI MLflow refuses before any request (MLflow 3's file store, an unknown scheme)."""

from __future__ import annotations

import os
from typing import Any

from airflow_trials.exceptions import ExportError

INSTALL_HINT = "pip install -c constraints.txt '.[mlflow]' in the airflow_trials checkout"


def mlflow_client(tracking_uri: str | None) -> tuple[Any, str]:
    """``(MlflowClient, uri to show)`` for ``tracking_uri``, else ``$MLFLOW_TRACKING_URI``, the
    URI shown with its password masked; an ExportError naming the extra when mlflow is not
    installed, or when no URI is given."""
    try:
        from mlflow.tracking import MlflowClient
    except ImportError as e:
        raise ExportError(
            f"Exporting to MLflow needs the mlflow package, which is not installed here ({e}); "
            f"install it with {INSTALL_HINT}."
        ) from e
    uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
    if not uri:
        raise ExportError(
            "No MLflow tracking URI: pass --tracking-uri (MlflowExport(tracking_uri=...) in a "
            "DAG), or set MLFLOW_TRACKING_URI, e.g. to http://mlflow:5000."
        )
    from mlflow.exceptions import MlflowException

    from airflow_trials.store.engine import mask_passwords, safe_url

    try:
        return MlflowClient(tracking_uri=uri), safe_url(uri)
    except MlflowException as e:  # MLflow refused the URI itself, before any request
        shown, said = safe_url(uri), mask_passwords(e.message).strip().splitlines()[0]
        if "MLFLOW_ALLOW_FILE_STORE" in e.message:
            raise ExportError(
                f"MLflow refuses the tracking URI {shown}: MLflow 3 no longer writes to a "
                "file store (file:// or a path) unless MLFLOW_ALLOW_FILE_STORE=true is set. "
                "Export to a tracking server (--tracking-uri http://host:5000) or a database "
                "(--tracking-uri sqlite:////abs/path/mlflow.db), or set "
                "MLFLOW_ALLOW_FILE_STORE=true to write the file store anyway."
            ) from None
        raise ExportError(
            f"MLflow refuses the tracking URI {shown}: {said} Give --tracking-uri a tracking "
            "server's URL (http://host:5000) or a database's (sqlite:////abs/path/mlflow.db)."
        ) from None
