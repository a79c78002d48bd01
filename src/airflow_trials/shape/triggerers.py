"""The shape's triggerers as Airflow's metadata DB sees them: which job is which triggerer, which
runs which triggers, and how long the survivor takes to hold a killed one's (the fault test and
bench/production_shape.py measure that here, the same way)."""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from airflow_trials.shape import spec

T = TypeVar("T")


class Shape(Protocol):
    """What of :class:`~airflow_trials.shape.local.LocalShape` these reads and the takeover use."""

    triggerer_jobs: dict[str, int]

    def metadata_query(self, sql: str, **params: Any) -> list[tuple[Any, ...]]: ...

    def wait_for(self, predicate: Callable[[], T | None], timeout_s: float, what: str) -> T: ...

    def kill(self, name: str) -> None: ...


@dataclass(frozen=True)
class Takeover:
    """A triggerer SIGKILLed and the other holding its triggers ``seconds`` later."""

    killed: str
    survivor: str
    moved: int
    seconds: float


def new_job(shape: Shape, since: datetime.datetime) -> int | None:
    """The running triggerer job that began after ``since`` and no triggerer of the shape has."""
    known = set(shape.triggerer_jobs.values())
    rows = shape.metadata_query(
        "SELECT id FROM job WHERE job_type = 'TriggererJob' AND state = 'running' "
        "AND start_date >= :since ORDER BY id",
        since=since,
    )
    return next((int(r[0]) for r in rows if int(r[0]) not in known), None)


def live(shape: Shape) -> int:
    """Triggerers whose heartbeat is recent."""
    rows = shape.metadata_query(
        "SELECT count(*) FROM job WHERE job_type = 'TriggererJob' AND state = 'running' "
        "AND latest_heartbeat > now() - interval '15 seconds'"
    )
    return int(rows[0][0]) if rows else 0


def triggers_by_triggerer(shape: Shape) -> dict[str | None, int]:
    """How many triggers each of the shape's triggerers runs (None: not assigned, or a triggerer
    that is not the shape's current one)."""
    names: Mapping[int, str] = {job: name for name, job in shape.triggerer_jobs.items()}
    counts: dict[str | None, int] = {}
    for job, count in shape.metadata_query(
        "SELECT triggerer_id, count(*) FROM trigger GROUP BY triggerer_id"
    ):
        key = names.get(job) if job is not None else None
        counts[key] = counts.get(key, 0) + int(count)
    return counts


def holds_every_trigger(shape: Shape, name: str) -> bool:
    """Whether triggerer ``name`` runs every trigger there is (none unassigned, none on a
    triggerer that died)."""
    return set(triggers_by_triggerer(shape)) == {name}


def kill_the_busiest(shape: Shape, timeout_s: float = 300) -> Takeover:
    """Once every trigger is assigned, SIGKILL the triggerer running the most of them and wait
    until the other holds every trigger; the takeover, timed from the kill."""

    def all_assigned() -> dict[str | None, int] | None:
        counts = triggers_by_triggerer(shape)
        return counts if counts and None not in counts else None

    watching = shape.wait_for(all_assigned, timeout_s, "every trigger to be assigned to one")
    killed = max(spec.TRIGGERERS, key=lambda name: watching.get(name, 0))
    survivor = next(name for name in spec.TRIGGERERS if name != killed)
    started = time.monotonic()
    shape.kill(killed)
    shape.wait_for(
        lambda: holds_every_trigger(shape, survivor),
        timeout_s,
        f"{survivor} to take over the triggers of {killed}",
    )
    return Takeover(killed, survivor, watching.get(killed, 0), time.monotonic() - started)
