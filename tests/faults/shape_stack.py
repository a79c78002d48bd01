"""The production shape (``airflow_trials.shape.local.LocalShape``) behind the fault tests' stack
interface, so that :class:`~tests.faults.conftest.ExperimentRun` and its proofs run on it as they
do on the LocalExecutor stack."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

from airflow_trials.shape.local import ADMIN_PASSWORD, LocalShape
from tests.faults.stack import FaultStack


class ShapeStack(FaultStack):
    """A :class:`FaultStack` whose processes are the shape's: Airflow's components under their
    shape names (``airflow-triggerer-1``, ``airflow-worker``, ...), the Ray nodes, Redis and the
    S3 stand-in. The REST API, the waits and the proofs are FaultStack's."""

    admin_password = ADMIN_PASSWORD

    def __init__(self, shape: LocalShape) -> None:  # FaultStack's set-up is the shape's here
        self.shape = shape
        self.home = shape.home
        self.dags_folder = shape.dags_folder
        self.trials_db_url = shape.addresses.trials_db_url
        self.api_port = shape.addresses.api_port
        self._client = None

    # The process table is the shape's.
    @property
    def procs(self) -> dict[str, Any]:  # type: ignore[override]
        return self.shape.procs

    @property
    def expected(self) -> set[str]:  # type: ignore[override]
        return self.shape.expected

    @property
    def logs(self) -> Path:
        return self.shape.logs

    def log_path(self, name: str) -> Path:
        return self.shape.log_path(name)

    def start(self, *names: str) -> None:
        self.shape.start(*names)

    def kill(self, name: str) -> None:
        self.shape.kill(name)

    def signal(self, name: str, sig: signal.Signals) -> None:
        self.shape.signal(name, sig)

    def stop(self, *names: str, timeout_s: float = 60) -> dict[str, int | None]:
        self.shape.stop(*names, timeout_s=timeout_s)
        return {}

    def check_alive(self) -> None:
        self.shape.check_alive()

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def heal(self) -> None:
        """Bring back whatever a case left killed, stopped or frozen."""
        for name in self.shape.processes:
            if self.shape.is_running(name):
                self.shape.signal(name, signal.SIGCONT)
        if not self.shape.is_running("redis") or not self.shape.is_running("s3"):
            for name in ("redis", "s3"):
                if not self.shape.is_running(name):
                    self.shape.start(name)
        if not self.shape.is_running("ray-head"):
            self.shape.start_ray()
        for node in ("ray-worker", "ray-gpu-worker"):
            if not self.shape.is_running(node):
                self.shape.start(node)
                self.shape.wait_for_ray_node(node)
        stopped = [
            p.name
            for p in self.shape.processes.values()
            if p.kind == "airflow" and not self.shape.is_running(p.name)
        ]
        if stopped:
            self.shape.start(*stopped)
            self.shape.wait_until_serving()


def node_names(shape: LocalShape) -> dict[str, str]:
    """Ray's node id of each live node of the shape, by the shape's name for it (read from the
    node manager ports the shape gave them)."""
    import ray

    by_port = {
        port: key.split(":", 1)[0]
        for key, port in shape.addresses.local_ports.items()
        if key.endswith(":node-manager-port")
    }
    return {
        by_port[node["NodeManagerPort"]]: node["NodeID"]
        for node in ray.nodes()
        if node["Alive"] and node["NodeManagerPort"] in by_port
    }


def bundle_nodes(group_name: str) -> dict[int, str] | None:
    """The node id of each bundle of the placement group named ``group_name`` (a trial's group
    carries its actor's name), once it is placed; None while no group of that name is. There is
    never more than one group of that name that is not removed."""
    import ray

    groups = [
        info
        for info in ray.util.placement_group_table().values()
        if info["name"] == group_name and info["state"] != "REMOVED"
    ]
    assert len(groups) <= 1, groups
    if not groups or groups[0]["state"] != "CREATED":
        return None
    return {int(index): node for index, node in groups[0]["bundles_to_node_id"].items()}


def kill_a_train_worker(experiment_name: str) -> tuple[str, int] | None:
    """SIGKILL the process of one live Ray Train worker of a trial of ``experiment_name``;
    ``(trial_id, pid)``, or None while no such worker runs. A worker's owner is Train's
    controller, whose owner is the trial's actor (named ``trial.<experiment>.<trial id>``)."""
    import os

    from ray._private.state import actors  # the GCS's table: no dashboard needed

    live = [a for a in actors().values() if a["State"] == "ALIVE"]
    by_address = {(a["Address"]["IPAddress"], a["Address"]["Port"]): a for a in live}
    prefix = f"trial.{experiment_name}."
    for worker in live:
        if not worker["ActorClassName"].endswith("RayTrainWorker"):
            continue
        owner = worker["OwnerAddress"]
        controller = by_address.get((owner["IPAddress"], owner["Port"]))
        if controller is None:
            continue
        owner = controller["OwnerAddress"]
        trial = by_address.get((owner["IPAddress"], owner["Port"]))
        if trial is not None and trial["Name"].startswith(prefix):
            os.kill(worker["Pid"], signal.SIGKILL)
            return trial["Name"][len(prefix) :], worker["Pid"]
    return None
