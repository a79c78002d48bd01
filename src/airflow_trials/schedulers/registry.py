"""The schedulers the Airflow path can run, found as slices: their settings, and a trial's judge.

Each trial task is watched by a trigger of its own, so a scheduler that compares trials keeps
what it compares in the trials DB, and the trigger judges each of its trial's results against it.
A slice that decides that way, one result of one trial at a time, says so with a ``SLICE``
(:class:`~airflow_trials.schedulers.trial_judge.JudgedSlice`) in a module of its own named
``*_judging`` under ``schedulers/``; :func:`slices` finds them all, so adding one edits nothing
here. Today: ASHA (``asha/asha_judging.py``, one row per trial and rung), MOASHA
(``moasha/moasha_judging.py``, one row per trial and rung, its vector of metric values) and the
median stopping rule (``median/median_judging.py``, one running mean per trial and result from
``grace_period``). HyperBand and PBT pause and resume trials together, or clone one trial into
another: a deferred task cannot be paused, so they run on the TrialRunner.

:func:`judged_scheduler` turns the user's scheduler into its slice's settings, checked against
the experiment's metric and mode (MOASHA's: the experiment's lists); :func:`judged_from_dict`
reads them back from an operator's or a trigger's serialized settings, by the ``RULE_KEY`` they
carry (ASHA's have none); :func:`judge_for` gives a trial's trigger its judge.

Example::

    rule = judged_scheduler(MedianStoppingRule(time_attr="training_iteration", grace_period=3),
                            metric="loss", mode="min")
    rule.hold_spec(bracket=0)
    # {"time_attr": "training_iteration", "points": [], "every_from": 3.0}
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from collections.abc import Mapping
from typing import Any

import airflow_trials.schedulers as package
from airflow_trials.core.scheduler import RULE_KEY
from airflow_trials.schedulers.trial_judge import Judge, JudgedSettings, JudgedSlice

__all__ = [
    "RULE_KEY",
    "JudgedScheduler",
    "judge_for",
    "judged_from_dict",
    "judged_scheduler",
    "slices",
]

#: A slice's Airflow-path settings (``AshaRungs``, ``MOASHARungs``, ``MedianRule``).
JudgedScheduler = JudgedSettings


@functools.cache
def slices() -> tuple[JudgedSlice, ...]:
    """Every slice that judges on the Airflow path: the ``SLICE`` of each ``*_judging`` module
    under ``schedulers/``, by scheduler name."""
    found = []
    for module in pkgutil.walk_packages(package.__path__, f"{package.__name__}."):
        if module.name.endswith("_judging"):
            found.append(importlib.import_module(module.name).SLICE)
    return tuple(sorted(found, key=lambda s: s.name))


def _names(joined: str) -> str:
    names = [f"{s.name}{joined}" for s in slices()]
    return ", ".join(names[:-1]) + f" or {names[-1]}"


def judged_scheduler(scheduler: Any, metric: Any = None, mode: Any = None) -> JudgedScheduler:
    """The Airflow path's settings of ``scheduler``: its metric and mode, or the experiment's where
    it has none (as Ray Tune's Tuner fills them from TuneConfig; MOASHA's are lists, and must be
    the experiment's). ValueError, naming the fix, for a scheduler the Airflow path cannot run or
    one that disagrees with the experiment."""
    for judged in slices():
        if isinstance(scheduler, judged.scheduler):
            return judged.settings(scheduler, metric, mode)
    raise ValueError(
        f"tuning_experiment takes scheduler={_names('(...)')} only, got "
        f"{type(scheduler).__name__}: each trial task is judged by its own trigger against the "
        "state those keep in the trials DB. HyperBandScheduler and "
        "PopulationBasedTraining pause or clone trials together: run them on the TrialRunner "
        "(docs/engine.md), e.g. from one task."
    )


def judged_from_dict(settings: Mapping[str, Any]) -> JudgedScheduler:
    """A scheduler's settings back from their ``to_dict``; ValueError for a ``RULE_KEY`` no slice
    writes."""
    values = dict(settings)
    rule = values.pop(RULE_KEY, None)
    for judged in slices():
        if judged.rule_key == rule:
            settings_type: Any = judged.settings_type
            return settings_type(**values)
    keys = ", ".join(repr(s.rule_key) for s in slices() if s.rule_key is not None)
    owners = _names("'s")
    raise ValueError(
        f"Scheduler settings {dict(settings)!r} name {RULE_KEY}={rule!r}, which is not a rule the "
        f"Airflow path judges by ({keys}, or none for ASHA); pass the to_dict() of "
        f"{owners} rule."
    )


def judge_for(
    settings: Mapping[str, Any], bracket: int, experiment_run_id: int, trial_id: str
) -> Judge:
    """The judge of a trigger's ``scheduler`` settings (a slice's, as a dict) for one trial."""
    rule = judged_from_dict(settings)
    for judged in slices():
        if isinstance(rule, judged.settings_type):
            return judged.judge(rule, bracket, experiment_run_id, trial_id)
    raise ValueError(f"No slice judges {type(rule).__name__}.")  # judged_from_dict made it
