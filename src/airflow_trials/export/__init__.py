"""Exports of an experiment run from the trials DB to the tools a team keeps its records in:
MLflow (:mod:`~airflow_trials.export.mlflow`, ``airflow-trials export mlflow``)."""

from __future__ import annotations

from airflow_trials.export.mlflow_mapping import MlflowExport

__all__ = ["MlflowExport"]
