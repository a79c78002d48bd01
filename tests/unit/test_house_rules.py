"""House rules that CI enforces through the test command, over the package, its tests, the
benchmarks and the DAGs: ruff's lint, line length included (E501 at ``line-length`` in
pyproject.toml), and ruff's formatting (``.venv/bin/ruff format`` fixes it). The import rules (no
arrow back up the layers, no circles) are in test_layering.py."""

from __future__ import annotations

import pathlib
import shutil
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]


def _ruff() -> list[str]:
    beside_python = pathlib.Path(sys.executable).with_name("ruff")
    if beside_python.exists():
        return [str(beside_python)]
    found = shutil.which("ruff")
    if found is None:
        pytest.skip("ruff is not installed: pip install -e '.[dev]' (scripts/bootstrap.sh does)")
    return [found]


def test_ruff_finds_nothing_line_length_included():
    done = subprocess.run(
        [*_ruff(), "check", "--output-format", "concise", "src", "tests", "bench", "dags"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-5000:] + done.stderr[-2000:]


def test_the_code_is_formatted_as_ruff_formats_it():
    done = subprocess.run(
        [*_ruff(), "format", "--check", "src", "tests", "bench", "dags"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, (
        "run .venv/bin/ruff format src tests bench dags\n"
        + done.stdout[-5000:]
        + done.stderr[-2000:]
    )


def test_line_length_is_checked():
    config = (REPO / "pyproject.toml").read_text()
    assert "line-length = 100" in config
    done = subprocess.run(
        [*_ruff(), "check", "--select", "E501", "--stdin-filename", "long.py", "-"],
        cwd=REPO,
        input="x = 1  # " + "y" * 100 + "\n",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1 and "E501" in done.stdout
