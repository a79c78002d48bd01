"""docker-compose.yml is consistent: dependencies, healthchecks, images, connections, GPU, volumes.

Each check is a function that lists the problems it finds in a parsed compose file. The real file
must have none, and each check is also run on a copy with one defect put in, where it must name it.
"""

from __future__ import annotations

import copy
import fnmatch
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tomllib
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import pytest

from airflow_trials.shape import spec
from tests.deploy.compose import (
    AIRFLOW_COMPONENTS,
    COMPOSE_FILE,
    REPO,
    REQUIRED_SECRETS,
    TEST_ENV,
    MissingVariable,
    airflow_services,
    command_args,
    compose,
    connection,
    environment,
    option,
    raw_compose,
    ray_services,
    volume_mounts,
)

Compose = dict[str, Any]
CONDITIONS = {"service_started", "service_healthy", "service_completed_successfully"}
INIT_SCRIPT = "airflow-init.sh"
POSTGRES_INITDB = "/docker-entrypoint-initdb.d"


# -- reading the pins and the Dockerfile -----------------------------------------------------------
def pins() -> dict[str, str]:
    """apache-airflow and ray from constraints.txt; Python from pyproject's declared version."""
    found = {}
    with open(os.path.join(REPO, "constraints.txt")) as f:
        for line in f:
            name, _, version = line.strip().partition("==")
            if name in ("apache-airflow", "ray"):
                found[name] = version
    with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
        found["python"] = tomllib.load(f)["tool"]["mypy"]["python_version"]
    return found


def is_init_job(service: dict[str, Any]) -> bool:
    return any(arg.endswith(INIT_SCRIPT) for arg in command_args(service))


def parse_dockerfile(path: str, build_args: dict[str, str]) -> dict[str, dict[str, Any]]:
    """Stage name -> its base image (ARGs resolved) and the sources of its COPY instructions."""
    args: dict[str, str] = {}
    stages: dict[str, dict[str, Any]] = {}
    current: dict[str, Any] | None = None
    with open(path) as f:
        lines = [line.strip() for line in f if line.strip() and not line.lstrip().startswith("#")]
    for line in lines:
        keyword, _, rest = line.partition(" ")
        keyword = keyword.upper()
        if keyword == "ARG" and current is None:
            name, _, default = rest.partition("=")
            args[name] = build_args.get(name, default)
        elif keyword == "FROM":
            words = rest.split()
            image = re.sub(r"\$\{?(\w+)\}?", lambda m: args.get(m.group(1), ""), words[0])
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else str(len(stages))
            current = stages[name] = {"from": image, "copies": []}
        elif keyword in ("COPY", "ADD") and current is not None:
            words = rest.split()
            if any(w.startswith("--from=") for w in words):
                continue
            current["copies"].extend(w for w in words[:-1] if not w.startswith("--"))
    return stages


def dockerignore_allows(ignore_file: str, path: str) -> bool:
    """Whether a context path reaches the build, by .dockerignore rules (last match wins)."""
    if not os.path.exists(ignore_file):
        return True
    with open(ignore_file) as f:
        patterns = [p.strip() for p in f if p.strip() and not p.startswith("#")]
    parts = path.strip("/").split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    allowed = True
    for pattern in patterns:
        negated = pattern.startswith("!")
        pattern = pattern.lstrip("!").strip("/")
        if any(fnmatch.fnmatch(p, pattern) for p in prefixes):
            allowed = negated
    return allowed


def base_images(c: Compose) -> dict[str, str]:
    """Service -> the base image its build starts FROM (or its image when it builds nothing)."""
    images = {}
    for name, service in c["services"].items():
        build = service.get("build")
        if build is None:
            images[name] = service["image"]
            continue
        dockerfile = os.path.join(REPO, build["context"], build.get("dockerfile", "Dockerfile"))
        stages = parse_dockerfile(
            dockerfile, {k: str(v) for k, v in (build.get("args") or {}).items()}
        )
        images[name] = (
            stages[build["target"]]["from"]
            if "target" in build
            else list(stages.values())[-1]["from"]
        )
    return images


# -- the checks ------------------------------------------------------------------------------------
def dependency_problems(c: Compose) -> list[str]:
    problems = []
    services = c["services"]
    for name, service in services.items():
        depends_on = service.get("depends_on") or {}
        if isinstance(depends_on, list):
            problems.append(f"{name}: depends_on is a list; give each dependency a condition")
            continue
        for target, dependency in depends_on.items():
            condition = (dependency or {}).get("condition")
            if target not in services:
                problems.append(f"{name} depends on {target}, which is no service")
            elif condition not in CONDITIONS:
                problems.append(f"{name} depends on {target} with condition {condition!r}")
            elif condition == "service_healthy" and "healthcheck" not in services[target]:
                problems.append(
                    f"{name} waits for {target} to be healthy, but {target} has no healthcheck"
                )
            elif condition == "service_completed_successfully" and not is_init_job(
                services[target]
            ):
                problems.append(
                    f"{name} waits for {target} to complete, but {target} is not the init job"
                )
    for name in AIRFLOW_COMPONENTS:
        depends_on = services.get(name, {}).get("depends_on") or {}
        if not any(
            is_init_job(services.get(t, {}))
            and (s or {}).get("condition") == "service_completed_successfully"
            for t, s in depends_on.items()
        ):
            problems.append(f"{name} does not wait for the init job to complete successfully")
    return problems


def healthcheck_problems(c: Compose) -> list[str]:
    problems = []
    for name, service in c["services"].items():
        if is_init_job(service):
            if service.get("restart") in ("always", "unless-stopped"):
                problems.append(
                    f"{name} is the one-shot init job but restarts ({service['restart']})"
                )
            continue
        check = service.get("healthcheck") or {}
        if not check.get("test") or check.get("disable"):
            problems.append(f"{name} runs for good but has no healthcheck")
    return problems


def declaration_problems(c: Compose) -> list[str]:
    problems = []
    volumes = set(c.get("volumes") or {})
    networks = set(c.get("networks") or {}) | {"default"}
    for name, service in c["services"].items():
        for source in volume_mounts(service):
            if source.startswith((".", "/", "~")):
                if not os.path.exists(os.path.join(REPO, source)):
                    problems.append(f"{name} mounts {source}, which does not exist")
            elif source not in volumes:
                problems.append(f"{name} mounts volume {source}, which is not declared")
        for network in service.get("networks") or []:
            if network not in networks:
                problems.append(f"{name} uses network {network}, which is not declared")
    return problems


def build_problems(c: Compose) -> list[str]:
    problems = []
    for name, service in c["services"].items():
        build = service.get("build")
        if build is None:
            continue
        context = os.path.join(REPO, build["context"])
        dockerfile = os.path.join(context, build.get("dockerfile", "Dockerfile"))
        if not os.path.isfile(dockerfile):
            problems.append(f"{name} builds from {dockerfile}, which does not exist")
            continue
        stages = parse_dockerfile(
            dockerfile, {k: str(v) for k, v in (build.get("args") or {}).items()}
        )
        if "target" in build and build["target"] not in stages:
            problems.append(
                f"{name} builds stage {build['target']}, which {dockerfile} does not have"
            )
            continue
        stage = stages[build["target"]] if "target" in build else list(stages.values())[-1]
        for source in stage["copies"]:
            if not os.path.exists(os.path.join(context, source)):
                problems.append(f"{name}: COPY {source}, which is not in the build context")
            elif not dockerignore_allows(f"{dockerfile}.dockerignore", source):
                problems.append(
                    f"{name}: COPY {source}, which {dockerfile}.dockerignore leaves out"
                )
    return problems


def version_problems(c: Compose) -> list[str]:
    want = pins()
    airflow_tag = f"apache/airflow:{want['apache-airflow']}-python{want['python']}"
    ray_tag = f"rayproject/ray:{want['ray']}-py{want['python'].replace('.', '')}"
    problems = []
    for name, image in base_images(c).items():
        service = c["services"][name]
        if name in airflow_services(c) and image != airflow_tag:
            problems.append(f"{name} is built from {image}, not {airflow_tag} (constraints.txt)")
        if name in ray_services(c):
            expected = ray_tag + ("-gpu" if "deploy" in service else "")
            if image != expected:
                problems.append(f"{name} is built from {image}, not {expected} (constraints.txt)")
            if not service.get("image", "").endswith(expected.split(":", 1)[1]):
                problems.append(
                    f"{name} tags its image {service.get('image')}, not with {expected}"
                )
    return problems


def connection_problems(c: Compose) -> list[str]:
    services = c["services"]
    problems = []
    airflow = airflow_services(c)
    if not airflow:
        return ["no service has AIRFLOW_CONN_RAY_DEFAULT"]
    for name, service in airflow.items():
        ray_conn = connection(service, "ray_default")
        address = urlsplit(ray_conn.get("host") or "")
        head = services.get(address.hostname or "")
        if ray_conn.get("conn_type") != "ray" or address.scheme != "ray":
            problems.append(
                f"{name}: ray_default is not a ray connection to a ray:// address: {ray_conn}"
            )
        elif head is None:
            problems.append(
                f"{name}: ray_default points at {address.hostname}, which is no service"
            )
        elif "--head" not in command_args(head) or option(
            command_args(head), "--ray-client-server-port"
        ) != str(address.port):
            problems.append(
                f"{name}: ray_default points at {address.hostname}:{address.port}, "
                "which runs no Ray head with that Ray Client port"
            )
        trials = connection(service, "trials_default")
        db_service = services.get(trials.get("host") or "", {})
        db_env = environment(db_service)
        if trials.get("conn_type") != "trials_db" or not str(
            db_service.get("image", "")
        ).startswith("postgres:"):
            problems.append(
                f"{name}: trials_default is not a trials_db connection to the postgres service"
            )
            continue
        if (
            trials.get("schema") != db_env.get("TRIALS_DB_NAME")
            or trials.get("login") != db_env.get("TRIALS_DB_USER")
            or trials.get("password") != db_env.get("TRIALS_DB_PASSWORD")
        ):
            problems.append(
                f"{name}: trials_default ({trials.get('login')}@{trials.get('schema')}) is not the "
                f"database and owner that {trials['host']}'s init script creates"
            )
        initdb = [s for s, t in volume_mounts(db_service).items() if t.startswith(POSTGRES_INITDB)]
        if not initdb:
            problems.append(
                f"{trials['host']} mounts no script in {POSTGRES_INITDB} to create the trials DB"
            )
        airflow_db = urlsplit(environment(service).get("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", ""))
        if airflow_db.hostname != trials["host"] or airflow_db.path.lstrip("/") != db_env.get(
            "POSTGRES_DB"
        ):
            problems.append(f"{name}: Airflow's DB is not the postgres service's POSTGRES_DB")
        elif airflow_db.path.lstrip("/") == trials.get("schema"):
            problems.append(f"{name}: Airflow's DB and the trials DB are the same database")
    return problems


def gpu_problems(c: Compose) -> list[str]:
    problems = []
    reserved = 0
    for name, service in ray_services(c).items():
        devices = (
            ((service.get("deploy") or {}).get("resources") or {}).get("reservations") or {}
        ).get("devices") or []
        for device in devices:
            if device.get("driver") != "nvidia" or "gpu" not in (device.get("capabilities") or []):
                problems.append(f"{name} reserves a device that is not an nvidia gpu: {device}")
            elif option(command_args(service), "--num-gpus") != str(device.get("count")):
                problems.append(
                    f"{name} reserves {device.get('count')} GPUs but gives Ray "
                    f"--num-gpus={option(command_args(service), '--num-gpus')}"
                )
            else:
                reserved += int(device["count"])
    if not reserved:
        problems.append("no Ray worker reserves an NVIDIA GPU")
    pool_gpus = [
        environment(s).get("TRIALS_GPU_POOL_GPUS") for s in c["services"].values() if is_init_job(s)
    ]
    if pool_gpus != [str(reserved)]:
        problems.append(
            f"the GPU pool stands for {pool_gpus} GPUs, but the Ray workers reserve {reserved}"
        )
    return problems


def command_problems(c: Compose) -> list[str]:
    services = c["services"]
    problems = []
    for name, command in AIRFLOW_COMPONENTS.items():
        if command_args(services.get(name, {})) != [command]:
            problems.append(
                f"{name} should run `airflow {command}`, runs "
                f"{services.get(name, {}).get('command')}"
            )
    api_server = next((n for n, cmd in AIRFLOW_COMPONENTS.items() if cmd == "api-server"), "")
    for name, service in airflow_services(c).items():
        url = urlsplit(environment(service).get("AIRFLOW__CORE__EXECUTION_API_SERVER_URL", ""))
        if url.hostname != api_server or url.path != "/execution/":
            problems.append(
                f"{name}: the execution API URL is not http://{api_server}:<port>/execution/"
            )
    for key in (
        "AIRFLOW__API_AUTH__JWT_SECRET",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN",
        "AIRFLOW__CORE__EXECUTOR",
    ):
        values = {environment(s).get(key) for s in airflow_services(c).values()}
        if len(values) != 1 or None in values:
            problems.append(f"the Airflow services do not share one {key}: {values}")
    head = [args for args in map(command_args, ray_services(c).values()) if "--head" in args]
    if len(head) != 1:
        problems.append(f"there should be one Ray head, there are {len(head)}")
    return problems


def storage_problems(c: Compose) -> list[str]:
    """Checkpoints in object storage, the same URL everywhere, and no volume that two Ray nodes
    (or a Ray node and Airflow) share: nothing depends on a shared disk."""
    problems = []
    s3 = [
        n for n, svc in c["services"].items() if str(svc.get("image", "")).startswith("motoserver/")
    ]
    for name, service in {**ray_services(c), **airflow_services(c)}.items():
        env = environment(service)
        if env.get("AIRFLOW_TRIALS_STORAGE") != spec.STORAGE_PATH:
            problems.append(
                f"{name}: AIRFLOW_TRIALS_STORAGE={env.get('AIRFLOW_TRIALS_STORAGE')} is not "
                f"{spec.STORAGE_PATH}"
            )
        endpoint = urlsplit(env.get("AWS_ENDPOINT_URL", ""))
        if endpoint.hostname not in s3:
            problems.append(f"{name}: AWS_ENDPOINT_URL={endpoint.geturl()} is not the S3 service")
    for name, service in airflow_services(c).items():
        storage_path = connection(service, "ray_default").get("extra", {}).get("storage_path")
        if storage_path != spec.STORAGE_PATH:
            problems.append(
                f"{name}: ray_default's storage_path {storage_path} is not {spec.STORAGE_PATH}"
            )
    mounted: dict[str, list[str]] = {}
    for name, service in ray_services(c).items():
        for source in volume_mounts(service):
            mounted.setdefault(source, []).append(name)
    for name, service in airflow_services(c).items():
        for source in volume_mounts(service):
            if source in mounted:
                mounted[source].append(name)
    for source, names in sorted(mounted.items()):
        if len(names) > 1:
            problems.append(f"volume {source} is shared by {', '.join(names)}")
    return problems


def _placeholder_addresses() -> spec.Addresses:
    return spec.Addresses(
        metadata_db_url="postgresql+psycopg://airflow@postgres:5432/airflow",
        trials_db_url="postgresql+psycopg://trials@postgres:5432/trials",
        broker_url="redis://redis:6379/0",
        s3_endpoint_url="http://s3:5000",
        ray_address="ray-head:6379",
        api_port=8080,
        jwt_secret="secret",
    )


def shape_problems(c: Compose) -> list[str]:
    """The file runs the shape that src/airflow_trials/shape/spec.py describes and `airflow-trials
    shape up` starts: the same services, commands and portable settings."""
    services = c["services"]
    problems = []
    for name in ("postgres", "redis", "s3"):
        if name not in services:
            problems.append(f"no service {name}")
    for process in spec.processes(_placeholder_addresses()):
        service = services.get(process.service)
        if service is None:
            problems.append(f"no service {process.service} (the shape runs it)")
            continue
        args = command_args(service)
        if process.kind == "airflow":
            want = list(process.argv[1:2])
            if process.argv[1] == "celery":
                want = ["celery", "worker", "--queues", option(list(process.argv), "--queues")]
            if args != want:
                problems.append(
                    f"{process.service} should run `airflow {' '.join(want)}`, runs {args}"
                )
            env = environment(service)
            for key, value in spec.PORTABLE_AIRFLOW_SETTINGS.items():
                if env.get(key) != value:
                    problems.append(
                        f"{process.service}: {key}={env.get(key)}, the shape has {value}"
                    )
            for key in spec.ADDRESSED_SETTINGS:
                if key not in env:
                    problems.append(f"{process.service} has no {key}")
        else:
            for flag in ("--num-cpus", "--num-gpus"):
                mine, theirs = option(list(process.argv), flag), option(args, flag)
                if (mine == "0") != (theirs == "0"):
                    problems.append(f"{process.service}: {flag}={theirs}, the shape has {mine}")
            if ("--head" in args) != ("--head" in process.argv):
                problems.append(f"{process.service}: --head differs from the shape")
            env = environment(service)
            for key in spec.ray_node_settings(_placeholder_addresses()):
                if key not in env:
                    problems.append(f"{process.service} has no {key}")
    broker = urlsplit(
        environment(services.get("airflow-scheduler", {})).get("AIRFLOW__CELERY__BROKER_URL", "")
    )
    if broker.hostname not in services or "redis" not in str(
        services[broker.hostname].get("image")
    ):
        problems.append(f"the Celery broker {broker.geturl()} is not the redis service")
    return problems


LOOPBACK = "127.0.0.1"


def port_problems(c: Compose) -> list[str]:
    """Every published port is bound to the loopback interface unless the user says otherwise
    (AIRFLOW_TRIALS_BIND): the stack's defaults are for one machine."""
    problems = []
    for name, service in c["services"].items():
        for port in service.get("ports") or []:
            if isinstance(port, dict):
                host_ip = port.get("host_ip")
            else:
                parts = str(port).rsplit(":", 2)
                host_ip = parts[0] if len(parts) == 3 else None
            if host_ip != LOOPBACK:
                problems.append(
                    f"{name} publishes {port} on {host_ip or 'every interface'}, not {LOOPBACK}"
                )
    return problems


CHECKS: list[Callable[[Compose], list[str]]] = [
    dependency_problems,
    healthcheck_problems,
    declaration_problems,
    build_problems,
    version_problems,
    connection_problems,
    gpu_problems,
    command_problems,
    storage_problems,
    shape_problems,
    port_problems,
]


@pytest.mark.parametrize("check", CHECKS, ids=lambda check: check.__name__)
def test_the_compose_file_has_no_problems(check):
    assert check(compose()) == []


# -- each check finds the defect it is for
# -----------------------------------------------------------
def _set_env(service: str, key: str, value: str) -> Callable[[Compose], None]:
    def mutate(c: Compose) -> None:
        c["services"][service]["environment"][key] = value

    return mutate


def _edit_conn(service: str, conn_id: str, **changes: Any) -> Callable[[Compose], None]:
    def mutate(c: Compose) -> None:
        env = c["services"][service]["environment"]
        key = f"AIRFLOW_CONN_{conn_id.upper()}"
        conn = json.loads(env[key])
        for field, value in changes.items():
            if field == "storage_path":
                conn["extra"]["storage_path"] = value
            else:
                conn[field] = value
        env[key] = json.dumps(conn)

    return mutate


def _remove_gpu_reservation(c: Compose) -> None:
    for service in c["services"].values():
        service.pop("deploy", None)


def _share_a_checkpoint_volume(c: Compose) -> None:
    c["volumes"]["trial-checkpoints"] = None
    for name in ("ray-worker", "ray-gpu-worker"):
        c["services"][name].setdefault("volumes", []).append("trial-checkpoints:/shared/trials")


DEFECTS = [
    (
        "unknown dependency",
        dependency_problems,
        lambda c: c["services"]["airflow-triggerer-1"]["depends_on"].update(
            {"rabbitmq": {"condition": "service_healthy"}}
        ),
        "airflow-triggerer-1 depends on rabbitmq, which is no service",
    ),
    (
        "healthy without healthcheck",
        dependency_problems,
        lambda c: c["services"]["postgres"].pop("healthcheck"),
        "waits for postgres to be healthy, but postgres has no healthcheck",
    ),
    (
        "completed on a server",
        dependency_problems,
        lambda c: c["services"]["airflow-triggerer-1"]["depends_on"].update(
            {"postgres": {"condition": "service_completed_successfully"}}
        ),
        "waits for postgres to complete, but postgres is not the init job",
    ),
    (
        "no init wait",
        dependency_problems,
        lambda c: c["services"]["airflow-scheduler"]["depends_on"].pop("airflow-init"),
        "airflow-scheduler does not wait for the init job",
    ),
    (
        "no healthcheck",
        healthcheck_problems,
        lambda c: c["services"]["ray-gpu-worker"].pop("healthcheck"),
        "ray-gpu-worker runs for good but has no healthcheck",
    ),
    (
        "undeclared volume",
        declaration_problems,
        lambda c: c["volumes"].pop("airflow-logs"),
        "mounts volume airflow-logs, which is not declared",
    ),
    (
        "undeclared network",
        declaration_problems,
        lambda c: c["services"]["ray-head"].update({"networks": ["ray"]}),
        "ray-head uses network ray, which is not declared",
    ),
    (
        "missing bind source",
        declaration_problems,
        lambda c: c["services"]["postgres"]["volumes"].append(
            "./deploy/postgres/nope.sql:/docker-entrypoint-initdb.d/x.sql"
        ),
        "mounts ./deploy/postgres/nope.sql, which does not exist",
    ),
    (
        "missing Dockerfile",
        build_problems,
        lambda c: c["services"]["ray-head"]["build"].update(
            {"dockerfile": "deploy/Dockerfile.ray"}
        ),
        "ray-head builds from",
    ),
    (
        "missing stage",
        build_problems,
        lambda c: c["services"]["ray-head"]["build"].update({"target": "raylet"}),
        "ray-head builds stage raylet",
    ),
    (
        "Airflow version",
        version_problems,
        lambda c: c["services"]["airflow-triggerer-1"]["build"].update(
            {"args": {"AIRFLOW_IMAGE": "apache/airflow:3.3.1-python3.11"}}
        ),
        "airflow-triggerer-1 is built from apache/airflow:3.3.1-python3.11",
    ),
    (
        "Ray GPU image",
        version_problems,
        lambda c: c["services"]["ray-gpu-worker"]["build"].update({"args": {}}),
        "ray-gpu-worker is built from rayproject/ray:",
    ),
    (
        "Ray Python",
        version_problems,
        lambda c: c["services"]["ray-worker"]["build"].update(
            {"args": {"RAY_IMAGE": "rayproject/ray:2.60.0-py312"}}
        ),
        "ray-worker is built from rayproject/ray:2.60.0-py312",
    ),
    (
        "ray host",
        connection_problems,
        _edit_conn("airflow-triggerer-1", "ray_default", host="ray://ray-hed:10001"),
        "airflow-triggerer-1: ray_default points at ray-hed, which is no service",
    ),
    (
        "ray client port",
        connection_problems,
        _edit_conn("airflow-scheduler", "ray_default", host="ray://ray-head:6379"),
        "ray_default points at ray-head:6379, which runs no Ray head with that Ray Client port",
    ),
    (
        "trials database",
        connection_problems,
        _edit_conn("airflow-scheduler", "trials_default", schema="airflow"),
        "is not the database and owner",
    ),
    (
        "trials host",
        connection_problems,
        _edit_conn("airflow-triggerer-1", "trials_default", host="ray-head"),
        "airflow-triggerer-1: trials_default is not a trials_db connection to the postgres service",
    ),
    (
        "shared database",
        connection_problems,
        _set_env(
            "airflow-triggerer-1",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN",
            "postgresql+psycopg://airflow:airflow@postgres:5432/trials",
        ),
        "Airflow's DB is not the postgres service's POSTGRES_DB",
    ),
    ("no GPU", gpu_problems, _remove_gpu_reservation, "no Ray worker reserves an NVIDIA GPU"),
    (
        "AMD",
        gpu_problems,
        lambda c: c["services"]["ray-gpu-worker"]["deploy"]["resources"]["reservations"]["devices"][
            0
        ].update({"driver": "amd"}),
        "is not an nvidia gpu",
    ),
    (
        "pool size",
        gpu_problems,
        _set_env("airflow-init", "TRIALS_GPU_POOL_GPUS", "4"),
        "the GPU pool stands for ['4'] GPUs, but the Ray workers reserve 1",
    ),
    (
        "wrong command",
        command_problems,
        lambda c: c["services"]["airflow-triggerer-1"].update({"command": "scheduler"}),
        "airflow-triggerer-1 should run `airflow triggerer`",
    ),
    (
        "execution API",
        command_problems,
        _set_env(
            "airflow-scheduler",
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL",
            "http://localhost:8080/execution/",
        ),
        "airflow-scheduler: the execution API URL is not http://airflow-api-server",
    ),
    (
        "JWT secret",
        command_problems,
        _set_env("airflow-triggerer-1", "AIRFLOW__API_AUTH__JWT_SECRET", "other"),
        "do not share one AIRFLOW__API_AUTH__JWT_SECRET",
    ),
    (
        "shared checkpoint volume",
        storage_problems,
        _share_a_checkpoint_volume,
        "volume trial-checkpoints is shared by ray-worker, ray-gpu-worker",
    ),
    (
        "storage_path",
        storage_problems,
        _edit_conn("airflow-triggerer-1", "ray_default", storage_path="s3://b/t"),
        "ray_default's storage_path s3://b/t is not s3://airflow-trials/checkpoints",
    ),
    (
        "local storage on a node",
        storage_problems,
        _set_env("ray-worker", "AIRFLOW_TRIALS_STORAGE", "/shared/trials"),
        "ray-worker: AIRFLOW_TRIALS_STORAGE=/shared/trials is not",
    ),
    (
        "S3 endpoint",
        storage_problems,
        _set_env("ray-gpu-worker", "AWS_ENDPOINT_URL", "http://minio:9000"),
        "ray-gpu-worker: AWS_ENDPOINT_URL=http://minio:9000 is not the S3 service",
    ),
    (
        "one triggerer",
        shape_problems,
        lambda c: c["services"].pop("airflow-triggerer-2"),
        "no service airflow-triggerer-2 (the shape runs it)",
    ),
    (
        "gpu queue",
        shape_problems,
        lambda c: c["services"]["airflow-gpu-worker"].update(
            {"command": ["celery", "worker", "--queues", "default"]}
        ),
        "airflow-gpu-worker should run `airflow celery worker --queues gpu`",
    ),
    (
        "executor",
        shape_problems,
        _set_env("airflow-worker", "AIRFLOW__CORE__EXECUTOR", "LocalExecutor"),
        "airflow-worker: AIRFLOW__CORE__EXECUTOR=LocalExecutor, the shape has CeleryExecutor",
    ),
    (
        "GPU node without GPUs",
        shape_problems,
        lambda c: c["services"]["ray-gpu-worker"].update(
            {"command": ["ray", "start", "--address=ray-head:6379", "--num-gpus=0", "--block"]}
        ),
        "ray-gpu-worker: --num-gpus=0, the shape has 2",
    ),
    (
        "api-server on every interface",
        port_problems,
        lambda c: c["services"]["airflow-api-server"].update({"ports": ["8080:8080"]}),
        "airflow-api-server publishes 8080:8080 on every interface, not 127.0.0.1",
    ),
    (
        "dashboard on a public address",
        port_problems,
        lambda c: c["services"]["ray-head"].update(
            {"ports": [{"target": 8265, "published": 8265, "host_ip": "0.0.0.0"}]}
        ),
        "ray-head publishes",
    ),
]


@pytest.mark.parametrize(
    ("check", "mutate", "problem"), [d[1:] for d in DEFECTS], ids=[d[0] for d in DEFECTS]
)
def test_each_check_names_the_defect_it_is_for(check, mutate, problem):
    broken = copy.deepcopy(compose())
    mutate(broken)
    problems = check(broken)
    assert any(problem in p for p in problems), problems


# -- the secrets: none shipped, Compose refuses to start without them ------------------------------
SECRET_SETTINGS = {
    "AIRFLOW__API_AUTH__JWT_SECRET": "AIRFLOW_JWT_SECRET",
    "AIRFLOW__API__SECRET_KEY": "AIRFLOW_API_SECRET_KEY",
    "AIRFLOW__CORE__FERNET_KEY": "AIRFLOW_FERNET_KEY",
}


def secret_problems(raw: Compose) -> list[str]:
    """Each Airflow secret comes from a required variable (``${NAME:?how to make one}``), never
    from a default that every copy of this file shares. Reads the file before interpolation."""
    problems = []
    for name, service in airflow_services(raw).items():
        env = environment(service)
        for key, variable in SECRET_SETTINGS.items():
            value = env.get(key)
            if value is None:
                problems.append(f"{name} has no {key}")
            elif not re.fullmatch(rf"\$\{{{variable}:\?[^}}]+\}}", value):
                problems.append(
                    f"{name}: {key}={value} does not require {variable} "
                    f"(${{{variable}:?...}}), so Compose starts without it"
                )
    return problems


def test_the_secrets_have_no_default():
    assert sorted(SECRET_SETTINGS.values()) == sorted(REQUIRED_SECRETS)
    assert secret_problems(raw_compose()) == []


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("${AIRFLOW_JWT_SECRET:-airflow-trials-compose-jwt-secret}", "does not require"),
        ("${AIRFLOW_JWT_SECRET:-}", "does not require AIRFLOW_JWT_SECRET"),
        ("${AIRFLOW_JWT_SECRET}", "so Compose starts without it"),
        ("a-literal-secret", "AIRFLOW__API_AUTH__JWT_SECRET=a-literal-secret"),
    ],
)
def test_the_secret_check_names_a_default(value, problem):
    broken = copy.deepcopy(raw_compose())
    broken["services"]["airflow-scheduler"]["environment"]["AIRFLOW__API_AUTH__JWT_SECRET"] = value
    assert any(problem in p for p in secret_problems(broken)), secret_problems(broken)


@pytest.mark.parametrize("variable", REQUIRED_SECRETS)
@pytest.mark.parametrize("unset", ["missing", "empty"])
def test_compose_refuses_to_start_without_a_secret_and_says_how_to_make_one(variable, unset):
    env = {k: v for k, v in TEST_ENV.items() if k != variable}
    if unset == "empty":
        env[variable] = ""
    with pytest.raises(MissingVariable, match=f"required variable {variable} ") as refused:
        compose(env)
    message = str(refused.value)
    assert ".env" in message and "docs/deploy.md" in message
    # The message's command makes a value that works: run it.
    (command,) = re.findall(r"python3 -c '([^']+)'", message)
    made = subprocess.run(
        [sys.executable, "-c", command], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert len(made) >= 32
    if variable == "AIRFLOW_FERNET_KEY":
        from cryptography.fernet import Fernet

        assert Fernet(made).decrypt(Fernet(made).encrypt(b"x")) == b"x"


def test_the_published_ports_follow_airflow_trials_bind():
    """Opening the UI does not open Ray's dashboard, which has no login and runs jobs."""
    c = compose({**TEST_ENV, "AIRFLOW_TRIALS_BIND": "0.0.0.0"})
    assert c["services"]["airflow-api-server"]["ports"] == ["0.0.0.0:8080:8080"]
    assert c["services"]["ray-head"]["ports"] == ["127.0.0.1:8265:8265"]
    c = compose({**TEST_ENV, "RAY_DASHBOARD_BIND": "10.0.0.5"})
    assert c["services"]["ray-head"]["ports"] == ["10.0.0.5:8265:8265"]
    assert port_problems(compose()) == []


# -- against the real hooks and files --------------------------------------------------------------
def test_the_hooks_read_the_compose_connections_as_the_stack_needs(monkeypatch):
    from airflow_trials.hooks.trials import RayHook, TrialsDbHook

    env = environment(compose()["services"]["airflow-triggerer-1"])
    for key in ("AIRFLOW_CONN_RAY_DEFAULT", "AIRFLOW_CONN_TRIALS_DEFAULT"):
        monkeypatch.setenv(key, env[key])
    settings = RayHook().settings()
    assert settings["address"] == "ray://ray-head:10001"
    assert settings["storage_path"] == env["AIRFLOW_TRIALS_STORAGE"] == spec.STORAGE_PATH
    # The URL the init job migrates (from the connection) is the one the airflow-trials CLI reads.
    assert (
        TrialsDbHook().get_url()
        == env["AIRFLOW_TRIALS_DB_URL"]
        == "postgresql+psycopg://trials:trials@postgres:5432/trials"
    )


def test_the_scripts_are_executable_and_the_init_job_runs_the_copied_script():
    for script in ("deploy/airflow-init.sh", "deploy/postgres/create-trials-db.sh"):
        assert os.stat(os.path.join(REPO, script)).st_mode & stat.S_IXUSR, (
            f"{script} is not executable"
        )
    init = compose()["services"]["airflow-init"]
    stage = parse_dockerfile(os.path.join(REPO, "deploy", "Dockerfile"), {})["airflow"]
    with open(os.path.join(REPO, "deploy", "Dockerfile")) as f:
        copied_to = re.search(rf"COPY .*deploy/{INIT_SCRIPT} (\S+)", f.read()).group(1)
    assert f"deploy/{INIT_SCRIPT}" in stage["copies"] and command_args(init) == [copied_to]
    with open(os.path.join(REPO, "deploy", INIT_SCRIPT)) as f:
        script = f.read()
    for step in ("airflow db migrate", "airflow-trials db upgrade", "airflow-trials pool set"):
        assert step in script


def test_postgres_creates_the_trials_database_from_its_environment():
    db = compose()["services"]["postgres"]
    (script,) = [s for s, t in volume_mounts(db).items() if t.startswith(POSTGRES_INITDB)]
    with open(os.path.join(REPO, script)) as f:
        text = f.read()
    assert '-v trials_db="$TRIALS_DB_NAME"' in text and 'CREATE DATABASE :"trials_db"' in text
    assert environment(db)["TRIALS_DB_NAME"] == "trials" != environment(db)["POSTGRES_DB"]


@pytest.mark.postgres
def test_the_postgres_init_script_creates_a_database_its_owner_can_migrate(tmp_path):
    """Runs deploy/postgres/create-trials-db.sh against a real PostgreSQL, then migrates as the
    owner."""
    from sqlalchemy.engine import make_url

    server = os.environ.get("AIRFLOW_TRIALS_TEST_POSTGRES_URL")
    if not server:
        pytest.skip("AIRFLOW_TRIALS_TEST_POSTGRES_URL is unset")
    if not shutil.which("psql"):
        pytest.skip("psql is not installed")
    admin = make_url(server)
    name = f"trials_deploy_{os.getpid()}"
    env = {
        **os.environ,
        "PGHOST": admin.host or "127.0.0.1",
        "PGPORT": str(admin.port or 5432),
        "PGPASSWORD": admin.password or "",
        "POSTGRES_USER": admin.username or "postgres",
        "POSTGRES_DB": admin.database or "postgres",
        "TRIALS_DB_NAME": name,
        "TRIALS_DB_USER": name,
        "TRIALS_DB_PASSWORD": "it's secret",
    }
    script = os.path.join(REPO, "deploy", "postgres", "create-trials-db.sh")
    drop = [
        "psql",
        "--no-psqlrc",
        "-U",
        env["POSTGRES_USER"],
        "-d",
        env["POSTGRES_DB"],
        "-c",
        f'DROP DATABASE IF EXISTS "{name}"',
        "-c",
        f'DROP ROLE IF EXISTS "{name}"',
    ]
    try:
        done = subprocess.run(["bash", script], env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        url = admin.set(username=name, password="it's secret", database=name).render_as_string(
            hide_password=False
        )
        cli = os.path.join(os.path.dirname(sys.executable), "airflow-trials")
        migrated = subprocess.run(
            [cli, "db", "upgrade", "--db-url", url], capture_output=True, text=True, timeout=120
        )
        assert migrated.returncode == 0, migrated.stderr
        again = subprocess.run(
            ["bash", script], env=env, capture_output=True, text=True, timeout=60
        )
        assert (
            again.returncode != 0 and "already exists" in again.stderr
        )  # it never runs twice quietly
    finally:
        subprocess.run(drop, env=env, capture_output=True, timeout=60)


def _compose_cli() -> list[str] | None:
    docker = shutil.which("docker")
    if (
        docker
        and subprocess.run([docker, "compose", "version"], capture_output=True).returncode == 0
    ):
        return [docker, "compose"]
    standalone = shutil.which("docker-compose")
    return [standalone] if standalone else None


def test_docker_compose_accepts_the_file():
    cli = _compose_cli()
    if cli is None:
        pytest.skip("the Docker Compose plugin (docker compose) is not installed here")

    def config(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
        clean = {k: v for k, v in os.environ.items() if k not in REQUIRED_SECRETS}
        return subprocess.run(
            [*cli, "-f", COMPOSE_FILE, "--env-file", os.devnull, "config", "--quiet"],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=REPO,
            env={**clean, **env},
        )

    done = config(TEST_ENV)
    assert done.returncode == 0, done.stderr
    refused = config({})
    assert refused.returncode != 0 and "AIRFLOW_JWT_SECRET" in refused.stderr
