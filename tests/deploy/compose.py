"""Reading docker-compose.yml as Compose would: merge keys resolved, ${VAR:-default}
interpolated."""

from __future__ import annotations

import json
import os
import re
from functools import cache
from typing import Any

import yaml

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COMPOSE_FILE = os.path.join(REPO, "docker-compose.yml")
AIRFLOW_COMPONENTS = {
    "airflow-api-server": "api-server",
    "airflow-scheduler": "scheduler",
    "airflow-dag-processor": "dag-processor",
    "airflow-triggerer-1": "triggerer",
    "airflow-triggerer-2": "triggerer",
}

# $$ is a literal $; ${NAME}, ${NAME:-default}, ${NAME-default}, ${NAME:?error}, ${NAME?error}.
_VARIABLE = re.compile(
    r"\$\$|\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\}"
)


def interpolate(value: Any) -> Any:
    """The value Compose uses when no variable is set in the environment: every default applied."""
    if isinstance(value, dict):
        return {k: interpolate(v) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v) for v in value]
    if not isinstance(value, str):
        return value

    def substitute(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        if match.group("op") and match.group("op").endswith("?"):
            raise ValueError(f"{match.group(0)} in {COMPOSE_FILE} is required and has no default")
        return match.group("arg") or ""

    return _VARIABLE.sub(substitute, value)


@cache
def raw_compose() -> dict[str, Any]:
    """docker-compose.yml as YAML (anchors and merge keys resolved by PyYAML), not interpolated."""
    with open(COMPOSE_FILE) as f:
        return yaml.safe_load(f)


def compose() -> dict[str, Any]:
    return interpolate(raw_compose())


def services() -> dict[str, dict[str, Any]]:
    return compose()["services"]


def environment(service: dict[str, Any]) -> dict[str, str]:
    """A service's environment as a dict, from either the mapping or the list form."""
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {k: str(v) for k, v in env.items()}


def connection(service: dict[str, Any], conn_id: str) -> dict[str, Any]:
    """The AIRFLOW_CONN_<ID> connection of a service, parsed from its JSON form."""
    return json.loads(environment(service)[f"AIRFLOW_CONN_{conn_id.upper()}"])


def command_args(service: dict[str, Any]) -> list[str]:
    command = service.get("command") or []
    return command.split() if isinstance(command, str) else [str(c) for c in command]


def volume_mounts(service: dict[str, Any]) -> dict[str, str]:
    """Source (named volume or host path) -> target path, from short or long volume syntax."""
    mounts = {}
    for volume in service.get("volumes") or []:
        if isinstance(volume, dict):
            mounts[volume["source"]] = volume["target"]
        else:
            source, target = volume.split(":")[:2]
            mounts[source] = target
    return mounts


def ray_services(c: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The services that run a Ray node (`ray start`)."""
    return {name: s for name, s in c["services"].items() if command_args(s)[:2] == ["ray", "start"]}


def airflow_services(c: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The services that run Airflow code: those given the Ray connection."""
    return {
        name: s for name, s in c["services"].items() if "AIRFLOW_CONN_RAY_DEFAULT" in environment(s)
    }


def option(args: list[str], name: str) -> str | None:
    """The value of ``--name=value`` (or ``--name value``) in a command line; None if absent."""
    for i, arg in enumerate(args):
        if arg.startswith(f"{name}="):
            return arg.split("=", 1)[1]
        if arg == name and i + 1 < len(args):
            return args[i + 1]
    return None
