"""OpenLineage facets of a tuning run: what the trial and sweep operators and ``select_best``
return from ``get_openlineage_facets_on_complete``.

The facets are built here from plain values, by pure functions; the operators gather the values
(their end, the run's record in the trials DB) and call :func:`operator_lineage`. What a consumer
of the events sees, for a task that ended SUCCESS:

- job facets ``airflowTrials_trialsRun`` (the run in the trials DB: ``experiment``, ``runKey``,
  ``experimentRunId``, and ``trialsDb``, its URL without the password) and
  ``airflowTrials_trainable`` (``trainable``, the import path, and ``searchSpace``, as the run
  recorded it);
- one output dataset, the best checkpoint at its real URI, named as OpenLineage's naming
  conventions name files: ``file`` + the absolute path on a local or shared disk, ``s3://bucket``
  + the key on S3 (``gs://``, ``abfss://``... likewise);
- run facet ``airflowTrials_best``: the trial, its ``config``, its ``metrics`` (metric -> best
  value) and their ``modes``.

``apache-airflow-providers-openlineage`` is an optional extra (``airflow-trials[openlineage]``):
this module imports it only inside :func:`operator_lineage` and :func:`openlineage_enabled`, and
the operators import this module only inside their lineage method, which Airflow calls only when
the provider is installed and configured. Without it nothing here runs.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from airflow.providers.openlineage.extractors import OperatorLineage

    from airflow_trials.hooks.trials import TrialsHook

#: The facets' keys: a prefix of their own, as OpenLineage asks of custom facets.
TRIALS_RUN_FACET = "airflowTrials_trialsRun"
TRAINABLE_FACET = "airflowTrials_trainable"
BEST_FACET = "airflowTrials_best"

# Object stores whose namespace is the bucket (OpenLineage's naming spec: "s3://{bucket}").
_BUCKET_SCHEMES = {"s3", "s3a", "s3n", "gs", "gcs", "abfs", "abfss", "wasbs"}


@dataclasses.dataclass(frozen=True)
class RunLineage:
    """What the lineage of one task of a tuning run says (see the module's docstring).

    :param experiment_name: the experiment.
    :param trials_db: the trials DB's URL, without its password (:func:`safe_db_url`).
    :param trainable: the trainable's import path.
    :param run_key: the run's key in the trials DB (the DAG run's run_id); None for a trial
        outside an experiment run.
    :param experiment_run_id: the run's id in the trials DB; None likewise.
    :param search_space: the run's search space as recorded; None when none is.
    :param trial_id: the best trial (a trial task: its own trial); None when no trial finished.
    :param config: that trial's config; default empty.
    :param metrics: metric -> that trial's value; default empty.
    :param modes: metric -> ``"min"`` or ``"max"``; default empty.
    :param checkpoint: that trial's best checkpoint (a path or a URL); None when it kept none.
    """

    experiment_name: str
    trials_db: str
    trainable: str
    run_key: str | None = None
    experiment_run_id: int | None = None
    search_space: Any = None
    trial_id: str | None = None
    config: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    metrics: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    modes: Mapping[str, str] = dataclasses.field(default_factory=dict)
    checkpoint: str | None = None


def safe_db_url(url: str) -> str:
    """The trials DB's URL for a lineage event: no password, and no query (``sslpassword=`` and
    the like can carry secrets there). ``postgresql+psycopg://u:pw@h/db?x=1`` ->
    ``postgresql+psycopg://u@h/db``."""
    from sqlalchemy.engine import make_url

    # URL.set() takes None for "unchanged": the password goes through the named tuple's _replace.
    bare = make_url(url)._replace(password=None).set(query={})
    return bare.render_as_string(hide_password=False)


def checkpoint_dataset(uri: str) -> tuple[str, str]:
    """``(namespace, name)`` of a checkpoint by OpenLineage's naming conventions.

    ``/data/ckpt`` and ``file:///data/ckpt`` -> ``("file", "/data/ckpt")``;
    ``s3://bucket/exp/t1/checkpoint_3`` -> ``("s3://bucket", "exp/t1/checkpoint_3")``; another
    URL -> ``("{scheme}://{host}", path)``. ValueError for a relative local path, which names no
    file another job could find.
    """
    parts = urlsplit(uri)
    if parts.scheme in ("", "file"):
        path = parts.path if parts.scheme else uri
        if not path.startswith("/"):
            raise ValueError(
                f"Checkpoint {uri!r} is a relative path, which names no dataset; trials keep "
                "checkpoints at absolute paths or URLs (AIRFLOW_TRIALS_STORAGE, or the Ray "
                "connection's storage_path)."
            )
        if parts.netloc and parts.netloc != "localhost":  # file://host/path: a remote disk
            return f"file://{parts.netloc}", path
        return "file", path
    if parts.scheme in _BUCKET_SCHEMES:
        return f"{parts.scheme}://{parts.netloc}", parts.path.lstrip("/")
    return f"{parts.scheme}://{parts.netloc}", parts.path


def metrics_of(best: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """``(metrics, modes)`` of ``select_best``'s XCom: ``{metric: value}`` with one metric, each
    metric's value in ``values`` with several."""
    metric, mode = best.get("metric"), best.get("mode")
    if isinstance(metric, list):
        values = best.get("values") or {}
        return {m: values.get(m) for m in metric}, dict(zip(metric, mode or [], strict=False))
    if metric is None:
        return {}, {}
    return {metric: best.get("value")}, ({metric: mode} if mode else {})


def numbers_of(result: Mapping[str, Any] | None) -> dict[str, float]:
    """The finite numbers of a reported result (a trial's metrics), by name."""
    return {
        key: value
        for key, value in sorted((result or {}).items())
        if isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(float(value))
    }


def job_facet_fields(lineage: RunLineage) -> dict[str, dict[str, Any]]:
    """The job facets' fields, by facet key."""
    return {
        TRIALS_RUN_FACET: {
            "experiment": lineage.experiment_name,
            "runKey": lineage.run_key,
            "experimentRunId": lineage.experiment_run_id,
            "trialsDb": lineage.trials_db,
        },
        TRAINABLE_FACET: {"trainable": lineage.trainable, "searchSpace": lineage.search_space},
    }


def run_facet_fields(lineage: RunLineage) -> dict[str, dict[str, Any]]:
    """The run facet's fields, by facet key; none when no trial finished."""
    if lineage.trial_id is None:
        return {}
    return {
        BEST_FACET: {
            "trialId": lineage.trial_id,
            "config": dict(lineage.config),
            "metrics": dict(lineage.metrics),
            "modes": dict(lineage.modes),
            "checkpoint": lineage.checkpoint,
        }
    }


def operator_lineage(lineage: RunLineage) -> OperatorLineage:
    """The ``OperatorLineage`` Airflow's OpenLineage listener emits for a task that ended
    SUCCESS. Needs ``apache-airflow-providers-openlineage``."""
    from airflow.providers.openlineage.extractors import OperatorLineage
    from openlineage.client.event_v2 import OutputDataset

    job_type, run_type = _facet_types()
    outputs = []
    if lineage.checkpoint:
        namespace, name = checkpoint_dataset(lineage.checkpoint)
        outputs.append(OutputDataset(namespace=namespace, name=name))
    return OperatorLineage(
        outputs=outputs,
        job_facets={key: job_type[key](**f) for key, f in job_facet_fields(lineage).items()},
        run_facets={key: run_type(**f) for key, f in run_facet_fields(lineage).items()},
    )


@functools.cache
def _facet_types() -> tuple[dict[str, type], type]:
    """The facet classes (attrs classes over the OpenLineage client's, an optional extra), made on
    first use: ``({job facet key: class}, run facet class)``."""
    import attrs
    from openlineage.client.facet_v2 import JobFacet, RunFacet

    @attrs.define
    class TrialsRunJobFacet(JobFacet):
        """The tuning run in the trials DB."""

        experiment: str
        runKey: str | None  # noqa: N815 - OpenLineage's facets are camelCase
        experimentRunId: int | None  # noqa: N815
        trialsDb: str  # noqa: N815

    @attrs.define
    class TrainableJobFacet(JobFacet):
        """The code the run tuned, and the space it searched."""

        trainable: str
        searchSpace: Any  # noqa: N815

    @attrs.define
    class BestTrialRunFacet(RunFacet):
        """The run's best trial (a trial task: its own trial) and its values."""

        trialId: str  # noqa: N815
        config: dict[str, Any]
        metrics: dict[str, Any]
        modes: dict[str, str]
        checkpoint: str | None

    return {TRIALS_RUN_FACET: TrialsRunJobFacet, TRAINABLE_FACET: TrainableJobFacet}, (
        BestTrialRunFacet
    )


def openlineage_enabled() -> bool:
    """Whether this process emits OpenLineage events: the provider is installed and configured
    (a transport), as its plugin decides whether to listen."""
    try:
        from airflow.providers.openlineage import conf
    except ImportError:
        return False
    return not conf.is_disabled()


def read_run_lineage(
    hook: TrialsHook,
    experiment_name: str,
    experiment_run_id: int | None,
    trainable: str,
    **best: Any,
) -> RunLineage:
    """A :class:`RunLineage` of the run ``experiment_run_id`` (its key and search space read from
    the trials DB; none without a run), with ``best``'s fields (``trial_id``, ``config``...)."""
    run_key = search_space = None
    if experiment_run_id is not None:
        store = hook.get_store()
        try:
            run = store.reader.resolve_run(experiment_name, experiment_run_id)
        finally:
            store.dispose()
        run_key, search_space = run.run_key, run.search_space
    return RunLineage(
        experiment_name=experiment_name,
        trials_db=safe_db_url(hook.db_hook.get_url()),
        trainable=trainable,
        run_key=run_key,
        experiment_run_id=experiment_run_id,
        search_space=search_space,
        **best,
    )
