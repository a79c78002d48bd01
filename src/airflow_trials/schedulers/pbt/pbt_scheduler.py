"""Population based training (PBT), deciding as Ray Tune 2.60's PopulationBasedTraining."""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from airflow_trials.core.checkpoint import CheckpointRecord
from airflow_trials.core.result import TRAINING_ITERATION, Result
from airflow_trials.core.scheduler import (
    Decision,
    Exploit,  # noqa: F401 - re-exported: PopulationBasedTraining hands these out
    HasResources,
    MetricScheduler,
    format_number,
)
from airflow_trials.core.status import TrialStatus
from airflow_trials.core.trial import Trial
from airflow_trials.schedulers.pbt.pbt_explore import (
    ExploreFn,
    Mutations,
    check_mutations,
    describe_changes,
    explore,
    fill_missing,
    show_value,
)

log = logging.getLogger(__name__)


def _check_settings(
    time_attr: Any,
    metric: Any,
    mutations: Any,
    explore_fn: Any,
    interval: Any,
    quantile: Any,
    resample_probability: Any,
    factors: Any,
) -> None:
    name = "PopulationBasedTraining"
    if not isinstance(time_attr, str) or not time_attr:
        raise ValueError(
            f"{name} got time_attr={time_attr!r}: name the result key measuring progress."
        )
    if metric is not None and (not isinstance(metric, str) or not metric):
        raise ValueError(
            f"{name} got metric={metric!r}: name the result key to judge, e.g. metric='loss'."
        )
    if not mutations and explore_fn is None:
        raise ValueError(
            f"{name} got neither hyperparam_mutations nor custom_explore_fn, so it cannot "
            f"explore a cloned config; give hyperparam_mutations (e.g. {{'lr': "
            f"loguniform(1e-4, 1e-1)}}), a custom_explore_fn(config) -> config, or both."
        )
    if not 0 <= quantile <= 0.5:
        raise ValueError(
            f"{name} got quantile_fraction={quantile}: it must be between 0 and 0.5 (the "
            f"bottom fraction clones the top one; they cannot overlap); 0.25 is usual."
        )
    if not interval > 0:
        raise ValueError(
            f"{name} got perturbation_interval={interval}: it must be > 0 (in time_attr units)."
        )
    if not 0 <= resample_probability <= 1:
        raise ValueError(
            f"{name} got resample_probability={resample_probability}: use a value in [0, 1]."
        )
    if not factors:
        raise ValueError(
            f"{name} got perturbation_factors={factors!r}: give at least one, e.g. (1.2, 0.8)."
        )
    if mutations:
        check_mutations(mutations)


@dataclass(eq=False)
class _State:
    """What PBT keeps of one trial (Ray's ``_PBTTrialState``)."""

    trial: Trial
    last_score: float | None = None
    last_perturbation_time: float = 0.0
    last_train_time: float = 0.0
    last_result: Result = field(default_factory=dict)
    # Set while it may be cloned (it was in the top quantile at its last perturbation): a checkpoint
    # of at least this training_iteration is the state Ray would have saved then.
    clone_from_iteration: int | None = None


@dataclass(frozen=True, eq=False)
class _Plan:
    """An exploit decided; the donor's checkpoint is looked up when the runner takes it, as the
    donor may be the trial whose pause (saving it) follows the decision."""

    donor: _State
    since: int
    new_config: dict[str, Any]
    operations: dict[str, str]
    time: float


class PopulationBasedTraining(MetricScheduler):
    """Population based training (https://arxiv.org/abs/1711.09846), deciding as Ray Tune 2.60's.

    Each time a trial's ``time_attr`` has grown by ``perturbation_interval`` since its last
    perturbation (and reached ``burn_in_period``), its score is recorded and the scored unfinished
    trials are ranked. A trial in the bottom ``quantile_fraction`` clones one drawn from the top:
    it is PAUSED and an :class:`Exploit` records the donor's checkpoint and the donor's config as
    explored by ``hyperparam_mutations`` / ``custom_explore_fn``. Any other trial continues, or
    pauses while trials wait to run, so the population shares the cluster (as in Ray Tune).

    The runner applies an exploit: after a PAUSE, and before starting a PAUSED trial, it calls
    :meth:`take_exploit`; given an :class:`Exploit` it copies ``donor_checkpoint`` into the trial's
    directory, sets ``trial.config = new_config`` and resumes the trial from that copy.

    Unlike Ray Tune, it cannot make a donor save when it enters the top quantile: the donor needs a
    checkpoint at or after that result's training_iteration (the result's own, a PAUSE's, a later
    ``checkpoint_freq`` one); else the bottom trial keeps its state, as in Ray when the save failed.

    Example::

        scheduler = PopulationBasedTraining(
            time_attr="training_iteration", metric="score", mode="max", perturbation_interval=5,
            hyperparam_mutations={"lr": loguniform(1e-4, 1e-1), "batch_size": [16, 32, 64]},
        )

    :param time_attr: the result key measuring progress, never decreasing; default
        ``"time_total_s"``.
    :param metric: the result key judged; default None (then set_search_properties must set it).
    :param mode: ``"min"`` or ``"max"``; default None (likewise).
    :param perturbation_interval: ``time_attr`` between a trial's perturbations; default 60.
    :param burn_in_period: no perturbation before this much ``time_attr``; default 0.
    :param hyperparam_mutations: key -> a list (shifted to a neighbour, or resampled), a domain
        such as ``uniform(0, 1)`` or ``choice([...])`` (multiplied by a perturbation factor, or
        resampled; a one-key dict named after a domain is a domain), a function of no arguments
        (likewise) or a nested dict of these. Keys a trial's config lacks are sampled when it is
        added. Default None.
    :param quantile_fraction: the bottom fraction clones the top fraction, in [0, 0.5]; default
        0.25.
    :param resample_probability: chance of resampling instead of perturbing a key; default 0.25.
    :param perturbation_factors: a perturbed number is multiplied by one of these; default
        (1.2, 0.8).
    :param custom_explore_fn: ``config -> config``, applied after the mutations; default None.
        hyperparam_mutations, custom_explore_fn or both are required.
    :param log_config: keep each trial's :meth:`lineage` (Ray writes policy files); default True.
    :param require_attrs: a result without ``time_attr`` or ``metric`` raises a ValueError; if
        False, it is skipped with a warning. Default True.
    :param synch: perturb all trials together once all reached the next perturbation time (the
        paper's synchronous PBT); default False.
    :param rng: the source of the donor draws and exploration. ``random.Random(s)`` draws as Ray
        Tune does after ``random.seed(s)``, except resamples from a domain (Ray draws those from
        NumPy's global state). Default an unseeded ``random.Random()``.
    """

    def __init__(
        self,
        time_attr: str = "time_total_s",
        metric: str | None = None,
        mode: str | None = None,
        perturbation_interval: float = 60.0,
        burn_in_period: float = 0.0,
        hyperparam_mutations: Mutations | None = None,
        quantile_fraction: float = 0.25,
        resample_probability: float = 0.25,
        perturbation_factors: Sequence[float] = (1.2, 0.8),
        custom_explore_fn: ExploreFn | None = None,
        log_config: bool = True,
        require_attrs: bool = True,
        synch: bool = False,
        *,
        rng: random.Random | None = None,
    ) -> None:
        super().__init__(metric, mode)
        _check_settings(
            time_attr,
            metric,
            hyperparam_mutations,
            custom_explore_fn,
            perturbation_interval,
            quantile_fraction,
            resample_probability,
            perturbation_factors,
        )
        self.time_attr = time_attr
        self.perturbation_interval = perturbation_interval
        self.burn_in_period = burn_in_period
        self.hyperparam_mutations: Mutations = dict(hyperparam_mutations or {})
        self.quantile_fraction = quantile_fraction
        self.resample_probability = resample_probability
        self.perturbation_factors = tuple(perturbation_factors)
        self.custom_explore_fn = custom_explore_fn
        self.log_config = log_config
        self.require_attrs = require_attrs
        self.synch = synch
        self.rng = rng if rng is not None else random.Random()
        self._states: dict[str, _State] = {}
        self._pending: dict[str, _Plan] = {}
        self._lineage: dict[str, list[Exploit]] = {}
        self._next_perturbation_sync = max(perturbation_interval, burn_in_period)
        self._num_checkpoints = self._num_perturbations = 0

    def on_trial_add(self, trial: Trial) -> None:
        self._check_ready(trial)
        if trial.keep_checkpoints_num is not None and trial.keep_checkpoints_num <= 2:
            log.warning(
                "Trial %s keeps %s checkpoints: with PBT a donor's checkpoint may be deleted "
                "before it is cloned; keep more.",
                trial.trial_id,
                trial.keep_checkpoints_num,
            )
        self._states[trial.trial_id] = _State(trial)
        fill_missing(trial.config, self.hyperparam_mutations, self.rng)

    def on_trial_result(self, trial: Trial, result: Result) -> Decision:
        state = self._state(trial)
        if not self.require_attrs and not {self.time_attr, str(self.metric)} <= result.keys():
            log.warning(
                "Trial %s reported no %s or %s; PBT skips this result.",
                trial.trial_id,
                self.time_attr,
                self.metric,
            )
            return Decision.CONTINUE
        time = self._number(trial, result, self.time_attr, "time_attr")
        score = self._sign * self._number(trial, result, str(self.metric), "metric")
        too_soon = time - state.last_perturbation_time < self.perturbation_interval
        if time < self.burn_in_period or too_soon:
            return Decision.CONTINUE
        state.last_score, state.last_train_time, state.last_result = score, time, result
        if self.synch:
            return self._synch_step(state, time)
        state.last_perturbation_time = time
        lower, upper = self._quantiles()
        waiting = any(
            s.trial.status in (TrialStatus.PENDING, TrialStatus.PAUSED)
            for s in self._states.values()
        )
        note = self._checkpoint_or_exploit(state, time, lower, upper)
        if note is None:
            return Decision.PAUSE  # exploited
        if waiting:
            self._reasons[trial.trial_id] = (
                f"paused by PBT {self._at(time)} so that waiting trials get a turn{note}"
            )
            return Decision.PAUSE
        return Decision.CONTINUE

    def _synch_step(self, state: _State, time: float) -> Decision:
        live = [s for s in self._states.values() if not s.trial.status.is_terminal()]
        if any(s.last_train_time < self._next_perturbation_sync and s is not state for s in live):
            self._reasons[state.trial.trial_id] = (
                f"paused by PBT {self._at(time)} until every trial reaches "
                f"{self.time_attr}={format_number(self._next_perturbation_sync)} (synch=True)"
            )
            return Decision.PAUSE
        lower, upper = self._quantiles()
        middle = [s for s in self._states.values() if s not in lower and s not in upper]
        # Top trials first, so their checkpoints are known before the bottom ones clone them.
        for other in upper + middle + lower:
            other.last_perturbation_time = time
            self._checkpoint_or_exploit(other, time, lower, upper, pausing=state)
        latest = max(s.last_train_time for s in self._states.values())
        self._next_perturbation_sync = max(
            self._next_perturbation_sync + self.perturbation_interval, latest
        )
        if state.trial.trial_id not in self._pending:
            self._reasons[state.trial.trial_id] = (
                f"paused by PBT {self._at(time)}: the population was perturbed; it waits for the "
                f"next round at {self.time_attr}={format_number(self._next_perturbation_sync)} "
                f"(synch=True)"
            )
        return Decision.PAUSE

    def _checkpoint_or_exploit(
        self,
        state: _State,
        time: float,
        lower: list[_State],
        upper: list[_State],
        pausing: _State | None = None,
    ) -> str | None:
        """Mark a top trial as a donor, or make a bottom one clone a donor: None, else a note on
        why not. ``pausing`` is paused after this result, so it will have a checkpoint of it (Ray
        saves it)."""
        percent = f"{format_number(self.quantile_fraction * 100)}%"
        state.clone_from_iteration = None
        if state in upper:
            state.clone_from_iteration = int(state.last_result.get(TRAINING_ITERATION, 0))
            self._num_checkpoints += 1
        if state not in lower:
            return f" (it is not in the bottom {percent})"
        donor = self.rng.choice(upper)
        if donor is not pausing and _checkpoint_since(donor) is None:
            log.info(
                "PBT: trial %s has no checkpoint since its last perturbation; trial %s is not "
                "exploited.",
                donor.trial.trial_id,
                state.trial.trial_id,
            )
            return (
                f" (it is in the bottom {percent}, but {donor.trial.trial_id}, drawn to be cloned, "
                f"has no checkpoint since its last perturbation, so it keeps its own state)"
            )
        self._exploit(state, donor, time, percent)
        return None

    def _exploit(self, state: _State, donor: _State, time: float, percent: str) -> None:
        trial_id, donor_id = state.trial.trial_id, donor.trial.trial_id
        # A donor's pending exploit has not reached trial.config yet (Ray sets the config at once).
        pending = self._pending.get(donor_id)
        donor_config = pending.new_config if pending is not None else donor.trial.config
        new_config, operations = explore(
            donor_config,
            self.hyperparam_mutations,
            self.resample_probability,
            self.perturbation_factors,
            self.custom_explore_fn,
            self.rng,
        )
        changes = describe_changes(donor_config, new_config, operations)
        since = donor.clone_from_iteration or 0
        done = {path: what for path, _, what in changes}
        self._pending[trial_id] = _Plan(donor, since, new_config, done, time)
        state.last_perturbation_time = donor.last_perturbation_time
        state.last_train_time = donor.last_train_time
        self._num_perturbations += 1
        said = ", ".join(f"{path}={show_value(value)} ({what})" for path, value, what in changes)
        self._reasons[trial_id] = (
            f"paused by PBT {self._at(time)}: in the bottom {percent}, it continues from "
            f"{donor_id}'s checkpoint with {said or 'the config custom_explore_fn made'}"
        )
        log.info("PBT: trial %s clones trial %s with %s", trial_id, donor_id, said or new_config)

    def _quantiles(self) -> tuple[list[_State], list[_State]]:
        """The bottom and top ``quantile_fraction`` of the scored unfinished trials (Ray's rule)."""
        scored = [
            s
            for s in self._states.values()
            if s.last_score is not None
            and not math.isnan(s.last_score)
            and not s.trial.status.is_terminal()
        ]
        scored.sort(key=lambda s: s.last_score)  # type: ignore[arg-type,return-value]
        if len(scored) <= 1:
            return [], []
        count = math.ceil(len(scored) * self.quantile_fraction)
        if count > len(scored) / 2:
            count = math.floor(len(scored) / 2)
        return scored[:count], scored[len(scored) - count :]

    def choose_trial_to_run(
        self, trials: Sequence[Trial], has_resources: HasResources
    ) -> Trial | None:
        """The waiting trial that trained least (by ``time_attr``) and fits, so all progress
        evenly."""
        trained = {
            t.trial_id: s.last_train_time for t in trials if (s := self._states.get(t.trial_id))
        }
        candidates = [
            t
            for t in trials
            if t.status in (TrialStatus.PENDING, TrialStatus.PAUSED)
            and (not self.synch or trained.get(t.trial_id, 0.0) < self._next_perturbation_sync)
        ]
        candidates.sort(key=lambda t: trained.get(t.trial_id, 0.0))
        return next((t for t in candidates if has_resources(t.resources)), None)

    def on_trial_remove(self, trial: Trial) -> None:
        self._pending.pop(trial.trial_id, None)

    def take_exploit(self, trial_id: str) -> Exploit | None:
        """The exploit the runner applies before the trial runs again, once; None if there is none.

        Call it for a trial this scheduler PAUSEd (an Exploit: pause it without saving) and before
        starting any PAUSED trial. None too when the donor's checkpoint is gone: it keeps its state.
        """
        plan = self._pending.pop(trial_id, None)
        if plan is None:
            return None
        donor_id = plan.donor.trial.trial_id
        checkpoint = _checkpoint_since(plan.donor, plan.since)
        if checkpoint is None:
            log.warning(
                "PBT: trial %s was to clone trial %s, which has no checkpoint since iteration %s "
                "(none saved, or deleted: keep more checkpoints); it keeps its own state.",
                trial_id,
                donor_id,
                plan.since,
            )
            return None
        exploit = Exploit(
            trial_id, donor_id, checkpoint, plan.new_config, plan.operations, plan.time
        )
        if self.log_config:
            self._lineage[trial_id] = [*self._lineage.get(donor_id, []), exploit]
        return exploit

    def lineage(self, trial_id: str) -> list[Exploit]:
        """The exploits that made the trial's state, oldest first: its donors' lineage, then its
        own."""
        return list(self._lineage.get(trial_id, []))

    def _state(self, trial: Trial) -> _State:
        try:
            return self._states[trial.trial_id]
        except KeyError as e:
            raise ValueError(
                f"PopulationBasedTraining got a result of trial {trial.trial_id}, which it was "
                f"never given; call on_trial_add(trial) first (TrialRunner.add_trial does)."
            ) from e

    def _at(self, time: float) -> str:
        return f"at {self.time_attr}={format_number(time)}"

    def debug_string(self) -> str:
        return (
            f"PopulationBasedTraining: {self._num_checkpoints} checkpoints, "
            f"{self._num_perturbations} perturbs"
        )


def _checkpoint_since(donor: _State, start: int | None = None) -> CheckpointRecord | None:
    """The donor's first kept checkpoint since its last perturbation (Ray saves one right then)."""
    start = donor.clone_from_iteration if start is None else start
    kept = [
        c for c in donor.trial.checkpoint_manager.kept if start is not None and c.iteration >= start
    ]
    return min(kept, key=lambda c: c.iteration, default=None)
