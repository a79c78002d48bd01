"""House rules that CI enforces through the test command, over the package, its tests, the
benchmarks and the DAGs: ruff's lint, line length included (E501 at ``line-length`` in
pyproject.toml), ruff's formatting (``.venv/bin/ruff format`` fixes it), and the size caps over
src/: no module over 500 lines, no function over 60. The import rules (no arrow back up the
layers, no circles) are in test_layering.py."""

from __future__ import annotations

import ast
import pathlib
import shutil
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 60


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


def _oversized(path: pathlib.Path, source: str) -> list[str]:
    """What in ``source`` breaks the size caps: the module's lines, each function's (its ``def``
    line to its last, docstring included; decorators not)."""
    found = []
    lines = source.count("\n")
    if lines > MAX_MODULE_LINES:
        found.append(f"{path}: {lines} lines (at most {MAX_MODULE_LINES})")
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            if length > MAX_FUNCTION_LINES:
                found.append(
                    f"{path}:{node.lineno} {node.name}: {length} lines (at most "
                    f"{MAX_FUNCTION_LINES})"
                )
    return found


def test_no_module_over_500_lines_and_no_function_over_60_in_src():
    found = [
        problem
        for path in sorted((REPO / "src").rglob("*.py"))
        for problem in _oversized(path.relative_to(REPO), path.read_text())
    ]
    assert not found, "split these into named steps (not packed lines):\n" + "\n".join(found)


def test_the_size_caps_catch_a_long_module_and_a_long_function():
    long_function = "def f():\n" + "    x = 1\n" * MAX_FUNCTION_LINES
    just_fits = "def g():\n" + "    x = 1\n" * (MAX_FUNCTION_LINES - 1)
    long_method = "class C:\n    async def h(self):\n" + "        x = 1\n" * MAX_FUNCTION_LINES
    long_module = "x = 1\n" * (MAX_MODULE_LINES + 1)
    path = pathlib.Path("m.py")
    assert [p.split()[1] for p in _oversized(path, long_function)] == ["f:"]
    assert _oversized(path, just_fits) == []
    assert [p.split()[1] for p in _oversized(path, long_method)] == ["h:"]
    assert _oversized(path, long_module) == [f"m.py: {MAX_MODULE_LINES + 1} lines (at most 500)"]
    assert _oversized(path, "x = 1\n" * MAX_MODULE_LINES) == []
