"""The README's quick start, as a newcomer reads it: it fits one screen, its two commands are the
scripts CI runs, the results line it shows is the one the main job prints (and the main job's test
runs that line: tests/system/test_main_job.py), and the install commands it gives work on this
checkout (the package's commands exist; the wheel it builds holds every file of the package).

The main job itself, ``./scripts/run.sh``, is run by tests/system/test_main_job.py
(``airflow-trials run``, what the script runs once the venv is set up) and by CI's fresh clone."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.conftest import REPO

README = Path(REPO, "README.md").read_text(encoding="utf-8")


def section(title: str) -> str:
    """The README's ``## title`` section, up to the next ``## `` heading."""
    start = README.index(f"\n## {title}\n")
    end = README.index("\n## ", start + 1)
    return README[start:end]


def blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", text, re.S)


def test_the_quick_start_fits_one_screen_from_the_top():
    # The title, what it is, and the quick start: at most 30 lines before the next section.
    top = README[: README.index("\n## ", README.index("\n## Quick start\n") + 1)]
    assert len(top.splitlines()) <= 30 + 6, len(top.splitlines())  # 6: title and intro
    assert len(section("Quick start").strip().splitlines()) <= 30
    wide = [line for line in top.splitlines() if len(line) > 100]
    assert wide == [], "lines wider than a screen"


def test_its_two_commands_are_the_main_job_and_the_test_command_ci_runs():
    (commands,) = blocks(section("Quick start"), "bash")
    run, test = [line.split("#")[0].strip() for line in commands.strip().splitlines()]
    assert (run, test) == ("./scripts/run.sh", "./scripts/test.sh")
    ci = Path(REPO, ".ci/run").read_text(encoding="utf-8").strip().splitlines()
    assert ci[-1].startswith("./scripts/test.sh"), "CI must run the README's test command"
    script = Path(REPO, "scripts/run.sh").read_text(encoding="utf-8")
    assert "airflow-trials run" in script or "airflow_trials.cli" in script


def test_the_results_line_it_shows_is_the_one_the_main_job_prints():
    from airflow_trials import mainjob

    (shown,) = blocks(section("Quick start"), "text")
    words = shlex.split(shown.replace("\\\n", " ").strip())  # one line, as printed
    db_url, run_key = words[words.index("--db-url") + 1], words[words.index("--run") + 1]
    assert db_url.startswith("sqlite:////") and db_url.endswith("/.state/trials.db")
    assert re.fullmatch(r"main_job__\d{4}-\d\d-\d\dT\d\d-\d\d-\d\d", run_key), run_key
    printed = mainjob.results_command(db_url, "example_regression_tuning", run_key)
    # The same words, but the venv's script: the main job prints it relative to where it ran.
    assert shlex.split(printed)[1:] == words[1:], (printed, shown)
    assert words[0] == ".venv/bin/airflow-trials"
    dag = Path(REPO, "dags/example_regression_tuning.py").read_text(encoding="utf-8")
    assert 'experiment_name="example_regression_tuning"' in dag


def _cli_lines(text: str) -> list[list[str]]:
    lines = []
    for block in blocks(text, "bash"):
        for line in block.splitlines():
            command = line.split("#")[0].strip()
            if command.startswith("airflow-trials "):
                lines.append(shlex.split(command)[1:])
    return lines


def test_the_install_section_s_commands_exist_with_those_options():
    from airflow_trials.cli import app

    lines = _cli_lines(section("Installing"))
    assert [words[:2] for words in lines] == [["db", "upgrade"], ["pool", "set"]]
    for words in lines:
        options = [w for w in words if w.startswith("--")]
        helped = CliRunner().invoke(
            app, [*[w for w in words if not w.startswith("-")][:2], "--help"]
        )
        assert helped.exit_code == 0, helped.output
        for option in options:
            assert option in helped.output, (words, option)
    pip = section("Installing")
    assert 'pip install -c constraints.txt ".[postgres,s3]"' in pip
    extras = re.findall(r"extras: ([a-z0-9, ]+)", pip)[0].split(", ")
    declared = Path(REPO, "pyproject.toml").read_text(encoding="utf-8")
    for extra in extras:
        assert re.search(rf"^{extra} = \[", declared, re.M), f"no extra {extra} in pyproject.toml"


@pytest.mark.timeout(300)
def test_the_wheel_it_builds_holds_the_whole_package(tmp_path):
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q"] + ["-w", str(tmp_path), REPO],
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert build.returncode == 0, build.stderr[-2000:]
    (wheel,) = tmp_path.glob("airflow_trials-*-py3-none-any.whl")
    assert f"dist/{wheel.name}" in README, "the README names the wheel's file"
    names = set(zipfile.ZipFile(wheel).namelist())
    package = Path(REPO, "src", "airflow_trials")
    files = {
        str(path.relative_to(package.parent))
        for path in package.rglob("*")
        if path.is_file() and "__pycache__" not in path.parts and not path.name.endswith(".pyc")
    }
    assert files - names == set(), "files the wheel leaves out"
    assert any(n.endswith("entry_points.txt") for n in names)
