"""GPU pools: how many Airflow pool slots a trial takes, and creating the pool so deferred trials
hold them."""

from __future__ import annotations

import math
import os

from airflow_trials.exceptions import AirflowTrialsError

DEFAULT_GPU_POOL = "gpu"
DEFAULT_SLOTS_PER_GPU = 4
# ``[airflow_trials] gpu_queue``: the executor queue of GPU trials' tasks (e.g. Celery's ``gpu``).
GPU_QUEUE_ENV = "AIRFLOW__AIRFLOW_TRIALS__GPU_QUEUE"


class AirflowDbNotReadyError(AirflowTrialsError):
    """Airflow's metadata DB does not exist or was never migrated, so no pool can be written to
    it."""


def gpu_pool_slots(gpu: float, slots_per_gpu: int = DEFAULT_SLOTS_PER_GPU) -> int:
    """Pool slots for a trial using ``gpu`` GPUs: ``ceil(gpu * slots_per_gpu)``, at least 1.

    With 4 slots per GPU, 0.25 GPU takes 1 slot, 0.5 takes 2, 1 takes 4 and 2 take 8, so a pool of
    ``num_gpus * slots_per_gpu`` slots admits exactly as many trials as the GPUs hold. A trial of
    several bundles (``PlacementGroupFactory``) counts every GPU of its bundles: its
    ``Resources.gpu`` is their sum, a fractional bundle's share included (``[{"GPU": 1},
    {"GPU": 0.5}]`` is 1.5 GPUs, 6 slots).
    """
    if gpu < 0:
        raise ValueError(f"gpu must be >= 0, got {gpu}.")
    if not isinstance(slots_per_gpu, int) or slots_per_gpu < 1:
        raise ValueError(f"slots_per_gpu must be a whole number >= 1, got {slots_per_gpu!r}.")
    # Round first: 0.3 * 10 is 3.0000000000000004 in floating point, which is 3 slots, not 4.
    return max(1, math.ceil(round(gpu * slots_per_gpu, 9)))


def default_gpu_queue() -> str | None:
    """The queue GPU trials' tasks go to when the experiment names none: Airflow's
    ``[airflow_trials] gpu_queue`` setting (``AIRFLOW__AIRFLOW_TRIALS__GPU_QUEUE``), read when the
    DAG file is parsed; None (the executor's default queue) when unset or empty."""
    from airflow_trials.provider_config import setting

    return setting("gpu_queue") or None


def ensure_gpu_pool(
    num_gpus: int,
    name: str = DEFAULT_GPU_POOL,
    slots_per_gpu: int = DEFAULT_SLOTS_PER_GPU,
) -> tuple[str, int]:
    """Create or update the GPU pool with ``num_gpus * slots_per_gpu`` slots and
    ``include_deferred``.

    ``include_deferred=True`` matters: a trial task spends its life deferred (its trigger watches
    the
    trial on Ray), and without it a deferred task gives its slots back, so the pool would admit
    every trial at once and oversubscribe the GPUs. Call this from a setup script or the CLI (it
    writes Airflow's metadata DB, which task code may not do). Returns ``(name, slots)``.
    """
    if not isinstance(num_gpus, int) or num_gpus < 0:
        raise ValueError(f"num_gpus must be a whole number >= 0, got {num_gpus!r}.")
    require_migrated_airflow_db(f"write the GPU pool {name!r}")
    from airflow.models.pool import Pool

    slots = num_gpus * slots_per_gpu
    Pool.create_or_update_pool(
        name,
        slots=slots,
        description=f"{num_gpus} GPUs x {slots_per_gpu} slots per GPU (airflow_trials)",
        include_deferred=True,
    )
    return name, slots


def require_migrated_airflow_db(operation: str, fix: str | None = None) -> None:
    """Raise :class:`AirflowDbNotReadyError` unless Airflow's metadata DB exists and has its tables.

    Checked before Airflow's ORM touches the DB: opening a missing SQLite file would create it,
    and the write would then fail on the missing tables anyway. Creates nothing.

    :param operation: what was about to happen, for the message ("write the GPU pool 'gpu'").
    :param fix: what to do about it, for the message; default: migrate this AIRFLOW_HOME's DB.
    """
    from sqlalchemy import inspect
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import SQLAlchemyError

    from airflow import settings

    fix = fix or (
        "run `airflow db migrate` (with this AIRFLOW_HOME / "
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN), then retry"
    )
    if not settings.SQL_ALCHEMY_CONN:
        raise AirflowDbNotReadyError(
            f"Could not {operation}: Airflow has no metadata DB configured; {fix}."
        )
    from airflow_trials.store.engine import safe_url

    url = make_url(settings.SQL_ALCHEMY_CONN)
    where = safe_url(url)
    if url.get_backend_name() == "sqlite" and url.database not in (None, "", ":memory:"):
        if not os.path.isfile(url.database):
            raise AirflowDbNotReadyError(
                f"Could not {operation}: Airflow's metadata DB {where} does not exist; {fix}."
            )
    if settings.engine is None:
        settings.configure_orm()
    try:
        migrated = inspect(settings.engine).has_table("slot_pool")
    except SQLAlchemyError as e:
        cause = " ".join(str(getattr(e, "orig", None) or e).split())
        raise AirflowDbNotReadyError(
            f"Could not {operation}: Airflow's metadata DB {where} does not answer "
            f"({type(e).__name__}: {cause}); check that it is up and reachable, or {fix}."
        ) from e
    if not migrated:
        raise AirflowDbNotReadyError(
            f"Could not {operation}: Airflow's metadata DB {where} has no tables (never migrated); "
            f"{fix}."
        )
