"""The benchmark's sleep-bound trainable, in both APIs (ours and Ray Tune's)."""

from __future__ import annotations

import time


def ours(config):
    import airflow_trials

    for _ in range(config["iterations"]):
        time.sleep(config["sleep_s"])
        airflow_trials.report(loss=config["x"])


def ray_tune(config):
    from ray import tune

    for _ in range(config["iterations"]):
        time.sleep(config["sleep_s"])
        tune.report({"loss": config["x"]})
