"""The production shape, run and broken for real (docs/deploy.md, docs/reliability.md).

One shape for the module (``airflow_trials.shape.local.LocalShape``, as ``airflow-trials shape
up`` starts it): the CeleryExecutor with two workers (queues ``default`` and ``gpu``) and Redis,
two triggerers, a three-node Ray cluster (a head that only coordinates, a CPU node, a node with 2
logical GPUs), Airflow's metadata DB and the trials DB on PostgreSQL, and checkpoints on an S3 API
(moto's server, the stand-in for S3): no directory is shared by two nodes for checkpoints. The
trials' journal (tests/faults/trainables.py) is a local file of the test, not the engine's.

The example DAGs run on it end to end; then each fault of the table in docs/reliability.md is
injected by killing, stopping or freezing real processes, and each case makes the fault suite's
proofs: no lost result, no duplicate trial, the right end. Before each case the stack brings back
what an earlier one left broken.

Needs PostgreSQL (AIRFLOW_TRIALS_TEST_POSTGRES_URL; skipped with the reason when unset).
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_trials.shape import spec, triggerers
from airflow_trials.shape.local import LocalShape
from airflow_trials.shape.setup import port_open
from airflow_trials.shape.supervisor import Supervisor
from tests.conftest import REPO
from tests.faults.conftest import HOLD_AT, ExperimentRun, on_ray
from tests.faults.shape_stack import ShapeStack, bundle_nodes, kill_a_train_worker, node_names

pytestmark = [pytest.mark.timeout(1200), pytest.mark.postgres]

POSTGRES_URL_ENV = "AIRFLOW_TRIALS_TEST_POSTGRES_URL"
GPU_TRIAL = '{"cpu": 1, "gpu": 1}'
# A trial of two bundles, the second with a logical GPU (issue 51), in Ray Tune's spelling.
TWO_BUNDLES = 'PlacementGroupFactory([{"CPU": 1}, {"CPU": 1, "GPU": 1}], strategy="SPREAD")'
# How long the S3 endpoint stays frozen while the trials save checkpoints.
S3_OUTAGE_S = 20


@pytest.fixture(scope="module")
def shape(tmp_path_factory) -> Iterator[LocalShape]:
    url = os.environ.get(POSTGRES_URL_ENV)
    if not url:
        pytest.skip(f"the production shape needs PostgreSQL: set {POSTGRES_URL_ENV}")
    import ray

    from tests.conftest import shutdown_ray

    shutdown_ray()  # another module's local Ray: this process connects to the shape's instead
    home = tmp_path_factory.mktemp("shape")
    dags = home / "dags"
    dags.mkdir()
    the_shape = LocalShape(home, dags_folder=dags, postgres_url=url, env={"PYTHONPATH": REPO})
    try:
        the_shape.up()
        yield the_shape
    finally:
        ray.shutdown()
        the_shape.down(drop_databases=True)


@pytest.fixture
def stack(shape) -> Iterator[ShapeStack]:
    """The shape, whole again, with this process connected to its Ray cluster."""
    import ray

    shape_stack = ShapeStack(shape)
    shape_stack.heal()
    if not ray.is_initialized():
        ray.init(
            address=shape.addresses.ray_address, namespace="airflow_trials", log_to_driver=False
        )
    yield shape_stack
    shape_stack.close()


def _results(store: Any, trial_id: str) -> list[dict[str, Any]]:
    return list(store.reader.get_results(trial_id))


def _store(shape: LocalShape) -> Any:
    from airflow_trials.store import TrialStore

    return TrialStore(shape.addresses.trials_db_url)


def _s3(shape: LocalShape) -> Any:
    import s3fs

    settings = spec.s3_settings(shape.addresses)
    return s3fs.S3FileSystem(
        key=settings["AWS_ACCESS_KEY_ID"],
        secret=settings["AWS_SECRET_ACCESS_KEY"],
        endpoint_url=shape.addresses.s3_endpoint_url,
        skip_instance_cache=True,
    )


def _assert_checkpoints_on_s3(shape: LocalShape, trial_ids: list[str]) -> None:
    """Every kept checkpoint of the trials is an s3:// URL that the S3 endpoint holds."""
    fs = _s3(shape)
    store = _store(shape)
    try:
        for trial_id in trial_ids:
            paths = [c.path for c in store.reader.live_checkpoints(trial_id)]
            assert paths, f"trial {trial_id} kept no checkpoint"
            for path in paths:
                assert path.startswith(f"s3://{spec.BUCKET}/"), path
                assert fs.exists(f"{path}/.airflow_trials_checkpoint.json"), path
    finally:
        store.dispose()


def _node_of_last_result(store: Any, trial_ids: list[str]) -> dict[str, str]:
    return {trial_id: _results(store, trial_id)[-1]["node_id"] for trial_id in trial_ids}


def _assert_untouched(run: ExperimentRun) -> None:
    """The run succeeded as if nothing had happened: every trial ran once (one incarnation),
    stored 1..N, and every task ended on its first try with no failure counted."""
    assert run.finish() == "success"
    run.assert_no_lost_results()
    journals = run.assert_no_duplicate_trial()
    assert all(len(incarnations) == 1 for incarnations in journals.values()), journals
    run.assert_tasks_end()
    _assert_not_counted(run)


def _assert_not_counted(run: ExperimentRun) -> None:
    """No trial spent one of its max_failures."""
    records = run.assert_trials_end()
    assert {t: r.num_failures for t, r in records.items()} == dict.fromkeys(run.trial_ids, 0)


def test_the_example_dags_run_end_to_end_on_the_shape(stack, shape):
    for path in (Path(REPO) / "dags").glob("*.py"):
        shutil.copy(path, shape.dags_folder)
    runs = {
        dag_id: stack.trigger(dag_id)
        for dag_id in (
            "example_regression_tuning",
            "nightly_regression_tuning",
            "sweep_regression_tuning",
        )
    }
    stack.wait_for_dag("ui_regression_tuning")
    conf = {"num_samples": 2, "epochs": 4, "gpus_per_trial": 0.5}
    body = {"dag_run_id": "ui_form", "logical_date": None, "conf": conf}
    stack.api("POST", "/dags/ui_regression_tuning/dagRuns", json=body)
    runs["ui_regression_tuning"] = "ui_form"
    for dag_id, run_id in runs.items():
        assert stack.wait_for_run(dag_id, run_id, 900) == "success", dag_id

    nodes = node_names(shape)
    store = _store(shape)
    try:
        trials = {
            dag_id: [t.trial_id for t in store.reader.list_trials(experiment_name=dag_id)]
            for dag_id in runs
        }
        used = {
            r["node_id"] for t in trials["example_regression_tuning"] for r in _results(store, t)
        }
        # CPU trials run on the worker nodes (which of the two is Ray's placement, not ours);
        # the head, with no CPUs, runs none.
        assert used and used <= {nodes["ray-worker"], nodes["ray-gpu-worker"]}, (used, nodes)
        for dag_id in ("nightly_regression_tuning", "ui_regression_tuning"):
            gpu_nodes = {r["node_id"] for t in trials[dag_id] for r in _results(store, t)}
            assert gpu_nodes == {nodes["ray-gpu-worker"]}, (dag_id, gpu_nodes, nodes)
    finally:
        store.dispose()
    # GPU trials' tasks went to the gpu queue (its own Celery worker), the others to default.
    for dag_id, run_id in runs.items():
        queues = {
            ti["task_id"].rsplit(".", 1)[-1]: ti["queue"]
            for ti in stack.task_instances(dag_id, run_id)
            if ti["state"] == "success"
        }
        gpu = dag_id in ("nightly_regression_tuning", "ui_regression_tuning")
        trial_queue = spec.GPU_QUEUE if gpu else spec.DEFAULT_QUEUE
        ran_trials = {k: v for k, v in queues.items() if k.startswith(("trial", "sweep"))}
        assert ran_trials and set(ran_trials.values()) == {trial_queue}, (dag_id, queues)
        assert queues["select_best"] == spec.DEFAULT_QUEUE
    _assert_checkpoints_on_s3(
        shape, trials["example_regression_tuning"] + trials["sweep_regression_tuning"]
    )


def test_a_celery_worker_redis_and_a_triggerer_lost_while_the_trials_are_deferred(
    stack, shape, experiment
):
    """Three faults while the tasks are deferred, none of which may touch a trial: a Celery
    worker and Redis SIGKILLed, which the shape's supervisor starts again (as systemd or
    Kubernetes would; no restart by hand), and the triggerer running the triggers SIGKILLed (the
    other one takes its triggers over)."""
    run = experiment("shape_deferred", trials=3)
    run.trigger()
    run.wait_until_trials_deferred()
    first_tries = {ti["map_index"]: ti["try_number"] for ti in run.trial_tis()}

    supervisor = Supervisor(shape)
    supervisor.start()
    try:
        worker_pid = shape.pid("airflow-worker")
        stack.signal("airflow-worker", signal.SIGKILL)  # dies, as a crash: still expected
        stack.signal("redis", signal.SIGKILL)
        stack.wait_for(
            lambda: (
                port_open(shape.addresses.local_ports["redis"])
                and shape.pid("airflow-worker") != worker_pid
                and shape.worker_ready("airflow-worker")
            ),
            300,
            "the supervisor to bring Redis and the Celery worker back",
        )
        assert {name for name, _ in supervisor.restarts} == {"redis", "airflow-worker"}

        # Killed on purpose (``LocalShape.kill``): not the supervisor's to bring back.
        takeover = triggerers.kill_the_busiest(shape)
        assert takeover.moved >= 1, takeover
        print(f"[shape] {takeover}; restarted by the supervisor: {supervisor.restarts}")
    finally:
        supervisor.stop()

    # Nothing happened to the trials: the same tasks deferred on their first tries.
    assert {ti["map_index"]: (ti["state"], ti["try_number"]) for ti in run.trial_tis()} == {
        i: ("deferred", first_tries[i]) for i in first_tries
    }
    run.open_gate()
    _assert_untouched(run)


def test_a_celery_worker_killed_mid_execute_leaves_one_copy_and_nothing_behind(
    stack, shape, experiment
):
    """The Celery worker running a trial task SIGKILLed inside ``execute``, the moment Ray shows
    the trial's placement group (before the actor exists, or just after, and before the task
    defers). Airflow fails the try once the dead worker's heartbeat times out; the retry removes
    what the dead try left on Ray or re-attaches to it, so exactly one copy runs, and nothing
    stays behind."""
    run = experiment("shape_worker_killed", trials=1, max_failures=1)
    run.trigger()
    (target,) = run.trial_ids
    stack.wait_for(
        lambda: "placement_group" in on_ray(run.actor_name(target)),
        300,
        f"the placement group of trial {target}",
        interval_s=0.02,
    )
    stack.signal("airflow-worker", signal.SIGSTOP)
    stack.kill("airflow-worker")
    stack.start("airflow-worker")
    run.wait_for_trial_ti(0, "deferred", try_number=2, timeout_s=600)
    run.open_gate()
    assert run.finish() == "success"
    run.assert_no_lost_results()
    run.assert_no_duplicate_trial()
    run.assert_tasks_end({0: ["failed", "success"]})
    run.assert_trials_end()
    assert on_ray(run.actor_name(target)) == set()


def test_a_ray_worker_node_lost_mid_trial_resumes_its_trials_on_another_node_from_s3(
    stack, shape, experiment
):
    """A spot preemption: the node hosting trials SIGKILLed. Its trials resume on the other
    node from their last checkpoint on S3, without spending a max_failure (Ray Tune kills the
    whole trial here, ray#50187); max_failures=0, so a counted failure would fail the run."""
    run = experiment("shape_node_lost", trials=3, max_failures=0)
    run.trigger()
    run.wait_until_trials_deferred()
    nodes = node_names(shape)
    store = _store(shape)
    try:
        placed = _node_of_last_result(store, run.trial_ids)
    finally:
        store.dispose()
    victim = max(
        ("ray-worker", "ray-gpu-worker"), key=lambda n: list(placed.values()).count(nodes[n])
    )
    survivor = next(n for n in ("ray-worker", "ray-gpu-worker") if n != victim)
    lost = [t for t, node in placed.items() if node == nodes[victim]]
    assert lost, (placed, nodes)

    stack.kill(victim)
    run.open_gate()
    assert run.finish() == "success"
    run.assert_no_lost_results()
    journals = run.assert_no_duplicate_trial()
    _assert_not_counted(run)
    store = _store(shape)
    try:
        after = _node_of_last_result(store, run.trial_ids)
    finally:
        store.dispose()
    for trial_id in lost:
        resumed = journals[trial_id][-1]
        assert len(journals[trial_id]) == 2 and resumed.resumed_from >= HOLD_AT, journals[trial_id]
        assert after[trial_id] == nodes[survivor], (trial_id, after, nodes)
    lost_indexes = {run.trial_ids.index(t) for t in lost}
    run.assert_tasks_end({i: ["failed", "success"] for i in lost_indexes})
    _assert_checkpoints_on_s3(shape, run.trial_ids)


def test_the_s3_endpoint_down_while_the_trials_save_checkpoints(stack, shape, experiment):
    """The S3 endpoint frozen (it answers nothing) for 20 s while every iteration saves a
    checkpoint: the saves wait and retry, no checkpoint is lost and no failure is counted."""
    run = experiment("shape_s3_down", trials=2)
    run.trigger()
    run.wait_until_trials_deferred()
    stack.signal("s3", signal.SIGSTOP)
    try:
        run.open_gate()
        time.sleep(S3_OUTAGE_S)  # the fault's length, not a wait for an outcome
    finally:
        stack.signal("s3", signal.SIGCONT)
    _assert_untouched(run)
    _assert_checkpoints_on_s3(shape, run.trial_ids)


def test_the_gpu_node_lost_while_a_gpu_trial_runs_waits_for_a_gpu_node(stack, shape, experiment):
    """The GPU node lost: the trial waits PENDING for GPU capacity, deferred and holding its
    pool slots, and resumes from its checkpoint when a GPU node joins again."""
    run = experiment(
        "shape_gpu_lost", trials=1, max_failures=0, resources=GPU_TRIAL, extra='gpu_pool="gpu",'
    )
    run.trigger()
    run.wait_until_trials_deferred()
    assert run.trial_ti(0)["queue"] == spec.GPU_QUEUE

    stack.kill("ray-gpu-worker")
    run.wait_for_trial_ti(0, "deferred", try_number=2)

    def waiting() -> Any:
        store = _store(shape)
        try:
            status = store.reader.get_trial(run.trial_ids[0]).status.value
        finally:
            store.dispose()
        pool = stack.api("GET", f"/pools/{spec.GPU_POOL}")
        return status == "PENDING" and pool["deferred_slots"] == spec.SLOTS_PER_GPU and pool

    pool = stack.wait_for(waiting, 300, "the trial to wait PENDING, holding its pool slots")
    assert pool["open_slots"] == spec.GPU_NODE_GPUS * spec.SLOTS_PER_GPU - spec.SLOTS_PER_GPU

    stack.start("ray-gpu-worker")
    shape.wait_for_ray_node("ray-gpu-worker")
    run.open_gate()
    assert run.finish() == "success"
    run.assert_no_lost_results()
    journals = run.assert_no_duplicate_trial()
    (trial_id,) = run.trial_ids
    assert len(journals[trial_id]) == 2 and journals[trial_id][-1].resumed_from >= HOLD_AT
    run.assert_tasks_end({0: ["failed", "success"]})
    _assert_not_counted(run)


def test_the_stack_stopped_and_started_again_resumes_every_trial(stack, shape, experiment):
    """Airflow and Ray stopped (SIGTERM, as a service manager does) and started again, with
    PostgreSQL, Redis and S3 kept as a deployment keeps them: every trial resumes from its
    checkpoint on S3."""
    import ray

    run = experiment("shape_restart", trials=3)
    run.trigger()
    run.wait_until_trials_deferred()
    ray.shutdown()
    owned = [p.name for p in shape.processes.values() if p.kind in ("airflow", "ray")]
    shape.stop(*reversed(owned))
    shape.start_ray()
    shape.start_airflow()
    run.open_gate()
    assert run.finish() == "success"
    run.assert_no_lost_results()
    journals = run.assert_no_duplicate_trial()
    for trial_id, incarnations in journals.items():
        assert len(incarnations) == 2 and incarnations[-1].resumed_from >= HOLD_AT, (
            trial_id,
            incarnations,
        )
    _assert_not_counted(run)
    _assert_checkpoints_on_s3(shape, run.trial_ids)


def test_a_trial_of_two_bundles_spread_over_two_nodes_loses_its_actor_s_node(
    stack, shape, experiment
):
    """Issue 51: a trial of two bundles, the second with a GPU, spread over the two worker nodes;
    the node of its first bundle (its actor's) SIGKILLed mid-training. The whole trial restarts
    from its last checkpoint on S3 once its bundles fit again (here at once: SPREAD lets both go
    to the GPU node), without spending one of its max_failures, and its stored iterations have no
    gap or repeat. Its pool slots count the GPU bundle."""
    run = experiment(
        "shape_bundles", trials=1, max_failures=0, resources=TWO_BUNDLES, extra='gpu_pool="gpu",'
    )
    run.trigger()
    run.wait_until_trials_deferred()
    (trial_id,) = run.trial_ids
    nodes = node_names(shape)
    assert bundle_nodes(run.actor_name(trial_id)) == {
        0: nodes["ray-worker"],
        1: nodes["ray-gpu-worker"],
    }
    assert stack.api("GET", f"/pools/{spec.GPU_POOL}")["deferred_slots"] == spec.SLOTS_PER_GPU

    stack.kill("ray-worker")
    run.wait_for_trial_ti(0, "deferred", try_number=2)
    placed = stack.wait_for(
        lambda: bundle_nodes(run.actor_name(trial_id)), 300, "the trial's bundles placed again"
    )
    assert set(placed.values()) == {nodes["ray-gpu-worker"]}, (placed, nodes)
    run.open_gate()
    assert run.finish() == "success"
    run.assert_no_lost_results()
    journals = run.assert_no_duplicate_trial()
    assert len(journals[trial_id]) == 2 and journals[trial_id][-1].resumed_from >= HOLD_AT
    run.assert_tasks_end({0: ["failed", "success"]})
    _assert_not_counted(run)
    store = _store(shape)
    try:
        assert _node_of_last_result(store, [trial_id]) == {trial_id: nodes["ray-gpu-worker"]}
    finally:
        store.dispose()


def test_the_ray_train_example_spreads_its_workers_over_two_nodes_and_survives_a_killed_one(
    stack, shape
):
    """Issue 51: ``dags/ray_train_tuning.py`` end to end on the shape. Each trial's 2 Train
    workers run on the two worker nodes (``placement_strategy="SPREAD"``), as the node ids
    recorded with every result show. A Train worker's process SIGKILLed mid-epoch is started
    again by Train from the trial's latest checkpoint (``train_max_failures``): the trial goes on
    in the same actor, no failure counted, no gap or repeat in its iterations."""
    pytest.importorskip("torch", reason="the Ray Train example needs torch (.ci/run installs it)")
    shutil.copy(Path(REPO) / "dags" / "ray_train_tuning.py", shape.dags_folder)
    run_id = stack.trigger("ray_train_tuning")
    store = _store(shape)
    try:

        def kill_once_a_trial_reported_twice() -> tuple[str, int] | None:
            trials = store.reader.list_trials(experiment_name="ray_train_tuning")
            if not any(len(_results(store, t.trial_id)) >= 2 for t in trials):
                return None
            return kill_a_train_worker("ray_train_tuning")

        killed, pid = stack.wait_for(kill_once_a_trial_reported_twice, 600, "a Train worker")
        assert stack.wait_for_run("ray_train_tuning", run_id, 900) == "success"
        nodes = node_names(shape)
        spread = sorted([nodes["ray-worker"], nodes["ray-gpu-worker"]])
        trials = store.reader.list_trials(experiment_name="ray_train_tuning")
        assert len(trials) == 4 and {t.num_failures for t in trials} == {0}, trials
        for trial in trials:
            results = _results(store, trial.trial_id)
            steps = [(r["training_iteration"], r["epoch"]) for r in results]
            assert steps == [(i, i) for i in range(1, len(results) + 1)], (trial.trial_id, steps)
            assert all(r["worker_node_ids"] == spread for r in results), trial.trial_id
        # The killed worker's trial ran on in its one actor: Train restarted the workers.
        since_restore = [r["iterations_since_restore"] for r in _results(store, killed)]
        assert since_restore == list(range(1, len(since_restore) + 1)), (killed, pid)
    finally:
        store.dispose()
