"""json_safe: what any reported value becomes before a store write, on its fast path for plain
values and its general path alike."""

from __future__ import annotations

import datetime as dt
import enum
import json
import math

import numpy as np
import pytest

from airflow_trials.core.jsonsafe import json_safe


class Level(enum.IntEnum):
    HIGH = 2


class Ratio(float):
    """A float subclass: not on the fast path for exact floats."""


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (1.5, 1.5),
        (math.nan, None),
        (-math.inf, None),
        (3, 3),
        (True, True),
        (None, None),
        ("a\x00b", "a\ufffdb"),
        (np.float64("nan"), None),
        (np.float32(0.5), 0.5),
        (np.int64(7), 7),
        (np.bool_(True), True),
        (np.arange(3), [0, 1, 2]),
        (Level.HIGH, 2),
        (Ratio(0.25), 0.25),
        ((1, {2}), [1, [2]]),
        (dt.date(2026, 1, 2), "2026-01-02"),
        (ValueError("odd"), "odd"),
    ],
)
def test_each_value_becomes_strict_json(value, expected):
    safe = json_safe(value)
    assert safe == expected and type(safe) is type(expected)
    json.dumps(safe, allow_nan=False)


def test_a_result_dict_is_copied_with_its_keys_made_strings_and_its_nuls_replaced():
    result = {
        "loss": math.inf,
        "a\x00key": {"nested": [math.nan, np.float64(1.0)]},
        3: "x\x00",
        "done": False,
    }
    safe = json_safe(result)
    assert safe == {
        "loss": None,
        "a\ufffdkey": {"nested": [None, 1.0]},
        "3": "x\ufffd",
        "done": False,
    }
    assert result["loss"] == math.inf  # the reported dict is left as it was
    json.dumps(safe, allow_nan=False)
