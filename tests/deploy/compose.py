"""Reading docker-compose.yml as Compose would: merge keys resolved, ${VAR:-default} and
${VAR:?error} interpolated."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
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

# The secrets docker-compose.yml requires (`${NAME:?how to make one}`: Compose refuses to start
# without them). The checks read the file as Compose would with these set.
REQUIRED_SECRETS = ("AIRFLOW_JWT_SECRET", "AIRFLOW_API_SECRET_KEY", "AIRFLOW_FERNET_KEY")
TEST_ENV = {name: f"test-{name.lower().replace('_', '-')}" for name in REQUIRED_SECRETS}

# $$ is a literal $; ${NAME}, ${NAME:-default}, ${NAME-default}, ${NAME:?error}, ${NAME?error}.
_VARIABLE = re.compile(
    r"\$\$|\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\}"
)


class MissingVariable(ValueError):
    """A `${NAME:?error}` variable is unset or empty: Compose stops with this message."""


def interpolate(value: Any, env: Mapping[str, str]) -> Any:
    """The value Compose uses with `env` as its environment (and .env file)."""
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def substitute(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name, op, arg = match.group("name"), match.group("op") or "", match.group("arg") or ""
        # With a colon, an empty value counts as unset.
        is_set = bool(env.get(name)) if op.startswith(":") else name in env
        if is_set:
            return env[name]
        if op.endswith("?"):
            raise MissingVariable(f"required variable {name} is missing a value: {arg}")
        return arg

    return _VARIABLE.sub(substitute, value)


@cache
def raw_compose() -> dict[str, Any]:
    """docker-compose.yml as YAML (anchors and merge keys resolved by PyYAML), not interpolated."""
    with open(COMPOSE_FILE) as f:
        return yaml.safe_load(f)


def compose(env: Mapping[str, str] = TEST_ENV) -> dict[str, Any]:
    return interpolate(raw_compose(), env)


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
