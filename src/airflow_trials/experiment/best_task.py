"""``select_best``'s operator: Airflow's own ``@task`` operator, which also gives OpenLineage the
run's best trial.

``select_best`` stays a ``@task`` (its body is :meth:`TuningPlan.select_best`); only its operator
class is ours, made by Airflow's ``task_decorator_factory`` as providers make their ``@task.x``
decorators. Airflow's OpenLineage listener calls an operator's
``get_openlineage_facets_on_complete`` when it has one, so the best trial goes out with the same
facets as the trial and sweep tasks' (:mod:`airflow_trials.operators.lineage`). Hook-level lineage
(the hook lineage collector) or a runtime outlet was the alternative; either carries datasets
only, not the job's and run's facets, and an outlet would register each run's checkpoint as an
Airflow Asset.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

# The standard provider's @task operator, subclassed so that select_best behaves exactly as
# @task does (python_callable, op_args, the "@task" label in the UI).
from airflow.providers.standard.decorators.python import _PythonDecoratedOperator
from airflow.sdk.bases.decorator import task_decorator_factory

from airflow_trials.hooks.trials import TrialsHook

if TYPE_CHECKING:
    from airflow.providers.openlineage.extractors import OperatorLineage
    from airflow.sdk import Context
    from airflow.sdk.bases.decorator import TaskDecorator


class SelectBestOperator(_PythonDecoratedOperator):
    """The ``@task`` operator of ``select_best``; its return value is the run's best trial
    (:meth:`~airflow_trials.experiment.plan.TuningPlan.select_best`).

    :param trainable: the experiment's trainable, for the lineage's job facet.
    :param ray_conn_id: the Ray connection of the experiment's tasks.
    :param trials_conn_id: the trials DB connection of the experiment's tasks.
    """

    def __init__(self, *, trainable: str, ray_conn_id: str, trials_conn_id: str, **kwargs: Any):
        super().__init__(**kwargs)
        self.trainable = trainable
        self.ray_conn_id, self.trials_conn_id = ray_conn_id, trials_conn_id

    def execute(self, context: Context) -> Any:
        self._best = super().execute(context)  # for get_openlineage_facets_on_complete
        return self._best

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> OperatorLineage:
        """OpenLineage: the experiment run and trainable (job facets), the best trial's checkpoint
        (the output dataset), its config and metrics (run facet; with several metrics, the trial
        the experiment's pick chose from the Pareto front)."""
        from airflow.providers.openlineage.extractors import OperatorLineage

        from airflow_trials.operators.lineage import metrics_of, operator_lineage, read_run_lineage

        best = getattr(self, "_best", None)
        if best is None:  # it failed (Airflow asks on failure too): no run of its own to name
            return OperatorLineage()
        metrics, modes = metrics_of(best)
        return operator_lineage(
            read_run_lineage(
                TrialsHook(self.ray_conn_id, self.trials_conn_id),
                best["experiment_name"],
                best["experiment_run_id"],
                self.trainable,
                trial_id=best["trial_id"],
                config=best["config"],
                metrics=metrics,
                modes=modes,
                checkpoint=best["best_checkpoint"],
            )
        )


def select_best_task(
    trainable: str, ray_conn_id: str, trials_conn_id: str, **kwargs: Any
) -> TaskDecorator:
    """``@task(**kwargs)``, with :class:`SelectBestOperator` as its operator."""
    return task_decorator_factory(
        decorated_operator_class=SelectBestOperator,
        trainable=trainable,
        ray_conn_id=ray_conn_id,
        trials_conn_id=trials_conn_id,
        **kwargs,
    )
