"""Shared fixtures: a real local Ray per cluster shape, and temporary experiment storage."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Ray workers import the test trainables (tests.trainables:...) by path: they inherit this.
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")]))
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
if REPO not in sys.path:
    sys.path.insert(0, REPO)

# Airflow reads its home when first imported: give the whole test session a private one, with its
# own SQLite metadata DB (migrated by the airflow_home fixture), never a developer's ~/airflow.
_SESSION_DIR = tempfile.mkdtemp(prefix="airflow_trials_tests_")
os.environ["AIRFLOW_HOME"] = os.path.join(_SESSION_DIR, "airflow_home")
os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
os.environ["AIRFLOW__CORE__DAGS_FOLDER"] = os.path.join(_SESSION_DIR, "dags")
os.environ["AIRFLOW_TRIALS_HOME"] = os.path.join(_SESSION_DIR, "trials_home")
# The importances cache (searchers/importances_cache.py), never a developer's ~/.cache.
os.environ["XDG_CACHE_HOME"] = os.path.join(_SESSION_DIR, "cache")
os.environ.pop("AIRFLOW_TRIALS_DB_URL", None)
os.environ.pop("RAY_ADDRESS", None)

_current_shape: tuple | None = None
#: How many times start_ray tries a local Ray whose raylet did not register in time (load).
RAY_START_ATTEMPTS = 3


def start_ray(num_cpus: int = 2, num_gpus: int = 0, resources: dict | None = None) -> None:
    """Make sure a local Ray with exactly this shape runs (logical GPUs need no hardware)."""
    import ray

    global _current_shape
    shape = (num_cpus, num_gpus, tuple(sorted((resources or {}).items())))
    if ray.is_initialized() and shape == _current_shape:
        return
    if ray.is_initialized():
        ray.shutdown()
    for attempt in range(1, RAY_START_ATTEMPTS + 1):
        try:
            ray.init(
                address="local",  # always a fresh cluster of this shape, never a `ray start` one
                num_cpus=num_cpus,
                num_gpus=num_gpus,
                resources=resources or {},
                include_dashboard=False,
                log_to_driver=False,
                namespace="airflow_trials_tests",
            )
            break
        except Exception as e:
            # Ray gives a new raylet 30 s (hard-coded in ray/_private/node.py) to register with its
            # GCS; on 2 cores beside the fault suite's stacks that can run out. Its processes share
            # this process's fate, so a fresh start is all it takes.
            if "timed out during startup" not in str(e) or attempt == RAY_START_ATTEMPTS:
                raise
            ray.shutdown()
    _current_shape = shape


def shutdown_ray() -> None:
    import ray

    global _current_shape
    if ray.is_initialized():
        ray.shutdown()
    _current_shape = None


def live_trial_actors() -> list[str]:
    """Names of live trial actors in any namespace (what a test must not leave behind)."""
    import ray

    return [
        entry["name"]
        for entry in ray.util.list_named_actors(all_namespaces=True)
        if entry["name"].startswith("trial.")
    ]


def live_placement_groups() -> list[str]:
    from ray.util.placement_group import placement_group_table

    return [pg_id for pg_id, info in placement_group_table().items() if info["state"] != "REMOVED"]


def remove_leftovers() -> None:
    """Kill trial actors, sweep drivers and placement groups a failed test may have left, so the
    next
    test starts clean."""
    import ray
    from ray.util.placement_group import PlacementGroup, remove_placement_group

    for entry in ray.util.list_named_actors(all_namespaces=True):
        if entry["name"].startswith(("trial.", "sweep.")):
            ray.kill(ray.get_actor(entry["name"], namespace=entry["namespace"]), no_restart=True)
    for pg_id in live_placement_groups():
        remove_placement_group(PlacementGroup(ray.PlacementGroupID(bytes.fromhex(pg_id))))


@pytest.fixture
def storage(tmp_path) -> str:
    path = tmp_path / "results"
    path.mkdir()
    return str(path)


@pytest.fixture
def ray_cluster(request) -> Iterator[None]:
    """Parametrise with ``@pytest.mark.parametrize("ray_cluster", [dict(num_cpus=..)],
    indirect=True)``
    or use as is for 2 CPUs and 2 logical GPUs."""
    shape = getattr(request, "param", None) or {"num_cpus": 2, "num_gpus": 2}
    start_ray(**shape)
    yield
    remove_leftovers()


@pytest.fixture(scope="session")
def airflow_home() -> str:
    """A migrated Airflow metadata DB (SQLite) in the session's private AIRFLOW_HOME."""
    os.makedirs(os.environ["AIRFLOW__CORE__DAGS_FOLDER"], exist_ok=True)
    subprocess.run(
        [os.path.join(os.path.dirname(sys.executable), "airflow"), "db", "migrate"],
        check=True,
        capture_output=True,
        env=os.environ.copy(),
        timeout=300,
    )
    return os.environ["AIRFLOW_HOME"]


class LoopTicker:
    """Counts 10 ms ticks of the running event loop while awaited work runs: the proof that the
    work never blocked the loop. Use as ``async with LoopTicker() as ticker: ...; ticker.ticks``."""

    def __init__(self) -> None:
        self.ticks = 0

    async def _tick(self) -> None:
        import asyncio

        while True:
            await asyncio.sleep(0.01)
            self.ticks += 1

    async def __aenter__(self) -> LoopTicker:
        import asyncio

        self._task = asyncio.create_task(self._tick())
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._task.cancel()


FAULT_TESTS_ENV = "AIRFLOW_TRIALS_FAULT_TESTS"


#: The one work unit of every fault case: whole stacks, one at a time (tests/faults).
FAULTS_UNIT = "tests/faults"
#: Modules outside tests/faults that start a whole stack of their own, and so join that unit.
STACK_MODULES = ("tests/system/test_main_job.py",)
#: The key, in an xdist worker's ``workerinput``, of the file it writes each test's unit to.
UNITS_FILE_KEY = "airflow_trials_test_units"
_units_file = pytest.StashKey[str]()


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """tests/faults/ kill real processes on whole Airflow stacks (about 30 minutes): they run when
    AIRFLOW_TRIALS_FAULT_TESTS=1 (CI sets it), and are reported as skipped, with that reason,
    otherwise.

    In an xdist worker (``scripts/test.sh`` runs the whole suite in several), the tests are put
    in the order their units should be taken, and each test's unit is written where the
    controller's scheduler (:func:`pytest_xdist_make_scheduler`) reads it."""
    units_file = getattr(config, "workerinput", {}).get(UNITS_FILE_KEY)
    if units_file:
        _write_units(items, units_file)
    if os.environ.get(FAULT_TESTS_ENV) == "1":
        return
    skip = pytest.mark.skip(
        reason=f"fault-injection suite: set {FAULT_TESTS_ENV}=1 to run it (about 30 minutes; CI "
        "does)"
    )
    for item in items:
        if "tests/faults/" in str(item.fspath).replace(os.sep, "/"):
            item.add_marker(skip)


def _write_units(items: list[pytest.Item], units_file: str) -> None:
    """A unit is a module, whose module-scoped fixtures (a Ray shape, an api-server) then start
    once, as ``--dist loadfile`` would have it; the fault cases, whatever their module, are one
    unit, with the other modules that start whole stacks (``STACK_MODULES``), so that their stacks
    start one at a time. That unit goes first: it is the longest, and workers take units in the
    order of their first tests."""

    def unit(item: pytest.Item) -> str:
        path = item.nodeid.split("::", 1)[0]
        if path.startswith(FAULTS_UNIT + "/") or path in STACK_MODULES:
            return FAULTS_UNIT
        return path

    items.sort(key=lambda item: unit(item) != FAULTS_UNIT)  # stable: the rest keeps its order
    units = {item.nodeid: unit(item) for item in items}
    partial = f"{units_file}.{os.getpid()}"
    with open(partial, "w", encoding="utf-8") as f:
        json.dump(units, f)
    os.replace(partial, units_file)  # every worker writes the same: the last one stays


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    """(xdist, in the controller) Tell each worker where to write the tests' units."""
    config = node.config
    if _units_file not in config.stash:
        config.stash[_units_file] = os.path.join(tempfile.mkdtemp(prefix="at_units_"), "units.json")
    node.workerinput[UNITS_FILE_KEY] = config.stash[_units_file]


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """(xdist, in the controller) Hand out whole units (modules, the fault cases)
    in the order of the workers' collection, each to the next worker that runs short of work."""
    if config.getvalue("dist") != "loadscope":
        return None  # xdist's own scheduler for the other modes
    from tests.work_units import UnitScheduling

    return UnitScheduling(config, log, lambda: config.stash.get(_units_file, None))
