"""Every Python block in README.md and docs/*.md is run by a test, or is marked as a fragment of a
file that is tested: the line before its fence is ``<!-- runs: TEST -->`` (TEST runs it: it names
the doc) or ``<!-- fragment: FILE -->`` (the block is cut from FILE, or shows what FILE does in
full). A new block without a marker, or a marker naming a file that is gone, fails here."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
MARKER = re.compile(r"<!-- (runs|fragment): (\S+) -->")


def python_blocks(doc: Path) -> list[tuple[int, str]]:
    """``(line number, the line before the fence)`` of each python block."""
    lines = doc.read_text(encoding="utf-8").splitlines()
    return [
        (n + 1, lines[n - 1] if n else "")
        for n, line in enumerate(lines)
        if line.strip() == "```python"
    ]


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: d.name)
def test_every_python_block_is_run_or_marked_as_a_fragment_of_a_tested_file(doc):
    problems = []
    for line, before in python_blocks(doc):
        marker = MARKER.fullmatch(before.strip())
        if marker is None:
            problems.append(
                f"{doc.name}:{line}: no '<!-- runs: TEST -->' or '<!-- fragment: FILE -->' before "
                "it"
            )
            continue
        kind, path = marker.groups()
        target = REPO / path
        if not target.is_file():
            problems.append(f"{doc.name}:{line}: {path} does not exist")
        elif kind == "runs" and doc.name not in target.read_text(encoding="utf-8"):
            problems.append(f"{doc.name}:{line}: {path} never reads {doc.name}")
    assert problems == []


def test_the_check_sees_a_block_without_a_marker(tmp_path):
    doc = tmp_path / "x.md"
    doc.write_text(
        "text\n\n```python\nprint(1)\n```\n<!-- runs: tests -->\n```python\nprint(2)\n```\n"
    )
    assert python_blocks(doc) == [(3, ""), (7, "<!-- runs: tests -->")]
    assert MARKER.fullmatch(python_blocks(doc)[0][1]) is None
