"""The production shape as data: which processes it runs, with which arguments and settings.

One description serves both ways of running the shape: :mod:`airflow_trials.shape.local` starts
it as processes on one machine (``airflow-trials shape up``), and ``docker-compose.yml`` is checked
against it (``tests/deploy/test_compose.py``), so that the two cannot drift apart.

The shape, as users run it in production:

- Airflow with the CeleryExecutor: an api-server, a scheduler, a dag-processor, **two
  triggerers**, and two Celery workers, one serving the ``default`` queue and one the ``gpu``
  queue, where GPU trials' tasks go (``[airflow_trials] gpu_queue``). Redis is the broker;
  Airflow's metadata DB is PostgreSQL.
- A Ray cluster of three nodes: a head that only coordinates, a CPU worker and a GPU worker node
  (logical GPUs on a machine without any), each with its own temp dir.
- The trials DB on PostgreSQL.
- Checkpoints in object storage (``s3://``, through fsspec's s3fs); no directory is shared by two
  nodes. Locally an S3-API server (moto's server mode) stands in for S3.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from airflow_trials.ports import free_port

DEFAULT_QUEUE = "default"
GPU_QUEUE = "gpu"
BUCKET = "airflow-trials"
STORAGE_PATH = f"s3://{BUCKET}/checkpoints"
NAMESPACE = "airflow_trials"
GPU_POOL = "gpu"
SLOTS_PER_GPU = 4
# Logical GPUs of the GPU worker node: Ray accepts them without hardware.
GPU_NODE_GPUS = 2
TRIGGERERS = ("airflow-triggerer-1", "airflow-triggerer-2")
WORKERS = {"airflow-worker": DEFAULT_QUEUE, "airflow-gpu-worker": GPU_QUEUE}
RAY_NODES = ("ray-head", "ray-worker", "ray-gpu-worker")

# Airflow settings that mean the same wherever the shape runs: docker-compose.yml must give every
# Airflow service these values (hosts, ports and secrets differ, and are not among them).
PORTABLE_AIRFLOW_SETTINGS: Mapping[str, str] = {
    "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor",
    "AIRFLOW__OPERATORS__DEFAULT_QUEUE": DEFAULT_QUEUE,
    "AIRFLOW__AIRFLOW_TRIALS__GPU_QUEUE": GPU_QUEUE,
    "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
    "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
    # A triggerer that stops heartbeating loses its triggers to the other one after this long.
    "AIRFLOW__TRIGGERER__TRIGGERER_HEALTH_CHECK_THRESHOLD": "15",
    # A task whose Celery worker died (its supervisor stopped heartbeating) is failed and retried
    # after a minute, not Airflow's default five: a trial task's try is short, then it defers.
    "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "60",
    "AIRFLOW_TRIALS_STORAGE": STORAGE_PATH,
}
# Settings every Airflow service has, whose values depend on where the shape runs (Ray nodes have
# the S3 ones and the storage: ray_node_settings).
ADDRESSED_SETTINGS = (
    "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN",
    "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_ASYNC",
    "AIRFLOW__CELERY__BROKER_URL",
    "AIRFLOW__CELERY__RESULT_BACKEND",
    "AIRFLOW__CORE__EXECUTION_API_SERVER_URL",
    "AIRFLOW__API_AUTH__JWT_SECRET",
    "AIRFLOW_CONN_RAY_DEFAULT",
    "AIRFLOW_TRIALS_DB_URL",
    "AWS_ENDPOINT_URL",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_DEFAULT_REGION",
)


@dataclass(frozen=True)
class Addresses:
    """Where the shape's parts listen: every port, URL and secret that differs between a local
    shape and a compose one."""

    metadata_db_url: str
    trials_db_url: str
    broker_url: str
    s3_endpoint_url: str
    ray_address: str
    api_port: int
    jwt_secret: str
    # Extra ports of the local shape, which would otherwise collide with other stacks on the
    # machine: a log server per worker and triggerer, and Ray's ports that default to fixed ones.
    local_ports: Mapping[str, int] = field(default_factory=dict)

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"


@dataclass(frozen=True)
class Process:
    """One process of the shape. ``service`` names its docker-compose service; ``argv`` is its
    command with the program first (``airflow``, ``ray``, ``moto_server``, ``redis-server``)."""

    service: str
    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    kind: str = "airflow"  # "airflow", "ray" or "backing" (Redis, the S3 stand-in)

    @property
    def name(self) -> str:
        return self.service


def airflow_settings(addresses: Addresses) -> dict[str, str]:
    """The settings every Airflow component of the shape has (and the Ray nodes have the S3 and
    trials DB ones): the portable ones, and those that depend on ``addresses``."""
    result_backend = "db+" + addresses.metadata_db_url.replace("+psycopg", "")
    return {
        **PORTABLE_AIRFLOW_SETTINGS,
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": addresses.metadata_db_url,
        # psycopg 3 is async too: without this Airflow would want asyncpg for PostgreSQL.
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_ASYNC": addresses.metadata_db_url,
        "AIRFLOW__CELERY__BROKER_URL": addresses.broker_url,
        "AIRFLOW__CELERY__RESULT_BACKEND": result_backend,
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{addresses.api_url}/execution/",
        "AIRFLOW__API_AUTH__JWT_SECRET": addresses.jwt_secret,
        "AIRFLOW_CONN_RAY_DEFAULT": json.dumps(
            {
                "conn_type": "ray",
                "host": addresses.ray_address,
                "extra": {"namespace": NAMESPACE, "storage_path": STORAGE_PATH},
            }
        ),
        "AIRFLOW_TRIALS_DB_URL": addresses.trials_db_url,
        **s3_settings(addresses),
    }


def s3_settings(addresses: Addresses) -> dict[str, str]:
    """What s3fs (through botocore) needs to reach the S3 endpoint, on every Airflow component and
    Ray node. The stand-in accepts any key."""
    return {
        "AWS_ENDPOINT_URL": addresses.s3_endpoint_url,
        "AWS_ACCESS_KEY_ID": "airflow-trials",
        "AWS_SECRET_ACCESS_KEY": "airflow-trials-secret",
        "AWS_DEFAULT_REGION": "us-east-1",
    }


def ray_node_settings(addresses: Addresses) -> dict[str, str]:
    """Ray nodes' settings: their trial actors write checkpoints to S3 and nothing else."""
    return {"AIRFLOW_TRIALS_STORAGE": STORAGE_PATH, **s3_settings(addresses)}


def processes(addresses: Addresses, *, ray_cpus: int = 4) -> list[Process]:
    """Every process of the shape, in start order: the Ray nodes, then Airflow's components.

    Redis, PostgreSQL and the S3 stand-in are started (or found) before these, by whoever runs
    the shape; the list names only what the shape owns in any deployment.
    """
    return [*_ray_nodes(addresses, ray_cpus), *_airflow_components(addresses)]


def _ray_nodes(addresses: Addresses, ray_cpus: int) -> list[Process]:
    """The head (which coordinates and runs no trial), the CPU node and the GPU node."""
    ports = addresses.local_ports
    ray_env = ray_node_settings(addresses)
    gcs_port = addresses.ray_address.rsplit(":", 1)[1]
    head = Process(
        "ray-head",
        (
            "ray",
            "start",
            "--head",
            "--block",
            f"--port={gcs_port}",
            # No CPUs or GPUs on the head: trials run on the worker nodes, the head coordinates.
            "--num-cpus=0",
            "--num-gpus=0",
            "--node-ip-address=127.0.0.1",
            "--include-dashboard=false",
            "--disable-usage-stats",
            *_ray_ports(ports, "ray-head"),
        ),
        ray_env,
        kind="ray",
    )
    workers = [
        Process(
            name,
            (
                "ray",
                "start",
                "--block",
                f"--address={addresses.ray_address}",
                f"--num-cpus={ray_cpus}",
                f"--num-gpus={gpus}",
                "--node-ip-address=127.0.0.1",
                "--disable-usage-stats",
                *_ray_ports(ports, name),
            ),
            ray_env,
            kind="ray",
        )
        for name, gpus in (("ray-worker", 0), ("ray-gpu-worker", GPU_NODE_GPUS))
    ]
    return [head, *workers]


def _airflow_components(addresses: Addresses) -> list[Process]:
    """The api-server, scheduler, dag-processor, the two triggerers and the two Celery workers."""
    ports = addresses.local_ports
    return [
        Process("airflow-api-server", ("airflow", "api-server", "--port", str(addresses.api_port))),
        Process("airflow-scheduler", ("airflow", "scheduler")),
        Process("airflow-dag-processor", ("airflow", "dag-processor")),
        *(
            Process(
                name,
                ("airflow", "triggerer"),
                _log_server_env(ports, name, "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT"),
            )
            for name in TRIGGERERS
        ),
        *(
            Process(
                name,
                (
                    "airflow",
                    "celery",
                    "worker",
                    "--queues",
                    queue,
                    "--celery-hostname",
                    f"{name}@%h",
                    "--concurrency",
                    "8",
                ),
                _log_server_env(ports, name, "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT"),
            )
            for name, queue in WORKERS.items()
        ),
    ]


def _ray_ports(ports: Mapping[str, int], node: str) -> list[str]:
    """Ports that Ray defaults to fixed numbers, which two nodes on one machine (or another
    cluster) would share: given only where the local shape picked them."""
    return [
        f"--{key.split(':', 1)[1]}={ports[key]}" for key in ray_port_names(node) if key in ports
    ]


def _log_server_env(ports: Mapping[str, int], name: str, setting: str) -> dict[str, str]:
    port = ports.get(f"{name}:log-server")
    return {setting: str(port)} if port is not None else {}


def ray_port_names(node: str) -> list[str]:
    """The keys of :attr:`Addresses.local_ports` a local Ray node takes its ports from."""
    names = ["node-manager-port", "object-manager-port", "dashboard-agent-listen-port"]
    names += ["metrics-export-port", "runtime-env-agent-port", "dashboard-agent-grpc-port"]
    if node == "ray-head":
        names.append("ray-client-server-port")
    return [f"{node}:{name}" for name in names]


def new_addresses(metadata_db_url: str, trials_db_url: str) -> Addresses:
    """A new shape's addresses: a free port for every listener, a new JWT secret."""
    ports: dict[str, int] = {"redis": free_port(), "s3": free_port()}
    for node in RAY_NODES:
        ports.update({key: free_port() for key in ray_port_names(node)})
    for name in (*TRIGGERERS, *WORKERS):
        ports[f"{name}:log-server"] = free_port()
    return Addresses(
        metadata_db_url=metadata_db_url,
        trials_db_url=trials_db_url,
        broker_url=f"redis://127.0.0.1:{ports['redis']}/0",
        s3_endpoint_url=f"http://127.0.0.1:{ports['s3']}",
        ray_address=f"127.0.0.1:{free_port()}",
        api_port=free_port(),
        jwt_secret="shape-" + os.urandom(24).hex(),
        local_ports=ports,
    )


def backing_processes(addresses: Addresses, home: Path) -> list[Process]:
    """Redis (the Celery broker, keeping nothing on disk) and the S3 stand-in (moto's server)."""
    ports = addresses.local_ports
    redis = (
        "redis-server",
        "--port",
        str(ports["redis"]),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
        "--dir",
        str(home),
    )
    s3 = ("moto_server", "-H", "127.0.0.1", "-p", str(ports["s3"]))
    return [Process("redis", redis, kind="backing"), Process("s3", s3, kind="backing")]
