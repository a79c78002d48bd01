"""Cross-run warm start: a new run begins with an earlier run's best configs (and their results).

:class:`WarmStart` says where from; :func:`seed_configs` turns the source run's ranked trials into
this run's first configs, checked against this run's search space. The store lookup and Airflow's
Asset events live with the experiment's tasks (``experiment/warm_start_source.py``); this module is
pure.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

from airflow_trials.core.domains import LIST_DOMAINS, SAMPLE_FROM

#: The sources :class:`WarmStart` takes besides a run key.
PREVIOUS, ASSET = "previous", "asset"


class WarmStartError(ValueError):
    """The warm-start source cannot seed this run (missing, deleted, or its configs do not fit)."""


@dataclasses.dataclass(frozen=True)
class WarmStart:
    """Where a run's warm start comes from, and how much it takes.

    :param source: ``"previous"`` (default): the latest earlier run of this experiment that ended
        SUCCESS; ``"asset"``: the run named by the last event of the experiment's best-trial Asset;
        or a run key (an Airflow run id) of this experiment.
    :param top_k: how many of the source's best finished trials seed this run; default 3. Their
        configs run first (counted in ``num_samples``); a searcher also learns their results.
    :param from_checkpoints: those trials start from their source trial's best checkpoint rather
        than from scratch; default False.
    :param if_missing: ``"warn"`` (default) or ``"error"``, when ``"previous"`` or ``"asset"`` finds
        no source (the experiment's first run). A run key that names no run is always an error.
    :param dag_id: the DAG whose runs the source is taken from; default (None) this run's own DAG.
        Another DAG's runs are never taken unless named here: a run of the same experiment name
        on another DAG may be another team's, and its checkpoints are pickles, which run code
        when loaded.
    """

    source: str = PREVIOUS
    top_k: int = 3
    from_checkpoints: bool = False
    if_missing: str = "warn"
    dag_id: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.source, str) or not self.source:
            raise ValueError(
                f"WarmStart source must be 'previous', 'asset' or a run key, got {self.source!r}."
            )
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 1:
            raise ValueError(f"WarmStart top_k must be a whole number >= 1, got {self.top_k!r}.")
        if self.dag_id is not None and (not isinstance(self.dag_id, str) or not self.dag_id):
            raise ValueError(
                f"WarmStart dag_id must be a DAG id or None (this run's own DAG), got "
                f"{self.dag_id!r}."
            )
        if self.if_missing not in ("warn", "error"):
            raise ValueError(
                f"WarmStart if_missing must be 'warn' or 'error', got {self.if_missing!r}."
            )

    @classmethod
    def of(cls, value: WarmStart | str | None) -> WarmStart | None:
        """``warm_start=`` as given: a WarmStart, a source string (``"previous"``, ...), or None."""
        if value is None or isinstance(value, WarmStart):
            return value
        if isinstance(value, str):
            return cls(source=value)
        raise ValueError(
            f"warm_start must be a WarmStart, 'previous', 'asset' or a run key, got {value!r}."
        )


@dataclasses.dataclass(frozen=True)
class SourceTrial:
    """One finished trial of the source run, as ranked there.

    :param trial_id: its id. :param config: its config.
    :param value: what a searcher is told of it: its best value of the metric, or with several
        metrics the list of their values in its last result (the values that ranked it).
    :param checkpoint: its best checkpoint (with several metrics, its newest kept one), or None.
    :param result: its last result, for a searcher with constraints (their values are computed
        from it); None when no searcher needs it.
    """

    trial_id: str
    config: dict[str, Any]
    value: float | list[float] | None
    checkpoint: str | None
    result: dict[str, Any] | None = None


def seed_configs(
    space: Mapping[str, Any],
    source_run: str,
    ranked: Sequence[SourceTrial],
    top_k: int,
) -> tuple[list[tuple[dict[str, Any], SourceTrial]], list[str]]:
    """This run's first configs from the source's best trials, and a note per trial skipped.

    A seed takes the source trial's values of the space's tuned parameters and the space's own
    constants (a constant may change from one night to the next). A source trial whose value lies
    outside this run's domain for a parameter is skipped, with a note naming both. Raises
    :class:`WarmStartError` when the space tunes a parameter the source never had (the space
    changed), or when no trial fits.
    """
    tuned = dict(_tuned(space))
    seeds: list[tuple[dict[str, Any], SourceTrial]] = []
    skipped: list[str] = []
    for trial in ranked:
        if len(seeds) == top_k:
            break
        missing = [path for path in tuned if not _has(trial.config, path)]
        if missing:
            raise WarmStartError(
                f"the search space tunes {missing}, which run {source_run}'s trials never had (the "
                "space changed "
                f"since that run, e.g. trial {trial.trial_id}); warm-start from a run of this "
                "search space, or drop "
                "warm_start for this run"
            )
        outside = [
            f"{path}={_get(trial.config, path)!r} is outside {domain}"
            for path, domain in tuned.items()
            if not _within(domain, _get(trial.config, path))
        ]
        if outside:
            skipped.append(f"trial {trial.trial_id} of run {source_run}: {'; '.join(outside)}")
            continue
        seeds.append((_merged(space, trial.config), trial))
    if ranked and not seeds:
        raise WarmStartError(
            f"none of run {source_run}'s best trials fits this run's search space "
            f"({'; '.join(skipped)}); widen the "
            "space or warm-start from another run"
        )
    return seeds, skipped


def _tuned(space: Mapping[str, Any], prefix: str = "") -> list[tuple[str, dict[str, Any]]]:
    from airflow_trials.core.search import _is_domain

    found: list[tuple[str, dict[str, Any]]] = []
    for key, value in space.items():
        path = f"{prefix}{key}"
        if _is_domain(value):
            found.append((path, dict(value)))
        elif isinstance(value, Mapping):
            found.extend(_tuned(value, f"{path}."))
    return found


def _has(config: Mapping[str, Any], path: str) -> bool:
    node: Any = config
    for part in path.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return False
        node = node[part]
    return True


def _get(config: Mapping[str, Any], path: str) -> Any:
    node: Any = config
    for part in path.split("."):
        node = node[part]
    return node


def _within(domain: Mapping[str, Any], value: Any) -> bool:
    kind, arg = next(iter(domain.items()))
    if kind == SAMPLE_FROM:
        return True  # a function of the other values: the source computed it from them
    if kind in LIST_DOMAINS:
        return value in arg
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return False
    if kind in ("randn", "qrandn"):
        return True  # unbounded
    lower, upper = arg[0], arg[1]
    if kind in ("randint", "lograndint"):  # Ray Tune's upper bound is exclusive there
        return lower <= value < upper
    return lower <= value <= upper


def _merged(space: Mapping[str, Any], source: Mapping[str, Any]) -> dict[str, Any]:
    """The space with each tuned domain replaced by the source's value (constants are the
    space's)."""
    from airflow_trials.core.search import _is_domain

    merged: dict[str, Any] = {}
    for key, value in space.items():
        if _is_domain(value):
            merged[key] = source[key]
        elif isinstance(value, Mapping):
            merged[key] = _merged(
                value, source.get(key, {}) if isinstance(source.get(key), Mapping) else {}
            )
        else:
            merged[key] = value
    return merged
