"""One short line per trial result, for logs: the trainable's own metrics, compactly formatted."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from airflow_trials.core import result as R

# A progress line stays readable in a task log; metrics beyond this are counted, not shown.
MAX_PROGRESS_CHARS = 240
# A single string or nested value is cut to this many characters.
MAX_VALUE_CHARS = 32


def format_value(value: Any) -> str:
    """A metric value in few characters: 4 significant digits for floats, short strings."""
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, float):
        return f"{value:.4g}" if math.isfinite(value) else str(value)
    if isinstance(value, int):
        return str(value)
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=repr)
    return text if len(text) <= MAX_VALUE_CHARS else text[: MAX_VALUE_CHARS - 3] + "..."


def format_progress(
    trial_id: str, result: Mapping[str, Any], max_chars: int = MAX_PROGRESS_CHARS
) -> str:
    """``Trial t-3 iteration 3: val_loss=0.412 val_accuracy=0.81 (checkpoint checkpoint_000003)``.

    Only the trainable's own metrics are shown (not the engine's :data:`~.result.AUTO_FIELDS`),
    in the order it reported them; past ``max_chars`` the rest are counted (``... 4 more``).

    :param trial_id: the trial.
    :param result: one result as the actor returns it.
    :param max_chars: longest line; default :data:`MAX_PROGRESS_CHARS`.
    """
    head = f"Trial {trial_id} iteration {result.get(R.TRAINING_ITERATION, '?')}:"
    checkpoint = result.get(R.CHECKPOINT)
    tail = f" (checkpoint {_basename(str(checkpoint))})" if checkpoint else ""
    metrics = [
        f"{k}={format_value(v)}"
        for k, v in result.items()
        if k not in R.AUTO_FIELDS and k != R.DUPLICATE
    ]
    if not metrics:
        return f"{head} no metrics{tail}"
    shown: list[str] = []
    length = len(head) + len(tail)
    for i, item in enumerate(metrics):
        rest = len(metrics) - i - 1
        more = len(f" ... {rest} more") if rest else 0
        if shown and length + 1 + len(item) + more > max_chars:
            return f"{head} {' '.join(shown)} ... {len(metrics) - len(shown)} more{tail}"
        shown.append(item)
        length += 1 + len(item)
    return f"{head} {' '.join(shown)}{tail}"


def _basename(path: str) -> str:
    """The last part of a local path or URL (``checkpoint_000003``)."""
    return path.rstrip("/").rsplit("/", 1)[-1]
