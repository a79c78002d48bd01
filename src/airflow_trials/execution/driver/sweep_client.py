"""The sweep driver seen from outside: start it or attach to the live one, claim it for a task's
try, ask it to stop, find it by name. The operator, the trigger and the tests call these; the
driver itself (:class:`~airflow_trials.execution.driver.sweep_driver.SweepDriver`) runs on Ray.

Example::

    driver, started = start_or_attach_driver(spec)
    claim_driver(driver, spec, try_number, started)
    ...
    stop_driver(spec.experiment_name, spec.run_key, spec.namespace, try_number)
"""

from __future__ import annotations

from typing import cast

import ray
from ray.actor import ActorHandle

from airflow_trials.execution.driver.errors import check_picklable
from airflow_trials.execution.driver.sweep_driver import SweepDriver, SweepSpec, driver_name

#: How long a task waits for the run's driver to answer its claim: the driver takes no CPU, so
#: only the start of its worker process (slow on a loaded node) stands between. As long as a
#: trial's start may take (``TrialActorClient.launch``).
DRIVER_START_TIMEOUT_SECONDS = 600.0


def start_or_attach_driver(spec: SweepSpec) -> tuple[ActorHandle, bool]:
    """The run's live driver, started now if none lives; and whether this call started it.

    Ray creates the named actor only if no live actor has its name, atomically, so concurrent
    callers (a retried task and a late worker) share one driver.
    """
    existing = find_driver(spec.experiment_name, spec.run_key, spec.namespace)
    if existing is not None:
        return existing, False
    check_picklable(
        spec, f"The sweep of experiment {spec.experiment_name}, run {spec.run_key},", "its driver"
    )
    # Threaded (max_concurrency): progress() answers while the constructor's thread runs the
    # trials. No CPU: the driver takes no trial's slot, as Ray Tune's driver takes none.
    actor: ActorHandle = (
        ray.remote(SweepDriver)
        .options(  # type: ignore[assignment]
            num_cpus=0,
            max_concurrency=8,
            max_restarts=0,
            name=spec.name,
            namespace=spec.namespace,
            lifetime="detached",
            get_if_exists=True,
        )
        .remote(spec)
    )
    return actor, True


def claim_driver(
    driver: ActorHandle,
    spec: SweepSpec,
    try_number: int,
    started: bool,
    timeout_s: float = DRIVER_START_TIMEOUT_SECONDS,
) -> int:
    """Claim the run's driver for ``try_number`` once it answers; returns the newest try that
    claimed it. A driver that does not answer within ``timeout_s`` raises RuntimeError naming it,
    its Ray state and the fix; one this try started is killed first, so none is left orphaned
    (its trials have not started: the constructor that starts them has not run)."""
    from ray.exceptions import GetTimeoutError

    from airflow_trials.execution.ray_state import actor_info, kill_actor

    try:
        return cast(int, ray.get(driver.claim.remote(try_number), timeout=timeout_s))
    except GetTimeoutError as e:
        info = actor_info(driver)
        if started:
            kill_actor(driver)
        raise RuntimeError(
            f"The sweep driver {spec.name} of experiment {spec.experiment_name}, run "
            f"{spec.run_key} (try {try_number}) did not answer within {timeout_s:g} s; Ray has it "
            f"{info.state}{' (' + info.death_message + ')' if info.death_message else ''}. "
            + (
                "It was removed; the task's retry starts a new one. "
                if started
                else "It was left running (an earlier try started it). "
            )
            + "Check the Ray node's load and its worker logs (raylet.out), then clear the task."
        ) from e


def stop_driver(
    experiment_name: str,
    run_key: str,
    namespace: str,
    try_number: int,
    grace_seconds: float = 0.0,
    timeout_s: float = 60.0,
) -> bool:
    """Ask the run's driver to stop its trials and end, unless a try newer than ``try_number``
    claimed it; whether it will (True also when no driver lives). Without ``grace_seconds`` this
    waits until the trials are stopped and recorded; with it, the driver waits that long for a
    newer try to claim it before it stops. Either way the stopped driver ends itself."""
    from ray.exceptions import RayActorError

    actor = find_driver(experiment_name, run_key, namespace)
    if actor is None:
        return True
    if not ray.get(actor.request_stop.remote(try_number, grace_seconds), timeout=timeout_s):
        return False
    if grace_seconds <= 0:
        try:
            ray.get(
                actor.wait.remote(timeout_s), timeout=timeout_s + 10
            )  # its trials stopped and recorded
        except RayActorError:
            pass  # it ended itself already
    return True


def find_driver(experiment_name: str, run_key: str, namespace: str) -> ActorHandle | None:
    """The experiment run's live driver, or None."""
    try:
        return ray.get_actor(driver_name(experiment_name, run_key), namespace=namespace)
    except ValueError:
        return None
