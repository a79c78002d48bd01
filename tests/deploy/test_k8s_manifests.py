"""The Kubernetes manifests in docs/deploy.md are valid, checked offline: no cluster is reached.

Every YAML block of the page with a ``kind`` is a manifest. Kubernetes' own kinds (Pod, Secret)
are parsed into the kubernetes client's models, strictly: a field the model does not have (a
typo, a field at the wrong level) or a value of the wrong type is a problem, and the models' own
checks (required fields) run too. KubeRay's RayCluster has no model there: its pod templates are
checked as ``V1PodTemplateSpec``, and its other fields against the ``ray.io/v1`` fields it may
use. Each check is also run on a copy with one defect put in, where it must name it.
"""

from __future__ import annotations

import copy
import datetime
import json
import os
import re
from typing import Any

import pytest
import yaml

from tests.deploy.compose import REPO

kubernetes = pytest.importorskip("kubernetes", reason="the kubernetes client is a dev dependency")

DOC = os.path.join(REPO, "docs", "deploy.md")
_BLOCK = re.compile(r"```yaml\n(.*?)```", re.S)
_PRIMITIVES: dict[str, tuple[type, ...]] = {
    # YAML writes quantities ("8", 1, 0.5) and ports as either; Kubernetes reads both.
    "str": (str, int, float),
    "int": (int,),
    "float": (int, float),
    "bool": (bool,),
    "datetime": (str, datetime.datetime),
    "date": (str, datetime.date),
    "bytes": (str, bytes),
}
# KubeRay's ray.io/v1 RayCluster fields this page may use (a subset of its CRD).
RAY_CLUSTER_SPEC = {"rayVersion", "headGroupSpec", "workerGroupSpecs", "enableInTreeAutoscaling"}
HEAD_GROUP = {"rayStartParams", "template", "serviceType"}
WORKER_GROUP = {"groupName", "replicas", "minReplicas", "maxReplicas", "rayStartParams", "template"}


def manifests() -> list[dict[str, Any]]:
    with open(DOC) as f:
        blocks = [yaml.safe_load(block) for block in _BLOCK.findall(f.read())]
    return [b for b in blocks if isinstance(b, dict) and "kind" in b]


def model_problems(data: Any, model: str, where: str) -> list[str]:
    """What in ``data`` the kubernetes client's ``model`` (an openapi type name) does not take."""
    if model == "object":
        return []
    if model in _PRIMITIVES:
        ok = isinstance(data, _PRIMITIVES[model]) and not (
            model != "bool" and isinstance(data, bool)
        )
        return [] if ok else [f"{where}: {data!r} is not a {model}"]
    if model.lower().startswith("list["):
        if not isinstance(data, list):
            return [f"{where}: not a list"]
        inner = model[5:-1]
        return [
            p for i, item in enumerate(data) for p in model_problems(item, inner, f"{where}[{i}]")
        ]
    if model.lower().startswith(("dict(", "dict[")):
        if not isinstance(data, dict):
            return [f"{where}: not a mapping"]
        inner = model[model.index(",") + 1 : -1].strip()
        return [p for k, v in data.items() for p in model_problems(v, inner, f"{where}.{k}")]
    cls = getattr(kubernetes.client.models, model)
    if not isinstance(data, dict):
        return [f"{where}: not a mapping ({model})"]
    fields = {json_name: name for name, json_name in cls.attribute_map.items()}
    problems = []
    for key, value in data.items():
        if key not in fields:
            problems.append(f"{where}.{key}: {model} has no field {key!r}")
        else:
            problems += model_problems(value, cls.openapi_types[fields[key]], f"{where}.{key}")
    if not problems:
        try:  # the model's own checks: required fields, allowed values
            kubernetes.client.ApiClient()._ApiClient__deserialize(data, model)
        except (ValueError, TypeError) as e:
            problems.append(f"{where}: {model}: {e}")
    return problems


def ray_cluster_problems(manifest: dict[str, Any]) -> list[str]:
    where = f"RayCluster {manifest.get('metadata', {}).get('name')}"
    problems = []
    if manifest.get("apiVersion") != "ray.io/v1":
        problems.append(f"{where}: apiVersion {manifest.get('apiVersion')} is not ray.io/v1")
    problems += model_problems(manifest.get("metadata"), "V1ObjectMeta", f"{where}.metadata")
    spec = manifest.get("spec") or {}
    problems += [f"{where}.spec.{k}: not a RayCluster field" for k in set(spec) - RAY_CLUSTER_SPEC]
    groups = [("headGroupSpec", spec.get("headGroupSpec") or {}, HEAD_GROUP)]
    groups += [
        (f"workerGroupSpecs[{i}]", group, WORKER_GROUP)
        for i, group in enumerate(spec.get("workerGroupSpecs") or [])
    ]
    for name, group, allowed in groups:
        problems += [f"{where}.spec.{name}.{k}: not a field here" for k in set(group) - allowed]
        problems += model_problems(
            group.get("template"), "V1PodTemplateSpec", f"{where}.spec.{name}.template"
        )
        params = group.get("rayStartParams")
        if not isinstance(params, dict) or not all(isinstance(v, str) for v in params.values()):
            problems.append(f"{where}.spec.{name}.rayStartParams: not a mapping of strings")
    return problems


def problems_of(manifest: dict[str, Any]) -> list[str]:
    kind = manifest["kind"]
    if kind == "RayCluster":
        return ray_cluster_problems(manifest)
    return model_problems(manifest, f"V1{kind}", kind)


def test_the_page_has_the_manifests_it_describes():
    assert sorted(m["kind"] for m in manifests()) == ["Pod", "RayCluster", "Secret"]


@pytest.mark.parametrize("manifest", manifests(), ids=lambda m: m["kind"])
def test_each_manifest_is_valid(manifest):
    assert problems_of(manifest) == []


def test_the_secret_holds_connections_the_hooks_read(monkeypatch):
    from airflow_trials.hooks.trials import RayHook, TrialsDbHook

    (secret,) = [m for m in manifests() if m["kind"] == "Secret"]
    for key, value in secret["stringData"].items():
        json.loads(value)
        monkeypatch.setenv(key, value)
    assert RayHook().settings()["address"] == "ray://trials-head-svc.ray.svc.cluster.local:10001"
    assert TrialsDbHook().get_url().startswith("postgresql+psycopg://trials:")
    (pod,) = [m for m in manifests() if m["kind"] == "Pod"]
    (container,) = pod["spec"]["containers"]
    assert container["name"] == "base"
    assert {"secretRef": {"name": secret["metadata"]["name"]}} in container["envFrom"]


def _kind(kind: str) -> dict[str, Any]:
    return copy.deepcopy(next(m for m in manifests() if m["kind"] == kind))


DEFECTS = [
    (
        "misspelt field",
        "Pod",
        lambda m: m["spec"].update({"restartPolicyy": "Never"}),
        "restartPolicyy",
    ),
    (
        "wrong level",
        "Pod",
        lambda m: m["spec"]["containers"][0].update({"serviceAccountName": "x"}),
        "V1Container has no field 'serviceAccountName'",
    ),
    (
        "wrong type",
        "Pod",
        lambda m: m["spec"]["containers"][0].update({"env": {"A": "b"}}),
        "not a list",
    ),
    ("no container name", "Pod", lambda m: m["spec"]["containers"][0].pop("name"), "name"),
    (
        "worker template typo",
        "RayCluster",
        lambda m: m["spec"]["workerGroupSpecs"][0]["template"]["spec"].update({"containerz": []}),
        "containerz",
    ),
    (
        "group field",
        "RayCluster",
        lambda m: m["spec"]["headGroupSpec"].update({"replicas": 2}),
        "headGroupSpec.replicas: not a field here",
    ),
    (
        "start params",
        "RayCluster",
        lambda m: m["spec"]["headGroupSpec"].update({"rayStartParams": {"num-cpus": 0}}),
        "rayStartParams: not a mapping of strings",
    ),
]


@pytest.mark.parametrize(
    ("kind", "mutate", "problem"), [d[1:] for d in DEFECTS], ids=[d[0] for d in DEFECTS]
)
def test_each_check_names_the_defect_it_is_for(kind, mutate, problem):
    broken = _kind(kind)
    mutate(broken)
    problems = problems_of(broken)
    assert any(problem in p for p in problems), problems
