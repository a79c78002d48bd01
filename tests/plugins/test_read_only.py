"""The dashboard's store cannot write: nothing reachable from the object it reads through writes."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_trials.exceptions import StoreError
from airflow_trials.plugins.app import StoreProvider
from airflow_trials.store import TrialStore
from airflow_trials.store.database import Database
from airflow_trials.store.store import WRITERS
from tests.factories import add_results


def _public(obj: Any) -> set[str]:
    return {name for name in dir(obj) if not name.startswith("_")}


def _reachable(root: Any) -> list[Any]:
    """``root`` and every object of this package reachable from it through instance attributes
    and the containers they hold."""
    seen: dict[int, Any] = {}
    todo = [root]
    while todo:
        obj = todo.pop()
        if id(obj) in seen:
            continue
        seen[id(obj)] = obj
        if isinstance(obj, dict):
            todo.extend(obj.values())
        elif isinstance(obj, list | tuple | set | frozenset):
            todo.extend(obj)
        elif type(obj).__module__.startswith("airflow_trials") and hasattr(obj, "__dict__"):
            todo.extend(vars(obj).values())
        elif hasattr(obj, "__self__") and type(obj.__self__).__module__.startswith(
            "airflow_trials"
        ):
            todo.append(obj.__self__)  # a bound method: its object
    return list(seen.values())


@pytest.fixture
def dashboard_store(tmp_path):
    """The object the dashboard reads through, opened as the api-server opens it."""
    url = f"sqlite:///{tmp_path / 'trials.db'}"
    TrialStore(url, create=True).dispose()
    store = StoreProvider(url)()
    yield store
    store.dispose()


def test_the_dashboard_s_store_has_none_of_the_writers_methods(dashboard_store, tmp_path):
    writes = set().union(*(_public(writer) for writer in WRITERS))
    assert "record_transition" in writes and "upsert_trial" in writes  # the writers were found
    assert _public(dashboard_store) & writes == set()
    # What it has is the store's read side: every one of them is the store's reader's too.
    store = TrialStore(f"sqlite:///{tmp_path / 'trials.db'}")
    assert _public(dashboard_store) <= _public(store.reader)
    store.dispose()


def test_nothing_reachable_from_the_dashboard_s_store_writes(dashboard_store):
    reached = _reachable(dashboard_store)
    assert not [obj for obj in reached if isinstance(obj, WRITERS)]
    databases = [obj for obj in reached if isinstance(obj, Database)]
    assert databases and all(db.read_only and db.write_engine is None for db in databases)
    for db in databases:
        with pytest.raises(StoreError, match="open read-only .*write through a TrialStore"):
            db.transaction("write", lambda session: None)
    with pytest.raises(ValueError, match="read-only trials database cannot migrate"):
        Database(dashboard_store.url, create=True, read_only=True)


def test_the_dashboard_still_reads_everything_a_store_wrote(dashboard_store):
    store = TrialStore(dashboard_store.url)
    run = store.create_experiment_run("mnist", "r1")
    store.upsert_trial(
        "t1",
        trainable="pkg.train:fn",
        config={"lr": 0.1},
        resources={"cpu": 1},
        max_failures=0,
        experiment_run_id=run,
    )
    add_results(store, "t1", [{"training_iteration": 1, "loss": 0.5}])
    store.dispose()
    assert dashboard_store.get_trial("t1").config == {"lr": 0.1}
    assert [row.best_value for row in dashboard_store.leaderboard(run, "loss")] == [0.5]
    assert dashboard_store.trial_counts() == {run: 1}
