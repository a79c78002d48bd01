"""Names of the fields the engine adds to every reported result, and per-metric statistics."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

TRIAL_ID = "trial_id"
TRAINING_ITERATION = "training_iteration"
TIME_THIS_ITER_S = "time_this_iter_s"
TIME_TOTAL_S = "time_total_s"
TIMESTEPS_THIS_ITER = "timesteps_this_iter"
TIMESTEPS_TOTAL = "timesteps_total"
ITERATIONS_SINCE_RESTORE = "iterations_since_restore"
TIMESTEPS_SINCE_RESTORE = "timesteps_since_restore"
TIME_SINCE_RESTORE = "time_since_restore"
TIMESTAMP = "timestamp"
DONE = "done"
CHECKPOINT = "checkpoint"  # the persisted checkpoint reported with this result, if any
# Marks the repeated last result of a function trainable that returned: it ends the trial and is
# not recorded again. Set by the trainable driver, removed by whoever records the result.
DUPLICATE = "__duplicate__"
# Marks a result after which the trial actor ended its trial and took over the next one the runner
# offered with the call (``{"trial_id": ...}``), or failed to (``{"error": ...}``): docs/engine.md,
# "Hand-over". Set by the trial actor, removed by the executor that fetches the result.
HANDED_OVER = "__handed_over__"
HOSTNAME = "hostname"
PID = "pid"
NODE_IP = "node_ip"
# The Ray node the result came from: several nodes on one machine share an ip, never an id.
NODE_ID = "node_id"

# Fields the engine fills in; everything else in a result is the trainable's own metric.
AUTO_FIELDS = frozenset(
    {
        TRIAL_ID,
        TRAINING_ITERATION,
        TIME_THIS_ITER_S,
        TIME_TOTAL_S,
        TIMESTEPS_TOTAL,
        ITERATIONS_SINCE_RESTORE,
        TIMESTEPS_SINCE_RESTORE,
        TIME_SINCE_RESTORE,
        TIMESTAMP,
        DONE,
        CHECKPOINT,
        HOSTNAME,
        PID,
        NODE_IP,
        NODE_ID,
    }
)

Result = dict[str, Any]


@dataclass
class MetricStats:
    """Minimum, maximum and last value of one numeric metric over a trial's results."""

    min: float = math.inf
    max: float = -math.inf
    last: float = math.nan

    def update(self, value: float) -> None:
        self.min = min(self.min, value)
        self.max = max(self.max, value)
        self.last = value

    def to_dict(self) -> dict[str, float]:
        return {"min": self.min, "max": self.max, "last": self.last}


@dataclass
class MetricAnalysis:
    """Per-metric min/max/last for every numeric value a trial has reported."""

    stats: dict[str, MetricStats] = field(default_factory=dict)

    def update(self, result: Mapping[str, Any]) -> None:
        for key, value in result.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            self.stats.setdefault(key, MetricStats()).update(float(value))

    def __getitem__(self, metric: str) -> MetricStats:
        return self.stats[metric]

    def __contains__(self, metric: object) -> bool:
        return metric in self.stats

    def to_dict(self) -> dict[str, dict[str, float]]:
        return {k: v.to_dict() for k, v in self.stats.items()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Mapping[str, float]]) -> MetricAnalysis:
        return cls({k: MetricStats(v["min"], v["max"], v["last"]) for k, v in data.items()})
