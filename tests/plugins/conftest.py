"""Fixtures for the dashboard: a real trials store with experiment data, and the dashboard behind
Airflow's real auth manager (tokens from its ``/auth/token`` endpoint)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pytest

from airflow_trials.core.end import TrialEnd
from airflow_trials.core.fate import Transition
from airflow_trials.core.status import TrialStatus
from tests.factories import add_checkpoint, add_results, update_trial

HOSTILE = "<script>alert(1)</script>"
TRACEBACK = (
    'Traceback (most recent call last):\n  File "train.py", line 3, in '
    'train\nRuntimeError: CUDA <oom> & "boom"'
)
# 2026-11-21 03:12:45 UTC: the seeded results' timestamps count from it.
FIRST_RESULT_AT = 1795230765.0
USERS = {"admin": "admin", "alice": "viewer", "bob": "viewer"}  # bob may read other_dag only


@dataclass
class Seeded:
    """What :func:`seed_store` wrote."""

    run: int
    other_run: int
    hostile_run: int
    best_trial: str
    failed_trial: str
    hostile_trial: str
    trials: list[str] = field(default_factory=list)


def _loss(index: int, iteration: int) -> float:
    return round(1.0 / iteration + 0.01 * index, 6)


def _result(index: int, iteration: int) -> dict[str, float | int]:
    """A result as the engine reports it: the trainable's metrics and the engine's fields."""
    return {
        "training_iteration": iteration,
        "loss": _loss(index, iteration),
        "acc": 1 - _loss(index, iteration),
        "timestamp": FIRST_RESULT_AT + 30.25 * iteration,
        "time_this_iter_s": 30.25,
        "time_total_s": 30.25 * iteration,
        "pid": 4242,
    }


def seed_store(store, num_trials: int = 12, iterations: int = 10) -> Seeded:
    """Experiment data written through TrialStore's API, as the operator and trigger write it."""
    store.ensure_experiment("mnist", metric="loss", mode="min")
    run = store.create_experiment_run(
        "mnist",
        "manual__2026-11-21",
        dag_id="tune_mnist",
        run_id="manual__2026-11-21",
        search_space={"lr": [0.1, 0.01]},
    )
    trials = []
    for i in range(num_trials):
        trial_id = f"mnist-{i:02d}"
        trials.append(trial_id)
        store.upsert_trial(
            trial_id,
            trainable="pkg.train:fn",
            config={"lr": 0.1 / (i + 1), "layers": i % 3},
            resources={"cpu": 1},
            max_failures=1,
            experiment_run_id=run,
            dag_id="tune_mnist",
            run_id="manual__2026-11-21",
            task_id="mnist.trial",
            map_index=i,
            try_number=1,
        )
        store.record_transition(trial_id, Transition.PLACED)
        if i == num_trials - 1:
            continue  # still running, no results yet: ranks last
        add_results(store, trial_id, [_result(i, it) for it in range(1, iterations + 1)])
        add_checkpoint(store, trial_id, f"/ckpt/{trial_id}/5", 5, score=_loss(i, 5))
        add_checkpoint(
            store,
            trial_id,
            f"/ckpt/{trial_id}/{iterations}",
            iterations,
            score=_loss(i, iterations),
        )
        store.record_end(TrialEnd(trial_id, "mnist", TrialStatus.TERMINATED))
    failed = trials[3]
    store.record_transition(failed, Transition.QUEUED)
    update_trial(store, failed, num_failures=1, error_msg=TRACEBACK)
    store.record_transition(failed, Transition.ABANDONED)

    store.ensure_experiment("secret", metric="loss", mode="min")
    other_run = store.create_experiment_run("secret", "r1", dag_id="other_dag", run_id="r1")
    store.upsert_trial(
        "secret-0",
        trainable="pkg.train:fn",
        config={"lr": 0.5},
        resources={"cpu": 1},
        max_failures=0,
        experiment_run_id=other_run,
        dag_id="other_dag",
        run_id="r1",
        task_id="t",
        map_index=0,
    )
    add_results(store, "secret-0", [{"training_iteration": 1, "loss": 0.3}])

    store.ensure_experiment("hostile", metric="loss", mode="max")
    hostile_run = store.create_experiment_run("hostile", "h1", dag_id="tune_mnist", run_id="h1")
    store.upsert_trial(
        "hostile-0",
        trainable="pkg.train:fn",
        config={HOSTILE: HOSTILE, "note": f'"><img src=x onerror=alert(2)>{HOSTILE}'},
        resources={"cpu": 1},
        max_failures=0,
        experiment_run_id=hostile_run,
        dag_id="tune_mnist",
        run_id="h1",
        task_id="hostile.trial",
        map_index=0,
    )
    add_results(store, "hostile-0", [{"training_iteration": 1, "loss": 0.5, HOSTILE: 1.0}])
    store.record_transition("hostile-0", Transition.PLACED)
    store.record_transition("hostile-0", Transition.ABANDONED, why=f"ValueError: {HOSTILE}")
    return Seeded(
        run=run,
        other_run=other_run,
        hostile_run=hostile_run,
        best_trial="mnist-00",
        failed_trial=failed,
        hostile_trial="hostile-0",
        trials=trials,
    )


@pytest.fixture
def trials_store(tmp_path):
    from airflow_trials.store import TrialStore

    # Written through the store, as the operator and trigger write; the dashboard gets its reader.
    store = TrialStore(f"sqlite:///{tmp_path / 'trials.db'}", create=True)
    yield store
    store.dispose()


@pytest.fixture
def seeded(trials_store) -> Seeded:
    return seed_store(trials_store)


@pytest.fixture
def auth_config(tmp_path, monkeypatch) -> dict[str, str]:
    """SimpleAuthManager (narrowed per DAG for bob) with known passwords, as environment
    settings."""
    passwords = tmp_path / "passwords.json"
    passwords.write_text(json.dumps({user: f"{user}-pw" for user in USERS}))
    env = {
        "AIRFLOW__CORE__AUTH_MANAGER": "tests.plugins.auth_manager.DagScopedAuthManager",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": ",".join(f"{u}:{r}" for u, r in USERS.items()),
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords),
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "False",
        "AIRFLOW__API_AUTH__JWT_SECRET": "dashboard-tests-" + "s" * 64,
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return env


@dataclass
class Dashboard:
    client: object
    tokens: dict[str, str]
    seeded: Seeded | None = None

    def get(self, path: str, user: str | None = "admin", **kwargs):
        headers = kwargs.pop("headers", {})
        if user is not None:
            headers["Authorization"] = f"Bearer {self.tokens[user]}"
        return self.client.get(f"/trials{path}", headers=headers, **kwargs)


@pytest.fixture
def make_dashboard(airflow_home, auth_config):
    """Builds the dashboard on a store, mounted at /trials next to Airflow's auth manager app at
    /auth."""
    from airflow.api_fastapi.app import init_auth_manager, purge_cached_app
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from airflow_trials.plugins.app import create_app

    clients = []

    def make(store, seeded: Seeded | None = None) -> Dashboard:
        """``store``: a TrialReader, or a TrialStore whose reader the dashboard gets."""
        reader = getattr(store, "reader", store)
        purge_cached_app()
        root = FastAPI()
        init_auth_manager(root)
        root.mount("/trials", create_app(lambda: reader))
        client = TestClient(root, follow_redirects=False)
        clients.append(client)
        tokens = {}
        for user in USERS:
            response = client.post("/auth/token", json={"username": user, "password": f"{user}-pw"})
            assert response.status_code == 201, response.text
            tokens[user] = response.json()["access_token"]
        return Dashboard(client=client, tokens=tokens, seeded=seeded)

    yield make
    for client in clients:
        client.close()
    purge_cached_app()


@pytest.fixture
def dashboard(make_dashboard, trials_store, seeded) -> Dashboard:
    return make_dashboard(trials_store, seeded)
