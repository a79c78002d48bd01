"""A run whose params ask for more than the Ray cluster has, or for bundles its nodes cannot hold:
the cluster's refusal
(:class:`~airflow_trials.core.resources.InsufficientResourcesError`, from ``check_fits_cluster``)
retold as a refusal of the run's params, naming the trigger form's fields that asked for it.

The fits-cluster check stays in ``execution/driver/cluster.py``; this only translates its error
where the params are known, in ``suggest_configs``. The form's fields are found by asking
``from_params`` again with each changed param set back to the DAG's default: those whose default
asks for less of what the cluster lacks are named, with that default as the fix.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, NoReturn

from airflow.sdk.exceptions import AirflowFailException

from airflow_trials.core.placement import placement_refusal
from airflow_trials.core.resources import InsufficientResourcesError, Resources

#: ``ray start`` options that add each kind of resource to a node.
_RAY_START = {"gpu": "--num-gpus=N", "cpu": "--num-cpus=N", "memory": "--memory=BYTES"}


#: ``from_params``: a DAG run's params to the settings they choose.
FromParams = Callable[[Mapping[str, Any]], Mapping[str, Any]]


def check_fits_cluster_or_refuse_params(
    actor_client: Any,
    trial: Any,
    experiment_name: str,
    from_params: FromParams | None,
    dag_file_resources: Resources,
    context: Mapping[str, Any],
) -> None:
    """``suggest_configs``' check that ``trial`` (the run's first) fits the Ray cluster; the
    cluster's refusal, when the run's params chose its resources (``from_params``), retold by
    :func:`refuse_params_beyond_cluster`."""
    try:
        actor_client.check_fits_cluster(trial)
    except InsufficientResourcesError as e:
        if from_params is None:
            raise
        refuse_params_beyond_cluster(
            experiment_name, from_params, dag_file_resources, context, trial.resources, e
        )


def refuse_params_beyond_cluster(
    experiment_name: str,
    from_params: FromParams,
    dag_file_resources: Resources,
    context: Mapping[str, Any],
    needed: Resources,
    error: InsufficientResourcesError,
) -> NoReturn:
    """Called by ``suggest_configs`` when the run's params (through ``from_params``) ask for
    ``needed`` per trial and the cluster refused it (``error``): raise an AirflowFailException
    in the wording of the other refusals of a run's params (``TuningPlan.settings_for_run``),
    chained to ``error``; ``error`` itself when the cluster's totals are not known.
    ``dag_file_resources``: resources_per_trial when ``from_params`` leaves it out.

    The cluster refuses a trial beyond its totals (short of GPUs, say), or bundles that its
    totals hold but no node, or no nodes together, could (``error.nodes``; core/placement.py)."""
    lack = None if error.total is None else _lack(needed, error.total, error.nodes)
    if lack is None:
        raise error
    beyond, add, asks_less = lack
    fields = _fields_asking(from_params, dag_file_resources, context, asks_less)
    asks = (
        " and ".join(f"{key} is {value!r}" for key, value, _ in fields)
        if fields
        else "from_params sets resources_per_trial from them"
    )
    lower = (
        " and ".join(f"{key} {default!r} (the form's default)" for key, _, default in fields)
        if fields
        else "params that ask for less"
    )
    raise AirflowFailException(
        f"Experiment {experiment_name}, DAG run {context['ti'].run_id}: the run's params "
        f"are refused: {asks}, so each trial needs {needed.summary_string()}, but {beyond}. No "
        f"trial was started and nothing was written; trigger the DAG again with {lower}{add}."
    ) from error


#: What the cluster lacks: its words (after "but"), the node to add (", or first add ..."), and
#: whether other resources ask for less of it.
_Lack = tuple[str, str, Callable[[Resources], bool]]


def _lack(needed: Resources, total: Resources, nodes: Sequence[Resources] | None) -> _Lack | None:
    """What the cluster lacks for ``needed``: some of its totals, or nodes that hold its bundles;
    None when neither can be told."""
    short = needed.shortfall(total)
    if short:
        missing = ", ".join(f"{_name(k)} by {v:g}" for k, v in short.items())
        options = " ".join(_RAY_START.get(k, f"--resources='{{\"{k}\": N}}'") for k in short)
        return (
            f"the Ray cluster has {total.summary_string()} in total (short of {missing})",
            f", or first add a node with {_names(short)} to the Ray cluster "
            f"(ray start --address=<head address> {options})",
            lambda r: any(r.shortfall(total).get(k, 0.0) < v for k, v in short.items()),
        )
    refusal = None if nodes is None else placement_refusal(needed, nodes)
    if nodes is None or refusal is None:
        return None
    return (
        refusal,
        "",
        lambda r: not r.shortfall(total) and placement_refusal(r, nodes) is None,
    )


def _fields_asking(
    from_params: FromParams,
    dag_file_resources: Resources,
    context: Mapping[str, Any],
    asks_less: Callable[[Resources], bool],
) -> list[tuple[str, Any, Any]]:
    """(param, its value, its default) for each param the run changed whose default asks for
    less of what the cluster lacks (``asks_less``); [] without the DAG (a hand-made context)."""
    dag = context.get("dag")
    if dag is None:
        return []
    params = dict(context["params"])
    defaults = dag.params.dump()
    found = []
    for key in sorted(set(params) & set(defaults)):
        if params[key] == defaults[key]:
            continue
        try:
            settings = from_params({**params, key: defaults[key]})
            resources = Resources.from_dict(settings.get("resources_per_trial", dag_file_resources))
        # A default that does not go with the run's other params (lr_min above lr_max, say)
        # tells nothing about resources: that param is not among those that asked.
        except (ValueError, TypeError, KeyError):
            continue
        if asks_less(resources):
            found.append((key, params[key], defaults[key]))
    return found


def _name(resource: str) -> str:
    return resource.upper() if resource in ("cpu", "gpu") else resource


def _names(short: Mapping[str, float]) -> str:
    names = [f"{_name(k)}s" if k in ("cpu", "gpu") else _name(k) for k in short]
    return " and ".join(names)
