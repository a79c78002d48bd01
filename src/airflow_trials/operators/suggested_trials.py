"""What ``suggest_configs`` hands on of a run's trials: the mapped path's list of entries, or a
sweep's reference to the trials it registered in the trials DB, whose size does not grow with
the number of trials (docs/airflow.md "What a sweep passes in XCom")."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

#: What the reference names beside the run's own settings; a list's entries name the first three.
_ENTRY_KEYS = ("trial_id", "config", "experiment_run_id", "warm_start", "restore_path")
NUM_TRIALS = "num_trials"
ORIGINS = "origins"


def sweep_reference(entries: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """A sweep's ``suggest_configs`` XCom for its ``entries`` (registered in the trials DB): the
    run's id, how many trials it has, the run's own settings (the first entry's: each entry
    carries the same) and the warm-started trials' origins, as many as the warm start's seeds."""
    first = entries[0]
    return {
        "experiment_run_id": first["experiment_run_id"],
        NUM_TRIALS: len(entries),
        ORIGINS: origins_of(entries),
        **{key: value for key, value in first.items() if key not in _ENTRY_KEYS},
    }


def origins_of(entries: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """The warm-started entries' origins (their source and restore path), by trial id."""
    return {
        e["trial_id"]: {"warm_start": e["warm_start"], "restore_path": e.get("restore_path")}
        for e in entries
        if e.get("warm_start")
    }


def warm_started(suggested: Any) -> int:
    """How many of the run's trials ``suggested`` (a list or a reference) warm-started; 0 for
    none given."""
    if isinstance(suggested, Mapping) and NUM_TRIALS in suggested:
        return len(suggested.get(ORIGINS) or {})
    return len(origins_of(list(suggested or [])))


@dataclasses.dataclass(frozen=True)
class SuggestedTrials:
    """A run's trials as a task receives them from ``suggest_configs``.

    :param run_pk: the experiment run's id in the trials DB. :param count: how many trials.
    :param listed: ``(trial id, config)`` of each, from a list; None for a sweep's reference:
        the run's registered trials, read from the trials DB.
    :param settings: the run's own settings that each entry carries (``resources_per_trial``,
        ``stopping_criterion``, ``warm_points``...): the first entry's, or the reference's.
    :param origins: the warm-started trials' origins, by trial id.
    """

    run_pk: int
    count: int
    listed: list[tuple[str, dict[str, Any]]] | None
    settings: dict[str, Any]
    origins: dict[str, dict[str, Any]]

    @classmethod
    def of(cls, suggested: Any, owner: str) -> SuggestedTrials:
        """Read ``suggested`` (a list of entries or a reference); ValueError, naming ``owner``,
        when it holds no trial or its trials name more than one run."""
        if isinstance(suggested, Mapping) and NUM_TRIALS in suggested:
            if not suggested[NUM_TRIALS]:
                raise ValueError(f"{owner}: no trials were given; see the upstream task's log.")
            return cls(
                int(suggested["experiment_run_id"]),
                int(suggested[NUM_TRIALS]),
                None,
                {k: v for k, v in suggested.items() if k not in (NUM_TRIALS, ORIGINS)},
                dict(suggested.get(ORIGINS) or {}),
            )
        entries = list(suggested or [])
        if not entries:
            raise ValueError(f"{owner}: no trials were given; see the upstream task's log.")
        run_ids = {e.get("experiment_run_id") for e in entries}
        if len(run_ids) != 1 or None in run_ids:
            raise ValueError(
                f"{owner}: its trials must all name one experiment_run_id, got "
                f"{sorted(map(str, run_ids))}; pass suggest_configs' XCom as it is."
            )
        first = entries[0]
        return cls(
            int(run_ids.pop()),
            len(entries),
            [(e["trial_id"], dict(e.get("config") or {})) for e in entries],
            {key: value for key, value in first.items() if key not in _ENTRY_KEYS},
            origins_of(entries),
        )

    @property
    def trial_ids(self) -> list[str] | None:
        """The listed trials' ids; None for a reference (the run's registered trials)."""
        return None if self.listed is None else [trial_id for trial_id, _ in self.listed]
