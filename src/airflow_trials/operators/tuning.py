"""What a trial task does for its scheduler and its searcher on the Airflow path.

**ASHA, MOASHA and the median rule.** The task draws the trial's bracket from its ids (the same
on every try) and starts the actor with hold points; its trigger judges each result
(``schedulers/trial_judge.py``) against the state the rule keeps in the trials DB.

**Search that learns.** Each trial task asks the searcher for its config when it starts, from
what the trials DB holds of the run's ended trials.

Trial tasks start as slots free (the GPU pool, ``max_concurrent_trials``), so a task that starts
later asks after more trials ended, as Optuna's distributed workers each ask one shared RDB study.
The ask is stateless: a fresh study is built from the run's ended trials for each ask
(``OptunaSearch.suggest_after``), so nothing but the trials' own rows must survive a triggerer
restart, a worker crash or a retry. A trial's config is asked for once, on its first try, and
stored with it; every later try reads it back.
"""

from __future__ import annotations

import hashlib
import logging
import random
from collections.abc import Mapping, Sequence
from typing import Any

from airflow_trials.core.pareto import MetricSpec, ModeSpec
from airflow_trials.core.searcher import ended_trial_values, ended_trials  # noqa: F401 (its API)
from airflow_trials.schedulers.registry import JudgedScheduler, judged_from_dict, judged_scheduler

log = logging.getLogger(__name__)


def scheduler_settings(scheduler: Any) -> dict[str, Any] | None:
    """An operator's ``scheduler`` as plain values, checked: None, an ASHAScheduler, a MOASHA or
    a MedianStoppingRule, or their settings' dict."""
    if scheduler is None:
        return None
    if isinstance(scheduler, Mapping):
        return judged_from_dict(dict(scheduler)).to_dict()
    return judged_scheduler(scheduler).to_dict()


def needs_run(experiment_run_id: int | None, what: str, task_id: str, trial_id: str) -> int:
    """The experiment run a scheduler or searcher compares the trial with; ValueError without
    one."""
    if experiment_run_id is None:
        raise ValueError(
            f"RunTrialOperator {task_id!r}, trial {trial_id}: {what} the other trials of its "
            "experiment run, "
            "so it needs experiment_run_id (tuning_experiment passes it)."
        )
    return experiment_run_id


def judged_rule(
    settings: Mapping[str, Any] | None, task_id: str, experiment_run_id: int | None, trial_id: str
) -> tuple[JudgedScheduler | None, int]:
    """The scheduler's settings and the trial's (MO)ASHA bracket, drawn from its run and trial
    ids (0 for the median rule); (None, 0) without a scheduler."""
    if settings is None:
        return None, 0
    run_id = needs_run(experiment_run_id, "scheduler= judges a trial against", task_id, trial_id)
    rule = judged_from_dict(dict(settings))
    return rule, rule.draw_bracket(random.Random(f"{run_id}:{trial_id}").random())


def suggested_config(
    store: Any,
    search_alg: Any,
    experiment_run_id: int,
    trial_id: str,
    index: int,
    task_log: Any = log,
    warm_points: Sequence[Sequence[Any]] = (),
) -> dict[str, Any]:
    """The config of trial ``trial_id``: the stored one when an earlier try asked already, else the
    searcher's suggestion after the run's ended trials.

    :param store: the trials store.
    :param search_alg: an ``OptunaSearch`` with its space, metric and mode set.
    :param experiment_run_id: the run whose trials the searcher learns from.
    :param trial_id: the trial asking.
    :param index: its place in the run (its map index): ``points_to_evaluate[index]`` runs first.
    :param task_log: where to say what it suggested (the task's log); default this module's logger.
    :param warm_points: ``[config, value]`` of a warm start's seeds, ``[config, value, last
        result]`` for a searcher with constraints: learnt first (Optuna's ``add_trial``), and the
        first ``len(warm_points)`` trials of the run are the seeds themselves, so
        ``points_to_evaluate`` start after them. Default none.

    The run's ended trials are passed as ``(config, value, last result)``, so that a searcher
    with constraints (``OptunaSearch(constraints=...)``) computes their constraint values.
    """
    trials = store.reader.list_trials(experiment_run_id=experiment_run_id)
    mine = next((t for t in trials if t.trial_id == trial_id), None)
    if mine is not None and mine.config:
        return dict(mine.config)  # asked on an earlier try
    history: list[tuple[Any, ...]] = [
        (dict(config), value, *rest) for config, value, *rest in warm_points
    ]
    # Each with its last result, which a searcher with constraints computes their values from.
    last_results = {t.trial_id: dict(t.last_result or {}) for t in trials}
    finished = history + [
        (config, value, last_results[ended_id])
        for ended_id, config, value in ended_trial_values(
            trials, search_alg.metric, exclude=trial_id
        )
    ]
    config = search_alg.suggest_after(
        trial_id, finished, max(0, index - len(history)), ask_seed(experiment_run_id, trial_id)
    )
    task_log.info(
        "Trial %s: %s suggests %s, having learnt from %d ended trials of the run%s.",
        trial_id,
        type(search_alg).__name__,
        config,
        len(finished) - len(history),
        f" and {len(history)} of its warm start" if history else "",
    )
    return dict(config)


def ask_seed(experiment_run_id: int, trial_id: str) -> int:
    """The seed of a trial's ask: the same on every try, different for each trial of a run."""
    return int(hashlib.sha1(f"{experiment_run_id}:{trial_id}".encode()).hexdigest()[:8], 16)


def airflow_searcher(
    search_alg: Any, search_space: Mapping[str, Any], metric: MetricSpec, mode: ModeSpec
) -> Any:
    """A copy of ``search_alg`` set up for the trial tasks: the experiment's space, metric and mode
    where it has none (several metrics: lists, as ``OptunaSearch`` takes them). ValueError, naming
    the fix, for a searcher the Airflow path cannot ask or one that disagrees with the
    experiment."""
    import copy

    from airflow_trials.searchers.optuna_search import OptunaSearch

    if not isinstance(search_alg, OptunaSearch):
        raise ValueError(
            "tuning_experiment takes search_alg=OptunaSearch(...) only, got "
            f"{type(search_alg).__name__}: each "
            "trial task asks it once, from the run's ended trials in the trials DB. Run other "
            "searchers on "
            "the TrialRunner (docs/engine.md)."
        )
    clash = [
        f"{name} {theirs!r} vs {ours!r}"
        for name, theirs, ours in (
            ("metric", search_alg.metric, metric),
            ("mode", search_alg.mode, mode),
        )
        if theirs and theirs != ours
    ]
    if clash:
        raise ValueError(
            f"The search_alg and the experiment disagree on {', '.join(clash)} (search_alg vs "
            "experiment): "
            "give the search_alg the experiment's metric and mode, or none."
        )
    searcher: Any = copy.deepcopy(search_alg)  # (its set_search_properties takes lists too)
    if not searcher.set_search_properties(metric, mode, search_space) and search_space:
        raise ValueError(
            "The search_alg has a search space of its own and the experiment has one too; give the "
            "space "
            "to one of them only (search_space={} with OptunaSearch(space=...), or OptunaSearch())."
        )
    searcher.take_metric(metric, mode)
    return searcher
