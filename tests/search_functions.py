"""sample_from functions the search-space tests import by path (tests.search_functions:<name>)."""

from __future__ import annotations


def double_layers(config):
    """Depends on an earlier value of the config, as Ray Tune's ``sample_from(lambda spec:
    ...)``."""
    return config["layers"] * 2


def units_for_depth(config, rng):
    """Draws from the seeded ``rng`` the engine gives it, so a seed gives the same value."""
    return rng.choice([16, 32, 64]) * config["model"]["depth"]


def seen_keys(config):
    return sorted(config)


def no_args():
    return "constant"


def two_positional(config, other):
    return 0


def raises(config):
    return config["missing"]


def not_json(config):
    return {1, 2}


NOT_CALLABLE = 3


def inverse_scale(config):
    """``1 / scale``: ties a trial's cost to its scale (tests.trainables:two_metrics)."""
    return 1.0 / config["scale"]
