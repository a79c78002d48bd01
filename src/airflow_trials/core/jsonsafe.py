"""Turns reported values into strict JSON, so an odd metric never makes a store write fail.

Rules, applied recursively to dict values and list items:

- numpy scalars become Python numbers, numpy arrays become lists (``.tolist()``);
- NaN, inf and -inf become ``None`` (JSON has no such numbers; PostgreSQL rejects them);
- dict keys become strings, tuples and sets become lists;
- NUL characters in strings become U+FFFD (PostgreSQL's JSONB cannot hold them);
- datetimes and dates become ISO 8601 strings, anything else its ``str()``.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from datetime import date
from typing import Any


def json_safe(value: Any) -> Any:
    """A copy of ``value`` that ``json.dumps(..., allow_nan=False)`` accepts; see module
    docstring."""
    # The plain types a result is made of, by exact type first: the checks below go through
    # the numbers ABCs, which cost several times more per value (the triggerer's poller makes
    # every polled result safe).
    kind = type(value)
    if kind is float:
        return value if math.isfinite(value) else None
    if kind is int or kind is bool:
        return value
    if kind is dict:
        return {
            (key if type(key) is str and "\x00" not in key else str(json_safe(key))): json_safe(
                item
            )
            for key, item in value.items()
        }
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str):
        return value.replace("\x00", "\ufffd") if "\x00" in value else value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        number = float(value)
        return number if math.isfinite(number) else None
    if isinstance(value, Mapping):
        return {str(json_safe(key)): json_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [json_safe(item) for item in value]
    tolist = getattr(value, "tolist", None)
    if callable(tolist):
        # numpy arrays and numpy scalars not registered as numbers (np.bool_).
        return json_safe(tolist())
    if isinstance(value, date):
        return value.isoformat()
    return str(value)
