"""docs/cli.md is the whole reference (issue 52, D): every command of ``airflow-trials`` is in its
table of commands and every option of every command is named; ``run``'s and the ``shape``
commands' options each with the default ``--help`` shows. ``--help`` shows a setting's name
(``[airflow_trials] storage_path``) rather than Rich taking it for markup."""

from __future__ import annotations

import os
import re
from typing import Any

import pytest
import typer.main
from typer.testing import CliRunner

from airflow_trials.cli import app
from tests.conftest import REPO

DOC = open(os.path.join(REPO, "docs", "cli.md")).read()
ROOT = typer.main.get_command(app)


def _commands(command: Any, path: tuple[str, ...] = ()):
    # Typer ships its own copy of Click: its classes, not click's, so duck-typed here.
    if hasattr(command, "commands"):
        for name, sub in command.commands.items():
            yield from _commands(sub, (*path, name))
    else:
        yield path, command


COMMANDS = dict(_commands(ROOT))


def _options(command: Any) -> list[Any]:
    return [p for p in command.params if p.param_type_name == "option" and p.name != "help"]


def _names(option: Any) -> list[str]:
    return [o for o in (*option.opts, *option.secondary_opts) if o.startswith("--")]


def _section(title: str) -> str:
    start = DOC.index(f"### {title}")
    end = DOC.find("\n### ", start + 1)
    return DOC[start : end if end != -1 else None]


def _default(option: Any) -> str | None:
    """The default as ``--help`` shows it; None when it shows none."""
    if option.default is None or option.is_flag:
        return None
    value = option.default
    return str(value.value if hasattr(value, "value") else value)


@pytest.mark.parametrize("path", sorted(COMMANDS), ids=" ".join)
def test_every_command_and_option_is_in_the_reference(path):
    assert f"`airflow-trials {' '.join(path)}" in DOC or (
        path[0] == "shape" and f"`shape {' '.join(path[1:])}" in DOC
    ), f"airflow-trials {' '.join(path)} is not in docs/cli.md"
    for option in _options(COMMANDS[path]):
        for name in _names(option):
            assert f"{name}" in DOC, f"{' '.join(path)} {name} is not in docs/cli.md"


def test_run_s_options_are_in_its_table_with_their_defaults():
    section = _section("The main job: `run`")
    rows = {line.split("|")[1].strip(): line for line in section.splitlines() if line[:3] == "| `"}
    for option in _options(COMMANDS[("run",)]):
        names = " / ".join(f"`{n}`" for n in _names(option))
        assert names in rows, f"run {names} has no row in docs/cli.md"
        default = _default(option)
        if default is not None:
            assert f"`{default}`" in rows[names], (names, default, rows[names])


@pytest.mark.parametrize(
    "name", sorted(p[1] for p in COMMANDS if p[0] == "shape"), ids=lambda n: f"shape-{n}"
)
def test_each_shape_command_s_options_are_in_its_row_with_their_defaults(name):
    section = _section("The production shape: `shape`")
    (row,) = [line for line in section.splitlines() if line.startswith(f"| `shape {name}")]
    for option in _options(COMMANDS[("shape", name)]):
        for option_name in _names(option):
            assert f"`{option_name}`" in row, (name, option_name)
        default = _default(option)
        if default is not None and option.name != "home":  # --home's default: in the text
            assert f"`{default}`" in row, (name, option.name, default)
    assert "`--home` (text, default `.shape`)" in section


def test_plot_s_out_is_optional_in_the_reference():
    out = next(o for o in _options(COMMANDS[("plot",)]) if "--out" in o.opts)
    assert not out.required and out.default == "learning_curves.png"
    (row,) = [line for line in DOC.splitlines() if line.startswith("| `airflow-trials plot ")]
    assert "[--out learning_curves.png]" in row


@pytest.mark.parametrize(
    ("command", "setting"),
    [
        (["shape", "down"], "[airflow_trials] drain_timeout_seconds"),
        (["export", "mlflow"], "[airflow_trials] storage_path"),
        (["db", "delete-run"], "[airflow_trials] storage_path"),
    ],
)
def test_help_names_settings_rather_than_eating_them_as_markup(command, setting):
    shown = CliRunner().invoke(app, [*command, "--help"], env={"COLUMNS": "400"})
    assert shown.exit_code == 0, shown.output
    assert setting in re.sub(r"\s*│\s*", " ", shown.output)
