"""A sweep's ``suggest_configs``: it registers the run's trials in the trials DB and hands on a
reference to them, whose size does not grow with the number of trials (docs/airflow.md)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from airflow_trials.hooks.trials import TrialsHook
from airflow_trials.operators.suggested_trials import sweep_reference


def registered_sweep(plan: Any, entries: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Register ``entries`` (``plan.suggest``'s, the run's trials) in one transaction, and return
    the XCom that the sweep task and ``select_best`` read them by: the run's id, their number, the
    run's own settings and the warm-started trials' origins
    (:func:`~airflow_trials.operators.suggested_trials.sweep_reference`). Trials registered
    already (a retry, an extension's trials of the run it extends) are left as they are."""
    first = entries[0]
    hook = TrialsHook(plan.ray_conn_id, plan.trials_conn_id)
    store = hook.get_store()
    try:
        store.register_trials(
            first["experiment_run_id"],
            [(e["trial_id"], e["config"], e.get("warm_start")) for e in entries],
            trainable=plan.trainable,
            # A run's own settings (from_params) travel with each entry; else the DAG file's.
            resources=first.get("resources_per_trial") or plan.settings.resources.to_dict(),
            max_failures=first.get("max_failures", plan.settings.max_failures),
        )
    finally:
        store.dispose()
    return sweep_reference(entries)
