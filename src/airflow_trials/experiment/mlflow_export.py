"""``tuning_experiment(mlflow_export=...)``: the ``export_mlflow`` task after ``select_best``,
which exports the run and its trials from the trials DB to MLflow
(:func:`~airflow_trials.export.mlflow.export_to_mlflow`)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from airflow.sdk import task

from airflow_trials.hooks.trials import TrialsHook

if TYPE_CHECKING:
    from airflow_trials.experiment.plan import TuningPlan

log = logging.getLogger(__name__)

#: The export's task id within the experiment's task group.
EXPORT_TASK_ID = "export_mlflow"


def export_mlflow_task(plan: TuningPlan, best: Any) -> Any:
    """Declare ``export_mlflow`` downstream of ``best`` (select_best's XComArg); its XCom is
    the export's summary. It is safe to retry: a retried export updates the runs it made. It is
    no leaf of the experiment's group (:class:`~airflow_trials.experiment.builder.ExperimentGroup`):
    a task after the group does not wait for it, so an MLflow outage blocks no publishing."""

    @task(task_id=EXPORT_TASK_ID)
    def export_mlflow(best: dict[str, Any]) -> dict[str, Any]:
        """Export the run and its trials from the trials DB to MLflow."""
        return export_run(plan, best)

    return export_mlflow(best)


def export_run(plan: TuningPlan, best: Mapping[str, Any]) -> dict[str, Any]:
    """The task's body: export select_best's run as ``plan.mlflow_export`` says."""
    from airflow_trials.exceptions import ExportError
    from airflow_trials.export.mlflow import export_to_mlflow

    settings = plan.mlflow_export
    if settings is None:  # the task is declared only with an export
        raise ExportError(f"Experiment {plan.experiment_name} has no mlflow_export.")
    run_pk = int(best["experiment_run_id"])
    hook = TrialsHook(plan.ray_conn_id, plan.trials_conn_id)
    store = hook.get_store()
    try:
        run = store.reader.find_experiment_run(run_pk)
        if run is None:
            raise ExportError(
                f"Experiment {plan.experiment_name}: select_best's run {run_pk} is not in the "
                f"trials DB at {store!r}; check the {plan.trials_conn_id} connection."
            )
        # The root the trials wrote to: a checkpoint the DB names elsewhere is never uploaded.
        root = hook.ray_hook.settings()["storage_path"]
        summary = export_to_mlflow(store.reader, run, settings, root)
    finally:
        store.dispose()
    log.info(
        "Exported run %s of experiment %s to MLflow experiment %s at %s: parent run %s, "
        "%d runs created, %d updated, %d metric points, %d checkpoints logged",
        run.run_key,
        run.experiment_name,
        summary.experiment_name,
        summary.tracking_uri,
        summary.parent_run_id,
        summary.runs_created,
        summary.runs_updated,
        summary.metrics_logged,
        summary.artifacts_logged,
    )
    for note in summary.notes:
        log.warning("MLflow export: %s", note)
    return summary.to_dict()
