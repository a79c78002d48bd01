"""The version of the data a run tunes on: ``tuning_experiment(data_version=...)``.

``data_version`` is an Asset, a string, or None (default: no version is recorded).

* An **Asset** (the dataset the DAG is scheduled on): the version is the one the run's last
  triggering event of that Asset carries, ``extra["payload"]["version"]`` from an
  ``AssetWatcher`` whose trigger is
  :class:`~airflow_trials.triggers.dataset_version_trigger.NewDatasetVersionTrigger`, or
  ``extra["version"]`` from a task that emitted the event.
* A **string**: a Jinja template (or a plain value) rendered when ``suggest_configs`` starts, e.g.
  ``"{{ dag_run.partition_key }}"`` for a partitioned Asset.

When it gives no version (a run triggered by hand, or ``dag.test()``), the run's param
``data_version`` does, if set: the trigger form's field, added to the DAG with the argument.
``suggest_configs`` records the version on the run's row (``at_experiment_runs.data_version``), and
``select_best`` reads it back into the best trial's dict, the Asset event's ``extra``
(``publish_best`` hands it on).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from airflow.sdk import Asset, Param

from airflow_trials.hooks.trials import TrialsHook

#: The DAG param that names the version a run triggered by hand tunes on.
DATA_VERSION_PARAM = "data_version"

#: The most characters a data version has (the trials DB's column).
MAX_DATA_VERSION_LENGTH = 250


def checked_data_version(experiment_name: str, value: Any) -> Asset | str | None:
    """``data_version`` as given, once checked when the DAG file is parsed."""
    if value is None or isinstance(value, Asset) or (isinstance(value, str) and value):
        return value
    raise ValueError(
        f"Experiment {experiment_name}: data_version must be the dataset's Asset, a template "
        f"string such as '{{{{ dag_run.partition_key }}}}', or None, got {value!r}; pass one "
        "of those."
    )


def data_version_param() -> Param:
    """The trigger form's field for the version a run triggered by hand tunes on."""
    return Param(
        None,
        type=["null", "string"],
        maxLength=MAX_DATA_VERSION_LENGTH,
        title="Data version",
        description=(
            "The version of the data this run tunes on, recorded with the run and carried by "
            "its Asset event. Leave it empty when an Asset event triggers the run: the event's "
            "version is taken."
        ),
    )


def add_data_version_param(dag: Any) -> None:
    """Add the ``data_version`` param to ``dag`` unless the DAG file declared it already."""
    if DATA_VERSION_PARAM not in dag.params:
        dag.params[DATA_VERSION_PARAM] = data_version_param()


def template_of(source: Asset | str | None) -> str | None:
    """What ``suggest_configs`` is handed to render: the template, when ``source`` is one."""
    return source if isinstance(source, str) else None


def triggering_data_version(asset: Asset, context: Mapping[str, Any]) -> str | None:
    """The version the run's last triggering event of ``asset`` carries; None without one."""
    events = context.get("triggering_asset_events") or {}
    found = list(events.get(asset, []))
    if not found:
        return None
    extra = found[-1].extra or {}
    payload = extra.get("payload")
    version = payload.get("version") if isinstance(payload, Mapping) else None
    version = version if version is not None else extra.get("version")
    return None if version is None else str(version)


def run_data_version(
    experiment_name: str,
    source: Asset | str | None,
    rendered: str | None,
    context: Mapping[str, Any],
) -> str | None:
    """The version run ``context`` tunes on (see the module's docstring); None when it names
    none. ``rendered`` is the template of a string ``source`` as Airflow rendered it."""
    if source is None:
        return None
    version = triggering_data_version(source, context) if isinstance(source, Asset) else rendered
    if not version:
        version = (context.get("params") or {}).get(DATA_VERSION_PARAM) or None
    if version is not None and len(str(version)) > MAX_DATA_VERSION_LENGTH:
        raise ValueError(
            f"Experiment {experiment_name}: data version {str(version)[:40]!r}... is "
            f"{len(str(version))} characters, over {MAX_DATA_VERSION_LENGTH}; name the version "
            "with a shorter string."
        )
    return None if version is None else str(version)


def recorded_data_version(hook: TrialsHook, experiment_name: str, experiment_run_id: int) -> Any:
    """The data version the trials DB recorded for the run (None: it named none)."""
    store = hook.get_store()
    try:
        return store.reader.resolve_run(experiment_name, experiment_run_id).data_version
    finally:
        store.dispose()
