"""The verdict a trial got at a rung and the steps of its PBT lineage, as the trial and decisions
pages and their JSON show them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from airflow_trials.store import ExploitRecord, RungDecision

AT_END = "recorded at end"


def rung_verdict(rung: RungDecision) -> str:
    """The verdict a trial got at a rung: ``CONTINUE`` or ``STOP``; :data:`AT_END` for the value
    ASHA records when the trial ends, whose verdict nobody acts on."""
    return AT_END if rung.at_end else rung.decision.value


@dataclass(frozen=True)
class ConfigChange:
    """One config key a PBT exploit changed.

    :param key: the key, nested keys joined with dots (``"optimizer.lr"``).
    :param old: its value before the exploit; None when the config had no such key.
    :param new: its value after; None when the new config has no such key.
    :param operation: what PBT's explore did to it (e.g. ``"0.01 * 1.2"``); None when not said.
    """

    key: str
    old: Any
    new: Any
    operation: str | None = None


@dataclass(frozen=True)
class LineageStep:
    """One exploit of a trial's lineage, with the config keys it changed.

    :param exploit: the stored exploit (``TrialReader.lineage``).
    :param changes: the keys whose values differ between its old and new config, sorted.
    """

    exploit: ExploitRecord
    changes: list[ConfigChange]


def config_changes(
    old: dict[str, Any],
    new: dict[str, Any],
    operations: dict[str, str] | None = None,
) -> list[ConfigChange]:
    """The keys whose values differ between two configs (nested dicts compared key by key, named
    with dots, as PBT's operations name them), sorted, each with what ``operations`` says was
    done."""
    before, after = _flatten(old), _flatten(new)
    said = operations or {}
    return [
        ConfigChange(key, before.get(key), after.get(key), said.get(key))
        for key in sorted(before.keys() | after.keys())
        if key not in before or key not in after or before[key] != after[key]
    ]


def lineage_steps(lineage: Sequence[ExploitRecord]) -> list[LineageStep]:
    """A lineage as the trial page lists it: each exploit with the keys it changed."""
    return [
        LineageStep(e, config_changes(e.old_config, e.new_config, e.operations)) for e in lineage
    ]


def _flatten(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, dict) and value:
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat
