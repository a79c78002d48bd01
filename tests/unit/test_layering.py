"""The layering of the house style (HOUSE_STYLE.md, kept beside the repository, in ../shared/, not
in it; docs/architecture.md draws the same layers): core/ imports neither ray nor airflow;
execution/ never airflow; no import runs back up the layers; no modules and no folders import
each other (lazily included); execution/'s process folders stay apart."""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys
from collections.abc import Mapping

import pytest

PKG = pathlib.Path(__file__).resolve().parents[2] / "src" / "airflow_trials"


def _imported_roots(path: pathlib.Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


@pytest.mark.parametrize(
    ("layer", "forbidden"),
    [
        ("core", {"ray", "airflow", "optuna"}),
        ("execution", {"airflow"}),
        ("searchers", {"ray", "airflow"}),
        ("schedulers", {"ray", "airflow", "optuna"}),
        ("export", {"ray", "airflow"}),
    ],
)
def test_layer_does_not_import(layer, forbidden):
    files = sorted((PKG / layer).rglob("*.py"))
    assert files, f"no modules found under {layer}/"
    offenders = {
        str(f.relative_to(PKG)): sorted(_imported_roots(f) & forbidden)
        for f in files
        if _imported_roots(f) & forbidden
    }
    assert offenders == {}


def test_detector_sees_imports(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import ray.util\nfrom airflow.sdk import DAG\n")
    assert _imported_roots(bad) == {"ray", "airflow"}


def loaded_after(statements: str, *packages: str) -> list[bool]:
    """Whether each of ``packages`` is imported after ``statements`` run in a fresh interpreter."""
    code = f"import sys; {statements}; print(*(p in sys.modules for p in {packages!r}))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return [word == "True" for word in out.stdout.split()]


def test_importing_the_package_loads_neither_ray_nor_airflow():
    assert loaded_after("import airflow_trials", "ray", "airflow", "optuna") == [False] * 3


def test_parsing_a_dag_file_loads_no_ray():
    # The DAG processor parses every DAG file again and again: what tuning_experiment needs to
    # build the DAG imports no Ray (0.4 to 0.9 s a parse on the 2-core machine). A trial task
    # imports it when it starts; the main job's task processes inherit it from their preload.
    statements = "import airflow_trials.experiment, airflow_trials.core.search"
    assert loaded_after(statements, "airflow", "ray") == [True, False]


# -- the package's own imports: no arrow back up the layers, no circles -------------------------
#
# The layers, bottom to top (a module may import its own layer and those below it), as
# docs/architecture.md draws them:
#
# 0. ``exceptions``, ``core/``: the pure domain;
# 1. ``store/``, ``results`` (ResultGrid, a read model of the trials DB), ``trials_db_url`` (which
#    trials DB), ``provider_config`` (the ``[airflow_trials]`` settings), ``searchers/``;
# 1.5 ``schedulers/``: one slice per scheduler (its rule, the runner's hooks, its Airflow-path
#    settings, its state in memory and in the trials DB); it may import ``core/``, ``exceptions``
#    and ``store/`` (the trials-DB backend's records; the SQL stays in ``store/``, which never
#    imports a scheduler);
# 1. ``storage/``: trial storage as plain file I/O (checkpoints, logs), beside the store;
# 2. ``execution/``: Ray. Its top holds what several processes share; ``worker/`` (a trial's
#    actor), ``driver/`` (the runner, the launcher) and ``triggerer/`` (the poller) each hold one
#    process's code. The top imports none of the three and they import no other of them, but
#    for one arrow: the driver starts actors from the worker's ``TrialActor`` class
#    (``driver/slots.py``);
# 3. ``plotting``, ``pools``, ``ports``, ``examples/``, ``export/`` (MLflow): what users call around
#    a run;
# 4. ``hooks/``: the Airflow connections;
# 5. ``triggers/``, ``operators/``, ``sensors/``: the Airflow tasks;
# 6. ``experiment/``: the task group a DAG declares;
# 7. ``plugins/``, ``cli/``, ``mainjob`` (with ``mainjob_tasks``, how its stack starts tasks, and
#    ``mainjob_forkserver``, what its forkserver runs), ``demo``: the entry points.
#
# A folder (a directory under the package; each top-level module is one of its own) imports
# another when one of its modules does; no two folders import each other, through any chain.
#
# Imports inside functions and under ``if TYPE_CHECKING`` count: a lazy import is still a
# dependency. The package's root ``__init__`` is the public facade, re-exporting from every layer;
# ``examples/`` and ``demo`` import from it as users do.

LAYERS: Mapping[str, float] = {
    "exceptions": 0,
    "core": 0,
    "store": 1,
    "searchers": 1,
    "trials_db_url": 1,
    "provider_config": 1,
    "results": 1,
    "result_rows": 1,
    "storage": 1,
    "schedulers": 1.5,
    "execution": 2,
    "plotting": 3,
    "pools": 3,
    "ports": 3,
    "examples": 3,
    "export": 3,
    "hooks": 4,
    "triggers": 5,
    "operators": 5,
    "sensors": 5,
    "experiment": 6,
    "plugins": 7,
    "cli": 7,
    "mainjob": 7,
    "mainjob_tasks": 7,
    "mainjob_forkserver": 7,
    "shape": 7,
    "demo": 7,
}


def _module_name(path: pathlib.Path, package: pathlib.Path) -> str:
    parts = list(path.relative_to(package.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def import_graph(package: pathlib.Path = PKG) -> dict[str, set[str]]:
    """Each module of ``package`` (migrations aside) -> the package's modules it imports anywhere
    in its body: at the top, inside functions, or under ``if TYPE_CHECKING``."""
    paths = {
        _module_name(p, package): p
        for p in package.rglob("*.py")
        if "migrations" not in p.relative_to(package).parts
    }
    root = package.name
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        imported: set[str] = set()
        base = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                imported.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    parent = base[: len(base) - (node.level - 1)]
                    module = ".".join(parent + ([node.module] if node.module else []))
                else:
                    module = node.module or ""
                for alias in node.names:
                    submodule = f"{module}.{alias.name}"
                    imported.add(submodule if submodule in paths else module)
        graph[name] = {m for m in imported if m in paths and m != name and m.split(".")[0] == root}
    return graph


def cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The import circles: strongly connected groups of two or more modules (Tarjan's)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def _layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def arrows_up(graph: Mapping[str, set[str]]) -> list[str]:
    """``a -> b`` for each import of a module in a higher layer than the importer's."""
    up = []
    for module, imported in sorted(graph.items()):
        layer = _layer(module)
        if layer is None:
            continue
        for target in sorted(imported):
            target_layer = _layer(target)
            if target_layer is not None and LAYERS[target_layer] > LAYERS[layer]:
                up.append(f"{module} -> {target}")
    return up


def test_every_room_has_a_layer():
    rooms = {_layer(m) for m in import_graph()} - {None}
    assert rooms - set(LAYERS) == set(), "add the new top-level module or package to LAYERS"


def test_no_arrow_runs_back_up():
    graph = import_graph()
    assert len(graph) > 100 and sum(map(len, graph.values())) > 300, "the scan found the package"
    assert arrows_up(graph) == []


def test_no_import_circles():
    assert cycles(import_graph()) == []


PROCESSES = ("worker", "driver", "triggerer")
# The driver starts each trial's actor from the worker's class: the one arrow between processes.
PROCESS_ARROWS_ALLOWED = {("execution.driver.slots", "execution.worker.actor")}


def folder(module: str, package: pathlib.Path = PKG) -> str:
    """The folder of a module: its directory under the package (``execution/worker``), or the
    module itself for a top-level module (``trials_db_url``); the root ``__init__`` is ``""``."""
    parts = module.split(".")[1:]
    if not parts:
        return ""
    if (package.joinpath(*parts)).is_dir():
        return "/".join(parts)
    return "/".join(parts[:-1]) or parts[0]


def folder_graph(graph: Mapping[str, set[str]], package: pathlib.Path = PKG) -> dict[str, set[str]]:
    """Each folder -> the other folders its modules import (the root facade left out)."""
    folders: dict[str, set[str]] = {}
    for module, imported in graph.items():
        source = folder(module, package)
        if not source:
            continue
        targets = {folder(target, package) for target in imported}
        folders.setdefault(source, set()).update(targets - {source, ""})
    return folders


def _process(module: str) -> str | None:
    """``top``, ``worker``, ``driver`` or ``triggerer`` for a module of ``execution/``; None
    elsewhere."""
    parts = module.split(".")[1:]
    if not parts or parts[0] != "execution":
        return None
    return parts[1] if len(parts) > 2 and parts[1] in PROCESSES else "top"


def process_arrows(graph: Mapping[str, set[str]]) -> list[str]:
    """``a -> b`` for each import of a process folder's module from ``execution/``'s top, or
    from another process folder, but the allowed ones."""
    crossings = []
    for module, imported in sorted(graph.items()):
        source = _process(module)
        for target in sorted(imported):
            kind = _process(target)
            if source is None or kind in (None, "top", source):
                continue
            relative = (module.split(".", 1)[1], target.split(".", 1)[1])
            if relative not in PROCESS_ARROWS_ALLOWED:
                crossings.append(f"{module} -> {target}")
    return crossings


def test_no_folder_circles():
    folders = folder_graph(import_graph())
    assert {"core", "store", "execution", "execution/worker", "storage"} <= set(folders)
    assert cycles(folders) == []


def test_execution_processes_stay_apart():
    assert process_arrows(import_graph()) == []


# plugins/ names its modules per resource (routes/runs.py, datamodels/runs.py, services/runs.py),
# as Airflow's api_fastapi/core_api does: a plugins/ module named after a resource (a module of
# plugins/routes/) may share its name; every other module's file name is its own.
NAMED_PER_RESOURCE = "plugins"


def _resources(package: pathlib.Path) -> set[str]:
    """The file names of plugins/routes/' modules: one per resource."""
    routes = package / NAMED_PER_RESOURCE / "routes"
    return {p.name for p in routes.glob("*.py")} - {"__init__.py"}


def shared_names(package: pathlib.Path = PKG) -> dict[str, list[str]]:
    """File name -> the modules that share it (``__init__``, ``__main__``, migrations and
    plugins/' per-resource modules aside)."""
    resources = _resources(package)
    by_name: dict[str, list[str]] = {}
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package).parts
        if path.name in ("__init__.py", "__main__.py") or "migrations" in parts:
            continue
        if parts[0] == NAMED_PER_RESOURCE and path.name in resources:
            continue
        by_name.setdefault(path.name, []).append("/".join(parts))
    return {name: paths for name, paths in by_name.items() if len(paths) > 1}


def test_no_two_modules_share_a_name():
    assert shared_names() == {}


def test_the_name_check_sees_a_shared_name(tmp_path):
    for relative in (
        "core/trial.py",
        "operators/trial.py",
        "plugins/routes/runs.py",
        "plugins/datamodels/runs.py",
        "plugins/services/runs.py",
        "plugins/charts/rungs.py",
        "store/rungs.py",
        "core/__init__.py",
        "store/__init__.py",
    ):
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_text("")
    assert shared_names(tmp_path) == {
        "trial.py": ["core/trial.py", "operators/trial.py"],
        "rungs.py": ["plugins/charts/rungs.py", "store/rungs.py"],
    }


@pytest.mark.parametrize(
    ("files", "expected_folder_cycles", "expected_crossings"),
    [
        pytest.param(
            {
                "core/a.py": "from pkg import errors\n",
                "errors.py": "def f():\n    from pkg.core.b import x\n",
                "core/b.py": "x = 1\n",
            },
            [["core", "errors"]],
            [],
            id="folders-circle-with-no-module-circle",
        ),
        pytest.param(
            {
                "execution/__init__.py": "",
                "execution/handles.py": "from pkg.execution.worker.actor import A\n",
                "execution/worker/__init__.py": "",
                "execution/worker/actor.py": "from pkg.execution.spec import S\n",
                "execution/spec.py": "S = 1\n",
            },
            [["execution", "execution/worker"]],
            ["pkg.execution.handles -> pkg.execution.worker.actor"],
            id="shared-top-imports-a-process",
        ),
        pytest.param(
            {
                "execution/__init__.py": "",
                "execution/triggerer/__init__.py": "",
                "execution/triggerer/p.py": "def f():\n    from pkg.execution.driver import r\n",
                "execution/driver/__init__.py": "",
                "execution/driver/r.py": "from pkg.execution.top import t\n",
                "execution/top.py": "t = 1\n",
            },
            [],
            ["pkg.execution.triggerer.p -> pkg.execution.driver.r"],
            id="lazy-import-across-processes",
        ),
        pytest.param(
            {
                "execution/__init__.py": "",
                "execution/driver/__init__.py": "",
                "execution/driver/slots.py": "from pkg.execution.worker.actor import A\n",
                "execution/worker/__init__.py": "",
                "execution/worker/actor.py": "A = 1\n",
            },
            [],
            [],
            id="the-allowed-arrow",
        ),
    ],
)
def test_the_folder_checks_see_what_they_are_for(
    tmp_path, files, expected_folder_cycles, expected_crossings
):
    package = tmp_path / "pkg"
    for relative, text in {"__init__.py": "", "core/__init__.py": "", **files}.items():
        (package / relative).parent.mkdir(parents=True, exist_ok=True)
        (package / relative).write_text(text)
    graph = import_graph(package)
    assert cycles(graph) == []
    assert cycles(folder_graph(graph, package)) == expected_folder_cycles
    assert process_arrows(graph) == expected_crossings


@pytest.mark.parametrize(
    ("files", "expected_cycles", "expected_up"),
    [
        pytest.param(
            {
                "core/a.py": "from pkg.core import b\n",
                "core/b.py": "def f():\n    from pkg.core.a import x\n",
            },
            [["pkg.core.a", "pkg.core.b"]],
            [],
            id="lazy-import-closes-a-circle",
        ),
        pytest.param(
            {
                "core/a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from "
                "pkg.store.s import S\n",
                "store/s.py": "from .t import T\n",
                "store/t.py": "T = 1\n",
            },
            [],
            ["pkg.core.a -> pkg.store.s"],
            id="type-only-import-runs-up",
        ),
        pytest.param(
            {"store/s.py": "from pkg.core.a import x\n", "core/a.py": "x = 1\n"},
            [],
            [],
            id="clean",
        ),
    ],
)
def test_the_checks_see_what_they_are_for(tmp_path, files, expected_cycles, expected_up):
    package = tmp_path / "pkg"
    for relative, text in {
        "__init__.py": "",
        "core/__init__.py": "",
        "store/__init__.py": "",
        **files,
    }.items():
        (package / relative).parent.mkdir(parents=True, exist_ok=True)
        (package / relative).write_text(text)
    graph = import_graph(package)
    assert cycles(graph) == expected_cycles
    assert arrows_up(graph) == expected_up
