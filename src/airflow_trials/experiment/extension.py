"""An extension DAG run: the trigger form's "Extend a finished run" params, and what its
``suggest_configs`` does with them (records the extension, continues trials, adds samples).

The rules (what is refused, which trials continue, how ASHA's rungs extend) are
:func:`~airflow_trials.core.run_extension.plan_extension`'s; the CLI asks the same function.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Any

from airflow.sdk import Param
from airflow.sdk.exceptions import AirflowFailException

from airflow_trials.core.run_extension import (
    SWEEP_MAX_T,
    ExtensionLimits,
    checked_stop,
    extended_scheduler,
    plan_extension,
)
from airflow_trials.core.search import generate_configs
from airflow_trials.exceptions import ExperimentNotFoundError, ExtensionRefusedError
from airflow_trials.experiment.settings import ExperimentSettings, trial_ids
from airflow_trials.hooks.trials import TrialsHook
from airflow_trials.provider_config import setting_float, setting_int, setting_source
from airflow_trials.schedulers.asha.async_hyperband import raised_max_t

log = logging.getLogger(__name__)

EXTEND_RUN = "extend_run"
EXTEND_NUM_SAMPLES = "extend_num_samples"
EXTEND_STOP = "extend_stop"
SECTION = "Extend a finished run"


def extension_params() -> dict[str, Param]:
    """The params ``tuning_experiment`` adds to its DAG: unset, a run is a normal run."""
    return {
        EXTEND_RUN: Param(
            None,
            type=["null", "string"],
            title="Run to extend",
            description="The run key (Airflow run id) or id of a finished run of this experiment;"
            " empty: a normal run.",
            section=SECTION,
        ),
        EXTEND_NUM_SAMPLES: Param(
            0,
            type="integer",
            minimum=0,
            title="New samples",
            description="New trials that continue the run's search; at most the maximum of "
            "the DAG's num_samples param, else [airflow_trials] extension_max_num_samples.",
            section=SECTION,
        ),
        EXTEND_STOP: Param(
            None,
            type=["null", "object"],
            title="Raised stop",
            description='e.g. {"training_iteration": 20}: the run\'s TERMINATED trials continue '
            "from their latest checkpoint to it; at most [airflow_trials] "
            "extension_max_stop_factor (default 10) times the run's stop.",
            section=SECTION,
        ),
    }


def add_extension_params(dag: Any) -> None:
    """Declare the extension params on ``dag`` (once, whatever its experiments)."""
    for name, param in extension_params().items():
        if name not in dag.params:
            dag.params[name] = param


def extension_requested(context: Mapping[str, Any]) -> bool:
    """Does this DAG run extend a finished run (its ``extend_run`` param is set)?"""
    return bool((context.get("params") or {}).get(EXTEND_RUN))


def extension_entries(
    plan: Any, context: Mapping[str, Any], run: ExperimentSettings
) -> list[dict[str, Any]]:
    """Record the extension of ``plan`` (the experiment's TuningPlan) and return the mapped
    entries of its trials: the continued trials
    (same ids, raised stop) and the new ones; a sweep also gets the run's other trials, which its
    driver skips as ended and tells its searcher."""
    ti = context["ti"]
    hook = TrialsHook(plan.ray_conn_id, plan.trials_conn_id)
    store = hook.get_store()
    try:
        target, owner = _target_run(store, plan, ti, str(context["params"][EXTEND_RUN]))
        earlier = store.reader.list_run_extensions(target.id)
        mine = next((e for e in earlier if e.dag_run_id == ti.run_id), None)
        stop_before = next(
            (e.stop_after for e in reversed(earlier) if e.stop_after and e is not mine), run.stop
        )
        if mine is None:
            mine = _begin(store, plan, context, run, target, owner, earlier, stop_before)
        from airflow_trials.store.transitions import ContinueWithRaisedStop

        for trial_id in mine.trials_continued:  # a retry finds them PENDING already: no-op
            store.record_transition(trial_id, ContinueWithRaisedStop(ti.run_id))
        log.info(
            "%s is extended by DAG run %s: %s; trials continued: %s; new trials: %s.",
            owner,
            ti.run_id,
            mine.changes(),
            ", ".join(mine.trials_continued) or "none",
            ", ".join(mine.trials_added) or "none",
        )
        previous = [e for e in earlier if e is not mine]
        configs = _new_configs(plan, run, target, previous, mine.num_samples_added)
        by_id = {r.trial_id: r for r in store.reader.list_trials(experiment_run_id=target.id)}
    except ExtensionRefusedError as e:
        raise AirflowFailException(
            f"Experiment {plan.experiment_name}, DAG run {ti.run_id}: the extension is refused: {e}"
        ) from e
    finally:
        store.dispose()
    per_run = _per_run_settings(plan, run, mine.stop_after or stop_before)
    entries = _entries(plan, target.id, mine, configs, by_id)
    if not entries:
        raise AirflowFailException(
            f"Experiment {plan.experiment_name}, DAG run {ti.run_id}: the extension of run "
            f"{target.run_key} has no trial to run (every trial keeps its end; see the warnings "
            "above). Ask for new samples (extend_num_samples)."
        )
    return [{**entry, **per_run} for entry in entries]


def _target_run(store: Any, plan: Any, ti: Any, owner_run: str) -> tuple[Any, str]:
    """The finished run to extend, and how messages name it; ExtensionRefusedError when there is
    no such run of the experiment or another DAG ran it."""
    try:
        target = store.reader.resolve_run(plan.experiment_name, owner_run)
    except ExperimentNotFoundError as e:
        raise ExtensionRefusedError(str(e)) from e
    owner = f"Run {target.run_key} (id {target.id}) of experiment {plan.experiment_name}"
    if target.dag_id not in (None, ti.dag_id):
        raise ExtensionRefusedError(
            f"{owner} was run by DAG {target.dag_id}, not {ti.dag_id}; nothing was written. "
            f"Extend it from its own DAG (airflow-trials extend {target.id} triggers it)."
        )
    return target, owner


def _begin(
    store: Any,
    plan: Any,
    context: Mapping[str, Any],
    run: ExperimentSettings,
    target: Any,
    owner: str,
    earlier: list[Any],
    stop_before: Any,
) -> Any:
    """This DAG run's first try: decide which trials continue and how many are added (ending in
    ExtensionRefusedError when it cannot), and record the extension."""
    ti, params = context["ti"], context["params"]
    decision = plan_extension(
        owner=owner,
        run_status=target.status.value,
        trials=store.reader.list_trials(experiment_run_id=target.id),
        stop_before=stop_before,
        stop=checked_stop(params.get(EXTEND_STOP), owner),
        num_samples=int(params.get(EXTEND_NUM_SAMPLES) or 0),
        has_checkpoint=lambda t: store.reader.latest_checkpoint(t) is not None,
        space_before=target.search_space,
        space_now=run.search_space,
        limits=extension_limits(context, run),
    )
    for trial_id, why in decision.kept:
        log.warning("Extension of %s: trial %s keeps its end: %s.", owner, trial_id, why)
    num_samples = int(params.get(EXTEND_NUM_SAMPLES) or 0)
    new_count = len(_new_configs(plan, run, target, earlier, num_samples))
    return store.begin_run_extension(
        target.id,
        ti.run_id,
        num_samples_added=num_samples,
        stop_before=stop_before if decision.stop_after else None,
        stop_after=decision.stop_after,
        trials_continued=decision.continued,
        trials_added=trial_ids(plan.experiment_name, ti.dag_id, ti.run_id, new_count),
    )


def _per_run_settings(plan: Any, run: ExperimentSettings, stop: Any) -> dict[str, Any]:
    """The settings every extended trial runs with: the run's, to the raised ``stop``."""
    per_run: dict[str, Any] = (
        plan._per_trial_settings(run) if plan.from_params is not None else plan.varying(run)
    )
    per_run["stopping_criterion"] = stop
    per_run["scheduler"] = extended_scheduler(per_run.get("scheduler"), stop)
    if plan.sweep and (max_t := raised_max_t(plan.scheduler, stop)) is not None:
        per_run[SWEEP_MAX_T] = max_t  # the sweep's ASHA runs to the raised stop
    return per_run


def _entries(
    plan: Any, run_pk: int, mine: Any, configs: list[Any], by_id: Mapping[str, Any]
) -> list[dict[str, Any]]:
    """The continued trials, then the new ones; a sweep's other trials first."""
    entries = [
        {"trial_id": t, "config": dict(by_id[t].config), "experiment_run_id": run_pk}
        for t in mine.trials_continued
    ]
    entries += [
        {"trial_id": t, "config": c, "experiment_run_id": run_pk}
        for t, c in zip(mine.trials_added, configs, strict=True)
    ]
    if plan.sweep:  # the driver skips ended trials and tells its searcher each of them
        listed = {e["trial_id"] for e in entries}
        entries = [
            {"trial_id": t, "config": dict(r.config), "experiment_run_id": run_pk}
            for t, r in by_id.items()
            if t not in listed
        ] + entries
    return entries


def extension_limits(context: Mapping[str, Any], run: ExperimentSettings) -> ExtensionLimits:
    """The ceilings of an extension run by this DAG, so that it asks for no more than its DAG
    allows a run: new samples at most the ``maximum`` of the DAG's ``num_samples`` Param (the
    trigger form's limit on a run's samples), else ``[airflow_trials] extension_max_num_samples``;
    a raised stop at most ``[airflow_trials] extension_max_stop_factor`` times this DAG run's
    stopping criterion (the DAG file's, or ``from_params``'), key by key."""
    try:
        maximum = _param_maximum(context, "num_samples")
        if maximum is not None:
            max_num_samples = int(maximum)
            num_samples_from = "the maximum of the DAG's num_samples Param; raise it to allow more"
        else:
            option = "extension_max_num_samples"
            max_num_samples = setting_int(option)
            num_samples_from = f"{setting_source(option)}; raise it to allow more"
        option = "extension_max_stop_factor"
        factor = setting_float(option)
        if not 1 <= factor < math.inf or max_num_samples < 0:
            raise ValueError(
                f"{setting_source(option)} is {factor:g} and the most new samples "
                f"{max_num_samples}: the factor must be a finite number >= 1 and the samples "
                ">= 0; fix the setting."
            )
    except ValueError as e:
        raise ExtensionRefusedError(f"{e} Nothing was written.") from e
    return ExtensionLimits(
        max_num_samples=max_num_samples,
        num_samples_from=num_samples_from,
        max_stop={key: value * factor for key, value in (run.stop or {}).items()},
        stop_from=f"{factor:g} times the run's stopping criterion {run.stop}, "
        f"{setting_source(option)}; raise it to allow more",
    )


def _param_maximum(context: Mapping[str, Any], name: str) -> float | None:
    """The ``maximum`` of the DAG's Param ``name``; None when it has no such Param or bound."""
    params = getattr(context.get("dag"), "params", None)
    if params is None or name not in params:
        return None
    maximum = params.get_param(name).schema.get("maximum")
    number = isinstance(maximum, int | float) and not isinstance(maximum, bool)
    return maximum if number else None


def _new_configs(
    plan: Any, run: ExperimentSettings, target: Any, earlier: list[Any], num_samples: int
) -> list[dict[str, Any]]:
    """The new trials' configs: with a searcher ``{}`` (each is asked, after the run's ended
    trials); else the next ones of the run's seeded sequence, after the run's and its earlier
    extensions' samples."""
    if num_samples == 0:
        return []
    if plan.search_alg is not None:
        return [{}] * num_samples
    before = (target.num_samples or 0) + sum(e.num_samples_added for e in earlier)
    sequence = generate_configs(run.search_space, before + num_samples, target.seed)
    return sequence[len(generate_configs(run.search_space, before, target.seed)) if before else 0 :]
