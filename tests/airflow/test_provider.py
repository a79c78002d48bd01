"""Provider registration, hooks' connection handling, the GPU pool, and the TrialSensor."""

from __future__ import annotations

import json

import pytest
from airflow.sdk.exceptions import TaskDeferred

from airflow_trials import TrialError
from airflow_trials.core.end import TrialEnd
from airflow_trials.core.fate import Transition, after_failure
from airflow_trials.core.status import TrialStatus
from airflow_trials.sensors.trial_sensor import TrialSensor
from airflow_trials.triggers.trial_trigger import TrialStatusTrigger


def test_provider_info_is_registered_on_the_entry_point():
    from importlib.metadata import entry_points

    (entry,) = [
        e
        for e in entry_points(group="apache_airflow_provider")
        if e.value.startswith("airflow_trials")
    ]
    info = entry.load()()
    assert info["package-name"] == "airflow-trials"
    types = {c["connection-type"]: c["hook-class-name"] for c in info["connection-types"]}
    assert types == {
        "ray": "airflow_trials.hooks.trials.RayHook",
        "trials_db": "airflow_trials.hooks.trials.TrialsDbHook",
    }


def test_airflow_providers_manager_sees_the_connection_types(airflow_home):
    from airflow.providers_manager import ProvidersManager
    from airflow.sdk.providers_manager_runtime import ProvidersManagerTaskRuntime

    assert "airflow-trials" in ProvidersManager().providers
    hooks = ProvidersManagerTaskRuntime().hooks  # what task code resolves connections with
    assert hooks["ray"].hook_class_name == "airflow_trials.hooks.trials.RayHook"
    assert hooks["trials_db"].hook_class_name == "airflow_trials.hooks.trials.TrialsDbHook"


def _conn(monkeypatch, conn_id, **fields):
    from airflow.sdk import Connection

    monkeypatch.setenv(
        f"AIRFLOW_CONN_{conn_id.upper()}", Connection(conn_id=conn_id, **fields).as_json()
    )


def test_trials_db_url_from_connection_env_or_default(airflow_home, monkeypatch, tmp_path):
    from airflow_trials.hooks.trials import TrialsDbHook

    monkeypatch.delenv("AIRFLOW_TRIALS_DB_URL", raising=False)
    assert TrialsDbHook("missing").get_url().endswith("/trials.db")
    monkeypatch.setenv("AIRFLOW_TRIALS_DB_URL", "sqlite:///x.db")
    assert TrialsDbHook("missing").get_url() == "sqlite:///x.db"
    _conn(
        monkeypatch,
        "db_extra",
        conn_type="trials_db",
        extra=json.dumps({"url": "postgresql+psycopg://a@h/t"}),
    )
    assert TrialsDbHook("db_extra").get_url() == "postgresql+psycopg://a@h/t"
    _conn(
        monkeypatch,
        "db_pg",
        conn_type="postgres",
        host="pg",
        login="u",
        password="p",
        port=5433,
        schema="trials",
    )
    assert TrialsDbHook("db_pg").get_url() == "postgresql+psycopg://u:p@pg:5433/trials"
    _conn(
        monkeypatch,
        "db_odd",
        conn_type="postgres",
        host="pg",
        login="u",
        password="p@ss:w/rd%",
        schema="trials",
    )
    from sqlalchemy.engine import make_url

    parsed = make_url(TrialsDbHook("db_odd").get_url())
    assert (parsed.password, parsed.host, parsed.database) == ("p@ss:w/rd%", "pg", "trials")


def test_ray_settings_from_connection_then_ray_address(airflow_home, monkeypatch):
    from airflow_trials.hooks.trials import RayHook

    monkeypatch.setenv("RAY_ADDRESS", "ray://from-env:10001")
    assert RayHook("missing").settings() == {
        "address": "ray://from-env:10001",
        "namespace": "airflow_trials",
        "runtime_env": None,
        "storage_path": None,
    }
    _conn(
        monkeypatch,
        "my_ray",
        conn_type="ray",
        host="ray://head:10001",
        extra=json.dumps(
            {"namespace": "tuning", "storage_path": "s3://b/t", "runtime_env": {"pip": ["x"]}}
        ),
    )
    assert RayHook("my_ray").settings() == {
        "address": "ray://head:10001",
        "namespace": "tuning",
        "runtime_env": {"pip": ["x"]},
        "storage_path": "s3://b/t",
    }


def test_ensure_gpu_pool_sets_slots_and_include_deferred(airflow_home):
    from airflow.models.pool import Pool

    from airflow_trials.pools import ensure_gpu_pool

    assert ensure_gpu_pool(2, name="gpus_test", slots_per_gpu=4) == ("gpus_test", 8)
    ensure_gpu_pool(3, name="gpus_test", slots_per_gpu=4)  # update in place
    pool = Pool.get_pool("gpus_test")
    assert pool.slots == 12 and pool.include_deferred is True


def test_sensor_defers_until_the_trial_ends_then_returns_statuses(trials_env):
    store = trials_env.store
    store.upsert_trial("s1", trainable="m:f", config={}, resources={}, max_failures=0)
    sensor = TrialSensor(
        task_id="wait", experiment_name="exp", trial_id="s1", deferrable=True, poke_interval=0.05
    )
    with pytest.raises(TaskDeferred) as deferred:
        sensor.execute({})
    assert isinstance(deferred.value.trigger, TrialStatusTrigger)
    store.record_transition("s1", Transition.PLACED)
    store.record_end(TrialEnd("s1", "exp", TrialStatus.TERMINATED))
    import asyncio

    async def first_event(trigger):
        events = trigger.run()
        try:
            return await events.asend(None)
        finally:
            await events.aclose()  # as the triggerer does: its cleanup runs inside the loop

    event = asyncio.run(first_event(deferred.value.trigger))
    assert sensor.execute_complete({}, event.payload) == {
        "done": True,
        "statuses": {"s1": "TERMINATED"},
        "failed": [],
    }


def test_sensor_waits_for_a_whole_experiment_run_and_fails_on_errors(trials_env):
    store = trials_env.store
    store.ensure_experiment("exp2", metric="loss", mode="min")
    run_pk = store.create_experiment_run("exp2", "manual__1")
    for trial_id, status in (("a", TrialStatus.TERMINATED), ("b", TrialStatus.ERROR)):
        store.upsert_trial(
            trial_id,
            trainable="m:f",
            config={},
            resources={},
            max_failures=0,
            experiment_run_id=run_pk,
        )
        store.record_transition(trial_id, Transition.PLACED)
        fate = None if status is TrialStatus.TERMINATED else after_failure(trial_id, 0, 0)
        store.record_end(TrialEnd(trial_id, "exp2", status), fate)
    sensor = TrialSensor(task_id="w", experiment_name="exp2", run_key="manual__1", deferrable=False)
    with pytest.raises(TrialError, match="trials b ended in ERROR"):
        sensor.poke({})
    relaxed = TrialSensor(
        task_id="w2", experiment_name="exp2", run_key="manual__1", fail_on_error=False
    )
    assert relaxed.poke({}).xcom_value["statuses"] == {"a": "TERMINATED", "b": "ERROR"}
    unknown = TrialSensor(task_id="w3", experiment_name="exp2", run_key="manual__9")
    assert unknown.poke({}).is_done is False


def test_sensor_needs_exactly_one_target():
    with pytest.raises(ValueError, match="exactly one of trial_id or run_key"):
        TrialSensor(task_id="x", experiment_name="e")


# What a task's ray.init(ray://...) raises when Ray Client's proxy started a server for the
# connection and that server died at birth (ray-project/ray#63202), as CI once saw it.
_SERVER_DIED = (
    "Initialization failure from server:\nTraceback (most recent call last):\n  File "
    '".../ray/util/client/server/proxier.py", line 772, in Datapath\n    raise RuntimeError(\n'
    "RuntimeError: Starting Ray client server failed. See ray_client_server_23001.err for "
    "detailed logs.\n"
)


@pytest.mark.parametrize("failures", [1, 2, 3])
def test_a_ray_client_server_dying_at_birth_costs_another_connection_not_the_task(
    airflow_home, monkeypatch, failures
):
    """The race is inside Ray's proxy and cannot be made to happen on demand with a real head,
    so ray.init stands in: it fails ``failures`` times as Ray does, then connects. Two failures
    are absorbed (CLIENT_SERVER_ATTEMPTS = 3); a third is the task's RayUnavailableError."""
    import ray

    from airflow_trials.exceptions import RayUnavailableError
    from airflow_trials.hooks.trials import CLIENT_SERVER_ATTEMPTS, RayHook

    assert CLIENT_SERVER_ATTEMPTS == 3
    calls: list[dict] = []

    def init(**kwargs):
        calls.append(kwargs)
        if len(calls) <= failures:
            raise ConnectionAbortedError(_SERVER_DIED)

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", init)
    monkeypatch.setattr(ray, "shutdown", lambda: None)
    monkeypatch.setenv("RAY_ADDRESS", "ray://head:10001")
    hook = RayHook("missing")
    if failures < CLIENT_SERVER_ATTEMPTS:
        hook._init_ray(hook.settings())
        assert len(calls) == failures + 1
    else:
        with pytest.raises(RayUnavailableError, match="(?s)ray://head:10001.*Starting Ray client"):
            hook._init_ray(hook.settings())
        assert len(calls) == CLIENT_SERVER_ATTEMPTS
    assert {call["address"] for call in calls} == {"ray://head:10001"}


def test_other_connection_errors_are_not_tried_again(airflow_home, monkeypatch):
    import ray

    from airflow_trials.exceptions import RayUnavailableError
    from airflow_trials.hooks.trials import RayHook

    calls = []

    def init(**kwargs):
        calls.append(kwargs)
        raise ConnectionError("Could not connect: ray://head:10001 refused")

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", init)
    monkeypatch.setenv("RAY_ADDRESS", "ray://head:10001")
    hook = RayHook("missing")
    with pytest.raises(RayUnavailableError, match="Airflow retries the task"):
        hook._init_ray(hook.settings())
    assert len(calls) == 1


def test_the_hook_hands_out_the_actor_client_not_the_runner_s_executor(airflow_home, monkeypatch):
    """A task or a trigger gets the one actor client (launch, attach, decide, release, terminate,
    fits-cluster) on the connection's storage and namespace, never a RayTrialExecutor."""
    from airflow_trials.execution.driver.actor_client import TrialActorClient
    from airflow_trials.hooks.trials import RayHook, TrialsHook

    settings = {"storage_path": "/shared/results", "namespace": "team_a"}
    verified = []

    def get_conn(self, verify=False):
        verified.append(verify)
        return settings

    monkeypatch.setattr(RayHook, "get_conn", get_conn)
    client = TrialsHook("missing", "missing").get_actor_client(verify=True)
    assert type(client) is TrialActorClient and verified == [True]
    assert client.namespace == "team_a" and client.detached
    assert client.storage.storage_path == "/shared/results"
    assert not hasattr(client, "start_trial")  # the runner's executor is not what a task builds
