"""ResourceLedger: what the Ray cluster has in total and on each node, and what this process's
trials hold of it."""

from __future__ import annotations

import logging
import time

import ray

from airflow_trials.core.placement import placement_refusal
from airflow_trials.core.resources import InsufficientResourcesError, Resources
from airflow_trials.core.trial import Trial

log = logging.getLogger(__name__)


class ResourceLedger:
    """Answers "can this trial ever fit?" and "can it start now?" for one executor.

    The totals come from ``ray.cluster_resources()``, re-read at most every ``refresh_period_s``;
    each node's, for "could its bundles ever be placed?" (:mod:`~airflow_trials.core.placement`),
    from ``ray.nodes()`` as often, when asked. What is committed is what the executor's running
    trials hold (:meth:`commit`, :meth:`free`): the sum of their bundles. Whether the bundles of a
    trial that fits what is free find room on the nodes now is Ray's to say: its placement group
    waits until they do.

    :param queue_trials: let one trial start although the cluster lacks free resources now, so an
        autoscaler can add nodes, and never refuse a trial as too big; default False.
    :param refresh_period_s: how often cluster totals are re-read from Ray; default 1.
    """

    def __init__(self, *, queue_trials: bool = False, refresh_period_s: float = 1.0) -> None:
        self.queue_trials = queue_trials
        self.refresh_period_s = refresh_period_s
        self.committed = Resources(cpu=0)
        self._total = Resources(cpu=0)
        self._last_refresh = float("-inf")
        self._trial_queued = False
        self._nodes: list[Resources] | None = None
        self._nodes_read_at = float("-inf")
        self._refusals: dict[Resources, str | None] = {}  # per request, on the nodes read

    def refresh(self, force: bool = False) -> None:
        """Re-read the cluster's totals from Ray if ``refresh_period_s`` passed (or ``force``)."""
        now = time.monotonic()
        if force or now - self._last_refresh >= self.refresh_period_s:
            self._total = Resources.from_ray(ray.cluster_resources())
            self._last_refresh = now

    def total(self) -> Resources:
        """Everything the live cluster has, re-read at most every ``refresh_period_s``."""
        self.refresh()
        return self._total

    def nodes(self) -> list[Resources]:
        """Each live node's total resources, re-read at most every ``refresh_period_s``."""
        now = time.monotonic()
        if self._nodes is None or now - self._nodes_read_at >= self.refresh_period_s:
            self._nodes = [Resources.from_ray(n["Resources"]) for n in ray.nodes() if n["Alive"]]
            self._nodes_read_at = now
            self._refusals.clear()
        return self._nodes

    def _placement_refusal(self, resources: Resources) -> str | None:
        """Why no node (or no nodes together) could ever hold ``resources``' bundles; None if
        they could. Asked once per request shape while the nodes stay the same."""
        nodes = self.nodes()
        if resources not in self._refusals:
            self._refusals[resources] = placement_refusal(resources, nodes)
        return self._refusals[resources]

    def commit(self, resources: Resources) -> None:
        self.committed = self.committed + resources

    def free(self, resources: Resources) -> None:
        self.committed = self.committed - resources

    def fits_cluster(self, resources: Resources) -> bool:
        """Could ``resources`` ever be granted on this cluster, with nothing else running: the
        sum of its bundles in the cluster's totals, and the bundles on its nodes?"""
        return resources.fits_in(self.total()) and self._placement_refusal(resources) is None

    def check_fits_cluster(self, trial: Trial) -> None:
        """Raise InsufficientResourcesError if the trial can never fit (unless queue_trials)."""
        if self.queue_trials:
            return
        total, needed = self.total(), trial.resources
        which = f"Trial {trial.trial_id} of experiment {trial.experiment_name} needs"
        shortfall = needed.shortfall(total)
        if shortfall:
            missing = ", ".join(f"{k} by {v:g}" for k, v in shortfall.items())
            raise InsufficientResourcesError(
                f"{which} {needed.summary_string()} but the Ray cluster has "
                f"{total.summary_string()} in total (short of {missing}); lower the trial's "
                f"resources, add nodes, or pass queue_trials=True on an autoscaling cluster.",
                needed=needed,
                total=total,
            )
        refusal = self._placement_refusal(needed)
        if refusal is not None:
            raise InsufficientResourcesError(
                f"{which} {needed.summary_string()}, but {refusal}; or pass queue_trials=True on "
                f"an autoscaling cluster.",
                needed=needed,
                total=total,
                nodes=self.nodes(),
            )

    def has_resources(self, resources: Resources) -> bool:
        """Can a trial with ``resources`` start now, given what running trials hold?"""
        self.refresh()
        if resources.fits_in(self._total - self.committed):
            self._trial_queued = False
            return True
        if self.queue_trials and not self._trial_queued:
            # One trial may wait in Ray's queue for the autoscaler; more would only pile up.
            self._trial_queued = True
            log.warning(
                "Starting a trial needing %s although the cluster has only %s free; it waits for "
                "the autoscaler to add resources.",
                resources,
                self._total - self.committed,
            )
            return True
        return False

    def could_start(self, resources: Resources) -> bool:
        """What :meth:`has_resources` would answer now, without taking the queue's one place."""
        self.refresh()
        return resources.fits_in(self._total - self.committed) or (
            self.queue_trials and not self._trial_queued
        )

    def summary_string(self) -> str:
        total = self.total()
        return f"{self.committed.summary_string()} used of {total.summary_string()}"
