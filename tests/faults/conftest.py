"""Fixtures of the fault tests: one real stack shared by the cases (or a module's own), the
experiment DAG they run, and the three proofs every case makes (no lost result, no duplicate
trial, the right end)."""

from __future__ import annotations

import signal
import textwrap
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from airflow_trials.experiment import trial_ids
from tests.faults.stack import AIRFLOW_COMPONENTS, FaultStack, RayHead, base_env, migrate_airflow_db
from tests.faults.trainables import Incarnation, gate, read_journal

#: Iterations of every trial, 0.3 s apart; the trials hold after HOLD_AT until the test opens
#: the gate, so a fault always lands mid-run, however slow the machine.
ITERATIONS = 12
SLEEP_S = 0.3
HOLD_AT = 3
#: Deadline for a whole DAG run; only a hang reaches it.
RUN_TIMEOUT_S = 600


def experiment_dag_source(
    dag_id: str,
    journal_dir: Path,
    *,
    trials: int = 3,
    iterations: int = ITERATIONS,
    sleep_s: float = SLEEP_S,
    hold_at: int = HOLD_AT,
    max_failures: int = 1,
    scheduler: str = "None",
    sweep: bool = False,
    warm_start: str = "None",
    search_alg: str = "None",
    keep_checkpoints_num: int | None = None,
    resources: str = '{"cpu": 1}',
    extra: str = "",
    trainable: str = "tests.faults.trainables:journaled",
) -> str:
    """A DAG file: one ``tuning_experiment`` of ``trials`` trials of the journaled trainable
    (``scheduler``: its argument, as code, e.g. ``"ASHAScheduler(max_t=12)"``; ``sweep``: all of
    them in one sweep task; ``warm_start``: its argument, as code; ``search_alg``: its argument,
    as code, e.g. ``"OptunaSearch(seed=0)"``, which then chooses ``x`` in [1, trials];
    ``keep_checkpoints_num``: its argument, default None, all kept; ``resources``: its
    ``resources_per_trial``, as code; ``extra``: more arguments, as code, e.g.
    ``'gpu_pool="gpu",'``; ``trainable``: its import path, default the journaled function)."""
    x = (
        f"grid_search({list(range(1, trials + 1))!r})"
        if search_alg == "None"
        else f"uniform(1.0, {float(trials)})"
    )
    return textwrap.dedent(f'''\
        """Written by tests/faults: the fault tests' experiment."""
        import datetime

        from airflow.sdk import DAG

        # The names the arguments below may use, written as code.
        from airflow_trials import (  # noqa: F401
            ASHAScheduler, OptunaSearch, PlacementGroupFactory, WarmStart)
        from airflow_trials.core.search import grid_search, uniform  # noqa: F401
        from airflow_trials.experiment import tuning_experiment

        with DAG({dag_id!r}, schedule=None, start_date=datetime.datetime(2026, 1, 1),
                 catchup=False):
            tuning_experiment(
                experiment_name={dag_id!r},
                trainable={trainable!r},
                search_space={{"x": {x}, "iterations": {iterations}, "sleep_s": {sleep_s},
                              "hold_at": {hold_at}, "journal_dir": {str(journal_dir)!r}}},
                metric="score",
                mode="max",
                stop={{"training_iteration": {iterations}}},
                resources_per_trial={resources},
                max_failures={max_failures},
                retry_delay=datetime.timedelta(seconds=1),
                poll_interval_seconds=1.0,
                scheduler={scheduler},
                sweep={sweep!r},
                warm_start={warm_start},
                search_alg={search_alg},
                num_samples={1 if search_alg == "None" else trials},
                keep_checkpoints_num={keep_checkpoints_num!r},
                {extra}
            )
        ''')


@pytest.fixture(scope="session")
def airflow_db_template(tmp_path_factory) -> Path:
    """One migrated Airflow metadata DB, copied into every stack (migrating takes half a minute)."""
    return migrate_airflow_db(tmp_path_factory.mktemp("airflow_db_template"))


@pytest.fixture(scope="module")
def trials_db_url(tmp_path_factory) -> str:
    """A migrated SQLite trials DB for a module's own stack (a module overrides this for
    PostgreSQL)."""
    return _sqlite_trials_db(tmp_path_factory)


def _sqlite_trials_db(tmp_path_factory) -> str:
    from airflow_trials.store import migrate

    url = f"sqlite:///{tmp_path_factory.mktemp('trials') / 'trials.db'}"
    migrate(url)
    return url


@pytest.fixture(scope="module")
def stack_settings() -> dict[str, str]:
    """More environment settings for a module's own stack (a module overrides this fixture)."""
    return {}


@contextmanager
def _running_stack(
    home: Path, airflow_db: Path, trials_db_url: str, settings: dict[str, str] | None = None
) -> Iterator[FaultStack]:
    """A Ray head and the four Airflow components, stopped on exit."""
    from tests.conftest import shutdown_ray

    shutdown_ray()  # another module's local Ray: this process connects to the stack's head instead
    ray = RayHead(base_env())
    try:
        ray.start()
        fault_stack = FaultStack(home, ray, trials_db_url, airflow_db=airflow_db, settings=settings)
        try:
            fault_stack.start()
            yield fault_stack
        finally:
            fault_stack.close()
    finally:
        ray.close()


@pytest.fixture(scope="module")
def own_stack(
    tmp_path_factory, airflow_db_template, trials_db_url, stack_settings
) -> Iterator[FaultStack]:
    """A stack of the module's own, on its ``trials_db_url`` and ``stack_settings``; a module that
    needs one overrides ``stack`` with it (see test_trials_db_drops.py)."""
    with _running_stack(
        tmp_path_factory.mktemp("stack"), airflow_db_template, trials_db_url, stack_settings
    ) as fault_stack:
        yield fault_stack


class SharedStack:
    """The one stack (SQLite trials DB, default settings) that the fault modules share: starting
    a stack costs a minute or more on 2 cores, and the cases differ only in what they break.

    It starts when the first case asks for it and stops after the last case that uses it (the
    cases that use it run first: :func:`pytest_collection_modifyitems`), so it never runs beside
    another module's stack or Ray. Before each case it brings back what an earlier case left
    stopped, killed or frozen (a case that failed half-way leaves the next one a whole stack).
    """

    def __init__(self) -> None:
        self._context: AbstractContextManager[FaultStack] | None = None
        self.stack: FaultStack | None = None

    def get(self, tmp_path_factory, airflow_db: Path) -> FaultStack:
        if self.stack is None:
            home = tmp_path_factory.mktemp("shared_stack")
            context = _running_stack(home, airflow_db, _sqlite_trials_db(tmp_path_factory))
            self.stack, self._context = context.__enter__(), context
        else:
            self._heal(self.stack)
        return self.stack

    @staticmethod
    def _heal(fault_stack: FaultStack) -> None:
        if fault_stack.ray.proc is None or fault_stack.ray.proc.poll() is not None:
            fault_stack.ray.start()
        fault_stack.ray.connect()
        for name in AIRFLOW_COMPONENTS:
            if fault_stack.is_running(name):
                fault_stack.signal(name, signal.SIGCONT)
            else:
                fault_stack.start(name)

    def close(self) -> None:
        context, self._context, self.stack = self._context, None, None
        if context is not None:
            context.__exit__(None, None, None)


SHARED_STACK = SharedStack()
SHARED = "shared_stack"


@pytest.fixture
def shared_stack(tmp_path_factory, airflow_db_template) -> FaultStack:
    return SHARED_STACK.get(tmp_path_factory, airflow_db_template)


@pytest.fixture
def stack(shared_stack) -> FaultStack:
    """The stack a case runs on: the shared one, unless its module overrides this fixture."""
    return shared_stack


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Within this package, the cases on the shared stack first (in their order), then the rest."""
    here = Path(__file__).parent
    mine = [i for i, item in enumerate(items) if here in Path(str(item.path)).parents]
    if not mine:
        return
    block = [items[i] for i in mine]
    ordered = [item for item in block if SHARED in item.fixturenames]
    ordered += [item for item in block if SHARED not in item.fixturenames]
    for i, item in zip(mine, ordered, strict=True):
        items[i] = item


def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """Stop the shared stack after the last case that uses it."""
    if SHARED in item.fixturenames and (nextitem is None or SHARED not in nextitem.fixturenames):
        SHARED_STACK.close()


def pytest_sessionfinish() -> None:
    """An interrupted session (Ctrl-C, a timeout) stops the shared stack too."""
    SHARED_STACK.close()


@dataclass
class ExperimentRun:
    """One triggered run of the fault tests' experiment DAG, and the proofs a case makes of it.

    :param stack: the stack running it.
    :param dag_id: the DAG (and experiment) id.
    :param journal_dir: where its trials' incarnations are journaled.
    :param trials: how many trials it runs; :param iterations: the results each must end with.
    """

    stack: FaultStack
    dag_id: str
    journal_dir: Path
    trials: int
    iterations: int
    sweep: bool = False
    run_id: str = ""
    triggered_at: float = 0.0
    trial_ids: list[str] = field(default_factory=list)

    @property
    def trial_task(self) -> str:
        return f"{self.dag_id}.{'sweep' if self.sweep else 'trial'}"

    def store(self) -> Any:
        from airflow_trials.store import TrialStore

        return TrialStore(self.stack.trials_db_url)

    def trigger(self) -> str:
        self.triggered_at = time.time()
        self.run_id = self.stack.trigger(self.dag_id)
        self.trial_ids = trial_ids(self.dag_id, self.dag_id, self.run_id, self.trials)
        return self.run_id

    def actor_name(self, trial_id: str) -> str:
        return f"trial.{self.dag_id}.{trial_id}"

    def trial_tis(self) -> list[dict[str, Any]]:
        return sorted(
            self.stack.task_instances(self.dag_id, self.run_id, self.trial_task),
            key=lambda ti: ti["map_index"],
        )

    def trial_ti(self, map_index: int) -> dict[str, Any] | None:
        return next((ti for ti in self.trial_tis() if ti["map_index"] == map_index), None)

    def wait_for_trial_ti(
        self, map_index: int, state: str, try_number: int, timeout_s: float = 300
    ) -> dict[str, Any]:
        """The trial task instance once it is in ``state`` on try ``try_number``."""

        def reached() -> dict[str, Any] | None:
            ti = self.trial_ti(map_index)
            return ti if ti and (ti["state"], ti["try_number"]) == (state, try_number) else None

        return self.stack.wait_for(
            reached,
            timeout_s,
            f"trial task {map_index} of {self.run_id} to be {state} on try {try_number}",
        )

    def progress(self) -> dict[str, int]:
        """How many results the store holds per trial (0 before it is registered)."""
        from airflow_trials.exceptions import TrialNotFoundError

        store = self.store()
        try:
            counts = {}
            for trial_id in self.trial_ids:
                try:
                    counts[trial_id] = len(store.reader.get_results(trial_id))
                except TrialNotFoundError:
                    counts[trial_id] = 0
            return counts
        finally:
            store.dispose()

    def open_gate(self) -> None:
        """Let the held trials go on."""
        gate(self.journal_dir).touch()

    def close_gate(self) -> None:
        """Make the next run's trials hold again (a second run of the same experiment)."""
        gate(self.journal_dir).unlink(missing_ok=True)

    def wait_until_trials_deferred(
        self, min_results: int = HOLD_AT, timeout_s: float = 300
    ) -> None:
        """Every trial task deferred and every trial with at least ``min_results`` stored results
        (so its trigger is watching it)."""

        def ready() -> bool:
            tis = self.trial_tis()
            if any(ti["state"] in ("failed", "upstream_failed") for ti in tis):
                raise AssertionError(f"A task of {self.run_id} failed.{self._failed_logs()}")
            return (
                len(tis) == (1 if self.sweep else self.trials)
                and all(ti["state"] == "deferred" for ti in tis)
                and min(self.progress().values()) >= min_results
            )

        try:
            self.stack.wait_for(
                ready, timeout_s, f"the {self.trials} trials of {self.run_id} to run deferred"
            )
        except AssertionError as e:  # say where they stood, for the one who reads the failure
            states = [(ti["map_index"], ti["state"], ti["try_number"]) for ti in self.trial_tis()]
            raise AssertionError(
                f"{e} Trial tasks (map index, state, try): {states}; stored results per trial: "
                f"{self.progress()}; journaled iterations: {self._journaled()}."
            ) from e

    def _failed_logs(self, chars: int = 4000) -> str:
        """The end of each failed task instance's log in the run (an upstream task's failure
        leaves the trial tasks upstream_failed, with nothing of why in their own logs)."""
        tis = self.stack.task_instances(self.dag_id, self.run_id)
        return "".join(
            f"\n--- {ti['task_id']} (map index {ti['map_index']}, try {ti['try_number']}):\n"
            f"{self.log(ti)[-chars:]}"
            for ti in tis
            if ti["state"] == "failed"
        )

    def _journaled(self) -> dict[str, list[int]]:
        """How many iterations each trial's incarnations journaled, newest incarnation last."""
        return {
            trial_id: [len(i.iterations) for i in read_journal(self.journal_dir, trial_id)]
            for trial_id in self.trial_ids
        }

    def finish(self, timeout_s: float = RUN_TIMEOUT_S) -> str:
        return self.stack.wait_for_run(self.dag_id, self.run_id, timeout_s)

    def log(self, ti: dict[str, Any], try_number: int | None = None) -> str:
        return self.stack.task_log(
            self.dag_id, self.run_id, ti["task_id"], try_number or ti["try_number"], ti["map_index"]
        )

    def log_once_it_says(
        self, map_index: int, try_number: int, last_line: str, timeout_s: float = 60
    ) -> str:
        """A finished try's log once it holds ``last_line``: Airflow may record the try's state
        before its supervisor has written the task's last lines to the log."""
        ti = self.trial_ti(map_index)
        assert ti is not None, f"no trial task with map index {map_index}"

        def logged() -> str | None:
            text = self.log(ti, try_number=try_number)
            return text if last_line in text else None

        return self.stack.wait_for(
            logged, timeout_s, f"{last_line!r} in the log of try {try_number}"
        )

    # -- the three proofs
    # ----------------------------------------------------------------------------
    def assert_no_lost_results(self) -> None:
        """(a) Every trial's stored results are iterations 1..N: no gap, no repeat."""
        store = self.store()
        try:
            for trial_id in self.trial_ids:
                stored = [r["training_iteration"] for r in store.reader.get_results(trial_id)]
                assert stored == list(range(1, self.iterations + 1)), (trial_id, stored)
        finally:
            store.dispose()

    def assert_no_duplicate_trial(self) -> dict[str, list[Incarnation]]:
        """(b) No two incarnations of a trial ever ran at once; returns each trial's
        incarnations."""
        journals = {}
        for trial_id in self.trial_ids:
            incarnations = read_journal(self.journal_dir, trial_id)
            assert incarnations, f"trial {trial_id} never ran"
            for earlier, later in zip(incarnations, incarnations[1:], strict=False):
                assert later.started >= earlier.last_seen, (
                    f"trial {trial_id}: pid {later.pid} started at {later.started:.2f} while pid "
                    f"{earlier.pid} still ran (last seen {earlier.last_seen:.2f})",
                    incarnations,
                )
            # Each incarnation resumed where a checkpoint left it: none re-trained what one
            # reported.
            done = [it for inc in incarnations for it in inc.iterations]
            assert done[-1] == self.iterations, (trial_id, incarnations)
            journals[trial_id] = incarnations
        return journals

    def assert_trials_end(self, status: str = "TERMINATED") -> dict[str, Any]:
        """(c) Every trial's final status in the store; returns the trial records by id."""
        store = self.store()
        try:
            records = {trial_id: store.reader.get_trial(trial_id) for trial_id in self.trial_ids}
        finally:
            store.dispose()
        assert {t: r.status.value for t, r in records.items()} == dict.fromkeys(
            self.trial_ids, status
        )
        return records

    def assert_tasks_end(self, tries: dict[int, list[str]] | None = None) -> None:
        """(c) Every task instance succeeded; ``tries`` gives, per map index, the states of its
        tries in order where a fault made more than one (default: one successful try each)."""
        tis = self.stack.task_instances(self.dag_id, self.run_id)
        indexes = [-1] if self.sweep else list(range(self.trials))
        assert {(ti["task_id"], ti["map_index"]): ti["state"] for ti in tis} == {
            **{(f"{self.dag_id}.{t}", -1): "success" for t in ("suggest_configs", "select_best")},
            **{(self.trial_task, i): "success" for i in indexes},
        }
        for i in indexes:
            expected = (tries or {}).get(i, ["success"])
            got = [
                t["state"] for t in self.stack.tries(self.dag_id, self.run_id, self.trial_task, i)
            ]
            assert got == expected, (i, got)

    def assert_experiment_run(self, status: str = "SUCCESS") -> None:
        store = self.store()
        try:
            (run,) = [
                r
                for r in store.reader.list_experiment_runs(self.dag_id)
                if r.run_key == self.run_id
            ]
        finally:
            store.dispose()
        assert run.status.value == status


def on_ray(name: str) -> set[str]:
    """What Ray holds under a trial's name: ``{"placement_group", "actor"}`` or part of it."""
    import ray

    held = set()
    if any(
        info["name"] == name and info["state"] != "REMOVED"
        for info in ray.util.placement_group_table().values()
    ):
        held.add("placement_group")
    if any(entry["name"] == name for entry in ray.util.list_named_actors(all_namespaces=True)):
        held.add("actor")
    return held


@pytest.fixture
def experiment(stack) -> Iterator[Any]:
    """``experiment(dag_id, trials=..., hold_at=..., max_failures=..., keep_checkpoints_num=...,
    ...)``
    writes the DAG and returns its :class:`ExperimentRun`, ready to trigger (``hold_at=0``: the
    trials never hold)."""

    def make(
        dag_id: str,
        *,
        trials: int = 3,
        iterations: int = ITERATIONS,
        hold_at: int = HOLD_AT,
        max_failures: int = 1,
        scheduler: str = "None",
        sweep: bool = False,
        warm_start: str = "None",
        search_alg: str = "None",
        keep_checkpoints_num: int | None = None,
        resources: str = '{"cpu": 1}',
        extra: str = "",
    ) -> ExperimentRun:
        journal = stack.home / "journal" / dag_id
        journal.mkdir(
            parents=True, exist_ok=True
        )  # a second run of one experiment shares its journal
        stack.write_dag(
            f"{dag_id}.py",
            experiment_dag_source(
                dag_id,
                journal,
                trials=trials,
                iterations=iterations,
                hold_at=hold_at,
                max_failures=max_failures,
                scheduler=scheduler,
                sweep=sweep,
                warm_start=warm_start,
                search_alg=search_alg,
                keep_checkpoints_num=keep_checkpoints_num,
                resources=resources,
                extra=extra,
            ),
        )
        return ExperimentRun(stack, dag_id, journal, trials, iterations, sweep=sweep)

    yield make
