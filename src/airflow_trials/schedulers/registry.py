"""The schedulers the Airflow path can run, as the plain settings a trial's trigger judges by.

Each trial task is watched by a trigger of its own, so a scheduler that compares trials keeps
what it compares in the trials store, and the trigger judges each of its trial's results against
it. Three schedulers decide that way, one result of one trial at a time:

- ``ASHAScheduler`` / ``AsyncHyperBandScheduler``:
:class:`~airflow_trials.schedulers.asha.asha_rungs.AshaRungs`
  (one row per trial and rung);
- ``MOASHA``: :class:`~airflow_trials.schedulers.moasha.moasha_scheduler.MOASHARungs` (one row per
trial and rung, its
  vector of metric values);
- ``MedianStoppingRule``: :class:`MedianRule` (one running mean per trial and result from
  ``grace_period``).

:func:`judged_scheduler` turns the user's scheduler into one of them, checked against the
experiment's metric and mode (MOASHA's: the experiment's lists); :func:`judged_from_dict` reads
one back from an operator's or a trigger's serialized settings, by the ``RULE_KEY`` that MOASHA's
and the median rule's carry (ASHA's have none). HyperBand and PBT pause and resume trials
together, or clone one trial into another: a deferred task cannot be paused, so they run on the
TrialRunner.

Example::

    rule = judged_scheduler(MedianStoppingRule(time_attr="training_iteration", grace_period=3),
                            metric="loss", mode="min")
    rule.hold_spec(bracket=0)
    # {"time_attr": "training_iteration", "points": [], "every_from": 3.0}
"""

from __future__ import annotations

from typing import Any

from airflow_trials.schedulers.asha.asha_rungs import AshaRungs
from airflow_trials.schedulers.asha.async_hyperband import AsyncHyperBandScheduler
from airflow_trials.schedulers.median.median_rule import MEDIAN, RULE_KEY, MedianRule
from airflow_trials.schedulers.median.median_stopping import MedianStoppingRule
from airflow_trials.schedulers.moasha.moasha_scheduler import MOASHA, MOASHA_RULE, MOASHARungs

__all__ = ["RULE_KEY", "JudgedScheduler", "MedianRule", "judged_from_dict", "judged_scheduler"]

JudgedScheduler = AshaRungs | MOASHARungs | MedianRule


def judged_scheduler(scheduler: Any, metric: Any = None, mode: Any = None) -> JudgedScheduler:
    """The Airflow path's settings of ``scheduler``: its metric and mode, or the experiment's where
    it has none (as Ray Tune's Tuner fills them from TuneConfig; MOASHA's are lists, and must be
    the experiment's). ValueError, naming the fix, for a scheduler the Airflow path cannot run or
    one that disagrees with the experiment."""
    if isinstance(scheduler, MOASHA):
        return scheduler.rule(metric, mode)
    if isinstance(scheduler, MedianStoppingRule):
        rule = scheduler.rule(metric, mode)
        if not scheduler.hard_stop:
            raise ValueError(
                "MedianStoppingRule(hard_stop=False) pauses the trials it judges worse, to resume "
                "them later; a deferred trial task cannot be paused on the Airflow path. Use "
                "hard_stop=True (the default), or run the rule on the TrialRunner (docs/engine.md)."
            )
        return rule
    if not isinstance(scheduler, AsyncHyperBandScheduler):
        raise ValueError(
            f"tuning_experiment takes scheduler=ASHAScheduler(...), MOASHA(...) or "
            f"MedianStoppingRule(...) only, got {type(scheduler).__name__}: each trial task is "
            "judged by its own trigger against the state those keep in the trials DB. "
            "HyperBandScheduler and "
            "PopulationBasedTraining pause or clone trials together: run them on the TrialRunner "
            "(docs/engine.md), e.g. from one task."
        )
    return scheduler.rule(metric, mode)


def judged_from_dict(settings: dict[str, Any]) -> JudgedScheduler:
    """A scheduler's settings back from ``to_dict`` (AshaRungs', MOASHARungs' or MedianRule's);
    ValueError for a ``RULE_KEY`` none of them writes."""
    values = dict(settings)
    rule = values.pop(RULE_KEY, None)
    if rule == MEDIAN:
        return MedianRule(**values)
    if rule == MOASHA_RULE:
        return MOASHARungs(**values)
    if rule is not None:
        raise ValueError(
            f"Scheduler settings {settings!r} name {RULE_KEY}={rule!r}, which is not a rule the "
            f"Airflow path judges by ({MEDIAN!r}, {MOASHA_RULE!r}, or none for ASHA); pass "
            "the to_dict() of ASHAScheduler's, MOASHA's or MedianStoppingRule's rule."
        )
    return AshaRungs(**values)
