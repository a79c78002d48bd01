"""Extending a finished experiment run (``airflow-trials extend``): what an extension may change,
which of the run's trials continue, and how ASHA's rungs extend. Pure: the CLI and the
extension's ``suggest_configs`` both ask :func:`plan_extension`, so they refuse alike.

The rules, as docs/airflow.md states them:

* Refused: a run that is still RUNNING (or has a trial that has not ended); a stopping criterion
  lower than the run's (or one that drops a key); a search space other than the run's; an
  extension that adds no sample and raises no criterion; new samples of a space that draws
  nothing at random (a grid alone), which could only repeat the run's configs.
* New samples continue the run's search: its seeded random sequence, or its searcher, told every
  ended trial of the run first. A sample is one pass over the space's grid, as Ray Tune's
  ``num_samples`` is: N new samples of a grid of G combinations are N x G new trials, each pass
  drawing the random keys afresh (:func:`describe_new_samples`).
* A raised criterion continues the TERMINATED trials from their latest checkpoint. Those that
  ASHA (or another scheduler) stopped early keep that verdict, those whose trainable finished on
  its own have nothing left to run, and a trial with no checkpoint is never restarted from scratch:
  each keeps its end, with the reason in the plan.
* ASHA: the rungs are those of the raised ``max_t`` (``max_t`` rises to the new criterion of its
  ``time_attr``); the rungs below the old ``max_t`` are the same milestones, so the verdicts
  recorded there stand, and the continued trials are judged at the new rungs only.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from airflow_trials.core.fate import StoredTrial
from airflow_trials.core.search import count_configs, drawn_keys, grid_keys
from airflow_trials.core.status import TrialStatus
from airflow_trials.core.stop_kind import StopKind
from airflow_trials.exceptions import ExtensionRefusedError

#: The key of a sweep extension's first trial entry that gives its ASHA the raised max_t.
SWEEP_MAX_T = "scheduler_max_t"


@dataclass(frozen=True)
class ExtensionPlan:
    """What an extension does to its run.

    :param continued: ids of the TERMINATED trials that continue from their latest checkpoint.
    :param kept: ``(trial id, why)`` of the ended trials that keep their end.
    :param stop_after: the raised stopping criterion; None when it is unchanged.
    """

    continued: list[str]
    kept: list[tuple[str, str]] = field(default_factory=list)
    stop_after: dict[str, float] | None = None


@dataclass(frozen=True)
class ExtensionLimits:
    """The most one extension may ask for, so that it cannot go past what its DAG allows a run.

    :param max_num_samples: the most new samples.
    :param num_samples_from: where that ceiling comes from and how to raise it, for the refusal.
    :param max_stop: the highest raised stop per key (keys not here are not bounded: a key the
        run's criterion lacks can only stop its trials sooner).
    :param stop_from: where those ceilings come from and how to raise them, for the refusal.
    """

    max_num_samples: int
    num_samples_from: str
    max_stop: Mapping[str, float] = field(default_factory=dict)
    stop_from: str = ""


def _check_limits(
    owner: str, num_samples: int, stop: Mapping[str, float] | None, limits: ExtensionLimits
) -> None:
    if num_samples > limits.max_num_samples:
        raise ExtensionRefusedError(
            f"{owner}: {num_samples} new samples is above {limits.max_num_samples}, the most one "
            f"extension may add ({limits.num_samples_from}); nothing was written."
        )
    above = [
        f"{key}={value} (at most {limits.max_stop[key]:g})"
        for key, value in (stop or {}).items()
        if key in limits.max_stop and value > limits.max_stop[key]
    ]
    if above:
        raise ExtensionRefusedError(
            f"{owner}: the stop {', '.join(above)} is above what one extension may ask for "
            f"({limits.stop_from}); nothing was written."
        )


def checked_stop(stop: Any, owner: str) -> dict[str, float] | None:
    """``stop`` as ``{metric: number}`` (None: unchanged); ExtensionRefusedError otherwise."""
    if stop is None or stop == {}:
        return None
    if not isinstance(stop, Mapping) or not all(
        isinstance(k, str)
        and isinstance(v, int | float)
        and not isinstance(v, bool)
        and math.isfinite(v)
        for k, v in stop.items()
    ):
        raise ExtensionRefusedError(
            f"{owner}: the stop {stop!r} is not a mapping of metric names to finite numbers; "
            'nothing was written. Give it as e.g. {"training_iteration": 20} '
            "(CLI: --stop training_iteration=20)."
        )
    return {str(k): v for k, v in stop.items()}


def plan_extension(
    *,
    owner: str,
    run_status: str,
    trials: Sequence[StoredTrial],
    stop_before: Mapping[str, float] | None,
    stop: Mapping[str, float] | None,
    num_samples: int,
    has_checkpoint: Callable[[str], bool],
    space_before: Any = None,
    space_now: Any = None,
    limits: ExtensionLimits | None = None,
) -> ExtensionPlan:
    """Check an extension of a run and say which trials continue; ExtensionRefusedError, naming
    ``owner`` (the run), why and the fix, for each refusal of the module's docstring.

    :param owner: e.g. ``"Run manual__1 (id 3) of experiment mnist"``.
    :param run_status: the run's status (RUNNING, SUCCESS, FAILED).
    :param trials: the run's trials as stored.
    :param stop_before: the run's stopping criterion (its latest extension's, else its own);
        None when not known (no lower-criterion check then).
    :param stop: the criterion asked for; None or the same: unchanged.
    :param num_samples: new trials asked for (>= 0).
    :param has_checkpoint: whether a trial has a checkpoint to continue from.
    :param space_before: the run's stored search space; None: not checked.
    :param space_now: the search space the extension would run with; None: not checked.
    :param limits: the ceilings of the DAG that runs the extension; None: not checked (the CLI,
        which does not know them; the DAG run checks them).
    """
    _refuse_running_run(owner, run_status, trials)
    _refuse_bad_samples(owner, num_samples)
    raised = _raised_stop(owner, stop_before, checked_stop(stop, owner))
    if limits is not None:
        _check_limits(owner, num_samples, raised, limits)
    if num_samples == 0 and raised is None:
        raise ExtensionRefusedError(
            f"{owner}: the extension adds no sample and raises no stopping criterion, so it "
            "would change nothing; nothing was written. Ask for --num-samples +N and/or a higher "
            "--stop."
        )
    _refuse_other_space(owner, space_before, space_now)
    _refuse_repeated_configs(owner, num_samples, space_before)
    if raised is None:
        return ExtensionPlan([])
    continued, kept = [], []
    for trial in trials:
        why = _keeps_its_end(trial, raised, has_checkpoint)
        if why is None:
            continued.append(trial.trial_id)
        else:
            kept.append((trial.trial_id, why))
    return ExtensionPlan(continued, kept, raised)


def _refuse_running_run(owner: str, run_status: str, trials: Sequence[StoredTrial]) -> None:
    """A run that still runs, or has a trial not ended, is not extended."""
    busy = [t.trial_id for t in trials if not t.status.is_terminal()]
    if run_status == "RUNNING" or busy:
        still = f" (trials {', '.join(busy[:5])} have not ended)" if busy else ""
        raise ExtensionRefusedError(
            f"{owner} is still running{still}; an extension continues a finished run only, and "
            "nothing was written. Wait for the run (or the extension running it) to end, then "
            "extend it. A DAG run marked failed in Airflow does not end the run (select_best "
            "never runs): end it with 'airflow-trials db end-run EXPERIMENT --run RUN "
            "--reason ...' first."
        )


def _refuse_bad_samples(owner: str, num_samples: Any) -> None:
    """New samples are a whole number >= 0."""
    if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 0:
        raise ExtensionRefusedError(
            f"{owner}: {num_samples!r} new samples is not a whole number >= 0; nothing was "
            "written. Ask for --num-samples +N with N >= 0."
        )


def _refuse_other_space(owner: str, space_before: Any, space_now: Any) -> None:
    """An extension runs the run's own search space (when both are known)."""
    if (
        space_before is not None
        and space_now is not None
        and _canonical(space_before) != (_canonical(space_now))
    ):
        raise ExtensionRefusedError(
            f"{owner} searched the space {_canonical(space_before)}, but the DAG now has "
            f"{_canonical(space_now)}; an extension continues the run's own search, so nothing "
            "was written. Trigger a new run of the DAG for the new space (warm_start=<run key> "
            "seeds it with this run's best), or restore the run's search space to extend it."
        )


def _refuse_repeated_configs(owner: str, num_samples: int, space: Any) -> None:
    """New samples of a space that draws nothing at random (a grid alone, or fixed values) are
    the configs the run was given already: refused (when the space is known)."""
    if num_samples == 0 or not isinstance(space, Mapping) or drawn_keys(space):
        return
    grid = grid_keys(space)
    what = (
        f"a grid over {', '.join(grid)} ({count_configs(space)} combinations)"
        if grid
        else "fixed values (one config)"
    )
    raise ExtensionRefusedError(
        f"{owner}: its search space is {what} and draws nothing at random, so {num_samples} new "
        "sample(s) would only run the configs the run was given again; nothing was written. "
        "Raise --stop to train its trials longer, or trigger a new run of the DAG with a wider "
        "grid or a random domain (warm_start=<run key> seeds it with this run's best)."
    )


def describe_new_samples(num_samples: int, space: Any) -> str:
    """What ``num_samples`` new samples add to a run of ``space`` (its stored search space; None
    when not known), for the CLI's plan: a sample is one pass over the grid, as Ray Tune's
    ``num_samples`` is."""
    if not isinstance(space, Mapping) or num_samples == 0:
        return f"+{num_samples} samples"
    grid = grid_keys(space)
    if not grid:
        return f"+{num_samples} samples ({num_samples} new trials)"
    combinations, drawn = count_configs(space), drawn_keys(space)
    afresh = f", each drawing {', '.join(drawn)} afresh" if drawn else ""
    return (
        f"+{num_samples} samples ({num_samples} pass(es) over the grid's {combinations} "
        f"combinations{afresh}, as Ray Tune's num_samples does: {num_samples * combinations} "
        "new trials)"
    )


def _raised_stop(
    owner: str, before: Mapping[str, float] | None, after: dict[str, float] | None
) -> dict[str, float] | None:
    if after is None or (before is not None and dict(before) == after):
        return None
    lower = [
        f"{key}={after.get(key, 'none')} (was {value})"
        for key, value in (before or {}).items()
        if key not in after or after[key] < value
    ]
    if lower:
        raise ExtensionRefusedError(
            f"{owner}: the stop {after} lowers or drops the run's stopping criterion "
            f"{dict(before or {})}: {', '.join(lower)}; a finished trial cannot un-train, so "
            "nothing was written. Ask for a stop at or above the run's on every key."
        )
    return {**dict(before or {}), **after}


def _keeps_its_end(
    trial: StoredTrial, stop: Mapping[str, float], has_checkpoint: Callable[[str], bool]
) -> str | None:
    """Why an ended trial does not continue under ``stop``; None when it continues."""
    if trial.status is not TrialStatus.TERMINATED:
        return f"it ended {trial.status.value}; an extension continues TERMINATED trials only"
    if trial.stop_kind is StopKind.SCHEDULER:
        return f"its scheduler stopped it early ({trial.stop_reason}); that verdict stands"
    if trial.stop_kind is StopKind.FINISHED:
        return "its trainable finished on its own; it has nothing left to train"
    last = dict(trial.last_result or {})
    if all(key in last and last[key] >= value for key, value in stop.items()):
        return f"it already meets the stop {dict(stop)}"
    if not has_checkpoint(trial.trial_id):
        return (
            "it has no checkpoint to continue from, and is never restarted from scratch; "
            "checkpoint the trainable (checkpoint_at_end=True) to continue such trials"
        )
    return None


def extended_scheduler(
    settings: Mapping[str, Any] | None, stop: Mapping[str, float] | None
) -> dict[str, Any] | None:
    """A rung scheduler's settings (ASHA's, MOASHA's ``to_dict()``) for an extension: ``max_t``
    raised to ``stop``'s value of its ``time_attr`` when that is higher; others unchanged."""
    if settings is None:
        return None
    extended = dict(settings)
    time_attr, max_t = extended.get("time_attr"), extended.get("max_t")
    if stop and max_t is not None and isinstance(time_attr, str) and stop.get(time_attr, 0) > max_t:
        extended["max_t"] = stop[time_attr]
    return extended


def _canonical(space: Any) -> str:
    return json.dumps(space, sort_keys=True, default=str)
