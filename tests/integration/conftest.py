"""Within each module here, the cases that need one Ray cluster shape run one after another: the
``ray_cluster`` fixture restarts Ray (a few seconds on 2 cores) whenever the shape changes."""

from __future__ import annotations

from pathlib import Path

import pytest

DEFAULT_SHAPE = (("num_cpus", 2), ("num_gpus", 2))


def _shape(item: pytest.Item) -> tuple | None:
    if "ray_cluster" not in getattr(item, "fixturenames", ()):
        return None
    callspec = getattr(item, "callspec", None)
    param = callspec.params.get("ray_cluster") if callspec is not None else None
    return tuple(sorted(param.items())) if param else DEFAULT_SHAPE


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Stable-sort each module's cases in this package by their Ray shape, in the order the
    shapes first appear (cases without the fixture form a group of their own)."""
    here = Path(__file__).parent
    by_module: dict[str, list[int]] = {}
    for i, item in enumerate(items):
        if here in Path(str(item.path)).parents:
            by_module.setdefault(str(item.path), []).append(i)
    for positions in by_module.values():
        block = [items[i] for i in positions]
        first_seen: dict[tuple | None, int] = {}
        for item in block:
            first_seen.setdefault(_shape(item), len(first_seen))
        ordered = sorted(block, key=lambda item: first_seen[_shape(item)])
        for i, item in zip(positions, ordered, strict=True):
            items[i] = item
