"""The layering of HOUSE_STYLE.md: core/ imports neither ray nor airflow; execution/ never airflow."""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

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
    [("core", {"ray", "airflow", "optuna"}), ("execution", {"airflow"}), ("searchers", {"ray", "airflow"})],
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


def test_importing_the_package_loads_neither_ray_nor_airflow():
    code = (
        "import sys, airflow_trials; "
        "print('ray' in sys.modules, 'airflow' in sys.modules, 'optuna' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False", "False"]
