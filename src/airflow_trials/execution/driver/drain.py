"""A graceful stop's drain: the running trials checkpoint and pause before Airflow and Ray stop.

The main job's Ctrl-C (or SIGTERM) and ``airflow-trials shape down`` call :func:`drain_trials`
first. Each self-driving trial actor (the Airflow path: a mapped trial task deferred on it) is
asked to checkpoint after the iteration it is training and to pause there
(``TrialActor.drain``). The checkpoint's metadata holds the results reported since the previous
one, so once it is written, everything the trial reported is durable in its storage. The resume
after the restart backfills those results into the trials DB and starts from that checkpoint
(``execution/resume.py``): no reported iteration is trained twice.

The wait is bounded (``[airflow_trials] drain_timeout_seconds``): a trial whose current iteration
outlasts it is stopped as it is, and its resume re-runs what followed its last checkpoint. A
paused trial's actor then dies with the stop, which its task's next try reads as an
infrastructure loss, so no ``max_failures`` is spent. Trials a sweep driver or a runner trains
(their actors are not self-driving) are not drained; they resume from their newest checkpoint.

Example::

    ray.init(address=address)
    report = drain_trials(timeout_s=30)
    print(report.summary())
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import ray
from ray.actor import ActorHandle
from ray.exceptions import RayActorError, RayTaskError

from airflow_trials.execution.ray_state import actor_info
from airflow_trials.provider_config import setting_float

#: How often an unsettled trial is asked again where it is.
ASK_INTERVAL_S = 0.2
#: The states in which a trial's work is durable, or no drain applies (``DrainState.state``;
#: ``queued``: Ray has not placed its actor, so it has trained nothing since its last start).
SETTLED = frozenset({"paused", "ended", "driven", "gone", "queued"})


@dataclass(frozen=True)
class DrainReport:
    """What a drain found, per trial actor (its Ray name): the trial's last ``DrainState`` as a
    dict (``state``, ``iteration``, ``checkpoint_iteration``), or ``state`` ``queued`` (Ray has not
    placed it), ``gone`` (the actor died or cannot drain: ``error`` says why) or ``no answer`` (it
    did not answer in time)."""

    states: dict[str, dict[str, Any]]
    seconds: float
    timeout_s: float

    def named(self, state: str) -> list[str]:
        return sorted(name for name, s in self.states.items() if s.get("state") == state)

    @property
    def unsettled(self) -> list[str]:
        """The trials still training (or silent) when the wait ended: their work since their last
        checkpoint is re-run on resume."""
        return sorted(n for n, s in self.states.items() if s.get("state") not in SETTLED)

    def summary(self) -> str:
        counts = ", ".join(
            f"{len(self.named(state))} {state}"
            for state in ("paused", "ended", "driven", "queued", "gone")
            if self.named(state)
        )
        text = f"Drained {len(self.states)} trial(s) in {self.seconds:.1f} s" + (
            f": {counts}." if counts else "."
        )
        behind = [
            self._where(name)
            for name in self.named("paused")
            if self.states[name].get("checkpoint_iteration") != self.states[name].get("iteration")
        ]
        if behind:
            text += (
                f" Paused past their last checkpoint (a function trainable checkpoints only when "
                f"it reports one): {'; '.join(behind)}; their resume re-runs those iterations."
            )
        if self.unsettled:
            late = "; ".join(self._where(name) for name in self.unsettled)
            text += (
                f" Did not pause within {self.timeout_s:g} s: {late}. Their resume re-runs what "
                "followed that checkpoint; raise [airflow_trials] drain_timeout_seconds for "
                "trainables whose iterations take longer."
            )
        return text

    def _where(self, name: str) -> str:
        state = self.states[name]
        return (
            f"{name} (iteration {state.get('iteration')}, checkpoint at "
            f"{state.get('checkpoint_iteration')})"
        )


def trial_actors(prefix: str = "trial.") -> dict[str, ActorHandle]:
    """The live named trial actors of the connected cluster, in any namespace, whose name starts
    with ``prefix`` (``trial.<experiment>.`` for one experiment's)."""
    actors = {}
    for entry in ray.util.list_named_actors(all_namespaces=True):
        name = entry["name"]
        if name.startswith(prefix):
            try:
                actors[name] = ray.get_actor(name, namespace=entry["namespace"])
            except ValueError:
                continue  # it ended since it was listed
    return actors


def drain_trials(timeout_s: float, prefix: str = "trial.") -> DrainReport:
    """Ask every trial actor named ``prefix``... to checkpoint and pause, and wait until each has
    paused (or ended, or is not self-driving), at most ``timeout_s``. Needs a connected Ray
    (``ray.init``). Never raises for a trial: an actor that died or cannot drain (an older
    version's) is reported ``gone``."""
    started = time.monotonic()
    deadline = started + timeout_s
    actors = trial_actors(prefix)
    states: dict[str, dict[str, Any]] = {
        name: {"state": "queued" if actor_info(actor).waiting else "no answer"}
        for name, actor in actors.items()
    }
    asking: dict[str, ray.ObjectRef] = {}  # one question in flight per actor at most
    unsettled = {name for name in actors if states[name]["state"] not in SETTLED}
    while unsettled:
        for name in unsettled - set(asking):
            asking[name] = actors[name].drain.remote()
        left = deadline - time.monotonic()
        if left <= 0:
            break
        ready, _ = ray.wait(
            list(asking.values()), num_returns=len(asking), timeout=min(left, ASK_INTERVAL_S)
        )
        for name, ref in list(asking.items()):
            if ref in ready:
                del asking[name]
                states[name] = _answer(ref)
                if states[name]["state"] in SETTLED:
                    unsettled.discard(name)
    return DrainReport(states, time.monotonic() - started, timeout_s)


def drain_cluster(
    address: str, timeout_s: float | None = None, prefix: str = "trial."
) -> DrainReport | None:
    """:func:`drain_trials` on the Ray cluster at ``address``, connected for the drain only (the
    stopping process: the main job, ``shape down``). ``timeout_s``: default
    ``[airflow_trials] drain_timeout_seconds``; 0 or less: no drain (None)."""
    if timeout_s is None:
        timeout_s = setting_float("drain_timeout_seconds")
    if timeout_s <= 0:
        return None
    if ray.is_initialized():  # this process is a driver already (a test, a notebook)
        return drain_trials(timeout_s, prefix)
    ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING)
    try:
        return drain_trials(timeout_s, prefix)
    finally:
        ray.shutdown()


def drain_failed(error: BaseException) -> str:
    """What a stopping command says when the drain itself failed (Ray did not answer): the stop
    goes on, and each trial resumes from its newest checkpoint in storage."""
    return (
        f"Could not drain the running trials ({type(error).__name__}: {error}); stopping "
        "anyway: each resumes from its newest checkpoint in storage."
    )


def _answer(ref: ray.ObjectRef) -> dict[str, Any]:
    try:
        return dict(ray.get(ref))
    except (RayActorError, RayTaskError) as e:
        return {"state": "gone", "error": f"{type(e).__name__}: {str(e).splitlines()[0]}"}
