"""The store imports SQLAlchemy and Alembic, never Ray or Airflow: the layering of the house style
(HOUSE_STYLE.md, kept beside the repository in ../shared/, not in it; docs/architecture.md)."""

from __future__ import annotations

import subprocess
import sys

from tests.unit.test_layering import PKG, _imported_roots


def test_store_imports_neither_ray_nor_airflow():
    files = sorted((PKG / "store").rglob("*.py"))
    assert len(files) > 5
    offenders = {
        str(f.relative_to(PKG)): sorted(_imported_roots(f) & {"ray", "airflow"})
        for f in files
        if _imported_roots(f) & {"ray", "airflow"}
    }
    assert offenders == {}


def test_using_the_store_loads_neither_ray_nor_airflow():
    code = (
        "import sys; from airflow_trials.store import TrialStore; "
        "TrialStore('sqlite://', create=True).reader.list_trials(); "
        "print('ray' in sys.modules, 'airflow' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]
