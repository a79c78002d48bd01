"""The xdist scheduler of ``scripts/test.sh``'s whole-suite run: xdist's LoadScopeScheduling (a
unit of tests to a worker at a time, the next unit to the first worker that runs short), with
the units the workers wrote at collection (tests/conftest.py ``_write_units``: a module, or all
the fault cases given to the workers, whose stacks must start one at a time).

``--dist loadgroup`` would do this from ``xdist_group`` marks, but it renames test ids to carry
the group, which pytest 9 no longer lets a plugin do: the tests were spread one by one.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from xdist.scheduler import LoadScopeScheduling


class UnitScheduling(LoadScopeScheduling):
    """:param units_file: gives the path of the JSON object (test id: unit) the workers wrote,
    once they have collected; a test it does not name is a unit with the rest of its module."""

    def __init__(self, config, log, units_file: Callable[[], str | None]) -> None:
        super().__init__(config, log)
        self._units_file = units_file
        self._units: dict[str, str] | None = None

    def _split_scope(self, nodeid: str) -> str:
        if self._units is None:
            path = self._units_file()
            try:
                with open(path or "", encoding="utf-8") as f:
                    self._units = json.load(f)
            except OSError:
                self._units = {}
        return self._units.get(nodeid) or nodeid.split("::", 1)[0]
