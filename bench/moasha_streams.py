"""Writes Syne Tune 0.16's MOASHA decisions on seeded random result streams to a test fixture.

Run it with a Python that has Syne Tune 0.16 (kept out of the project's venv)::

    python3 -m venv /tmp/synevenv
    /tmp/synevenv/bin/pip install syne-tune==0.16.0
    /tmp/synevenv/bin/python bench/moasha_streams.py

It writes tests/unit/fixtures/moasha_syne_tune_0_16.json, which
tests/unit/test_moasha_conformance.py replays through our MOASHA, decision for decision. Beside
the streams it keeps random rungs' cost rows with the order Syne Tune's default priority ranks
them in, so that the ranking is checked on wide fronts too, which short streams rarely build.

Each stream adds trials, interleaves their results at uneven steps of ``training_iteration``
(some skip rungs), on two metrics with mixed modes, rounded so that rungs see ties and equal
vectors. Trials end by a STOP (then the scheduler hears ``on_trial_complete`` with that result,
as the engine's TrialRunner calls it), by ending on their own before ``max_t``, or by being
removed before they report. Syne Tune 0.16's MOASHA takes one ``do_minimize`` for all metrics:
the values of a metric to maximise reach it negated, which is exact.
"""

from __future__ import annotations

import json
import random
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

FIXTURE = Path(__file__).resolve().parents[1] / "tests/unit/fixtures/moasha_syne_tune_0_16.json"
TIME_ATTR = "training_iteration"
STREAMS = 24
ORDERS = 60
SETTINGS = (
    {"max_t": 27, "grace_period": 1, "reduction_factor": 3, "brackets": 1},
    {"max_t": 16, "grace_period": 1, "reduction_factor": 2, "brackets": 1},
    {"max_t": 30, "grace_period": 2, "reduction_factor": 3.5, "brackets": 1},
    {"max_t": 27, "grace_period": 1, "reduction_factor": 3, "brackets": 2},
)
METRICS = (
    (["acc", "loss"], ["max", "min"]),
    (["latency", "acc"], ["min", "max"]),
)


def stream(seed: int) -> dict[str, Any]:
    """One replayed stream: its settings, and its events with Syne Tune's decisions."""
    import numpy as np
    from syne_tune.backend.trial_status import Trial
    from syne_tune.optimizer.schedulers.multiobjective.moasha import MOASHA

    rng = random.Random(seed)
    settings = SETTINGS[seed % len(SETTINGS)]
    metrics, modes = METRICS[seed % len(METRICS)]
    scheduler = MOASHA(
        config_space={},
        metrics=metrics,
        do_minimize=True,
        time_attr=TIME_ATTR,
        random_seed=0,
        **settings,
    )
    np.random.seed(seed)  # the bracket draws; the test seeds numpy.random.RandomState(seed)
    signs = [1 if mode == "min" else -1 for mode in modes]
    trials: dict[int, Trial] = {}
    live: dict[int, dict[str, Any]] = {}
    events: list[list[Any]] = []
    planned = rng.randint(5, 11)
    added = 0

    def add() -> None:
        nonlocal added
        trial = Trial(trial_id=added, config={}, creation_time=datetime(2026, 1, 1))
        trials[added] = trial
        scheduler.on_trial_add(trial)
        bracket = scheduler.brackets.index(scheduler.trial_info[added])
        quality = rng.random()
        live[added] = {
            "time": 0,
            "quality": quality,
            "ends_at": rng.choice([None, None, None, rng.randint(1, settings["max_t"])]),
            "last": None,
        }
        events.append(["add", added, bracket])
        added += 1

    def values(state: dict[str, Any]) -> list[float]:
        progress = state["time"] / settings["max_t"]
        out = []
        for name in metrics:
            if name == "acc":
                out.append(round(state["quality"] * (0.5 + progress) + rng.gauss(0, 0.05), 1))
            elif name == "loss":
                out.append(round(2 - state["quality"] - progress + rng.gauss(0, 0.1), 2))
            else:
                out.append(float(rng.choice([10, 20, 20, 30, 40])))
        return out

    def complete(trial_id: int, last: list[Any]) -> None:
        time, metric_values = last
        result = {TIME_ATTR: time, **dict(zip(metrics, signed(metric_values), strict=True))}
        scheduler.on_trial_complete(trials[trial_id], result)
        events.append(["complete", trial_id])
        del live[trial_id]

    def signed(metric_values: list[float]) -> list[float]:
        return [sign * value for sign, value in zip(signs, metric_values, strict=True)]

    for _ in range(rng.randint(2, 5)):
        add()
    while live or added < planned:
        if added < planned and (not live or rng.random() < 0.15):
            add()
            continue
        trial_id = rng.choice(sorted(live))
        state = live[trial_id]
        if state["last"] is None and rng.random() < 0.04:
            scheduler.on_trial_remove(trials[trial_id])
            events.append(["remove", trial_id])
            del live[trial_id]
            continue
        state["time"] += rng.choice([1, 1, 1, 1, 2, 3, 5])
        metric_values = values(state)
        state["last"] = [state["time"], metric_values]
        result = {
            TIME_ATTR: state["time"],
            **dict(zip(metrics, signed(metric_values), strict=True)),
        }
        decision = str(scheduler.on_trial_result(trials[trial_id], result))
        events.append(["result", trial_id, state["time"], metric_values, decision])
        if decision == "STOP":
            complete(trial_id, state["last"])
        elif state["ends_at"] is not None and state["time"] >= state["ends_at"]:
            complete(trial_id, state["last"])
    return {
        "seed": seed,
        "settings": settings,
        "metric": metrics,
        "mode": modes,
        "events": events,
    }


def orders(seed: int) -> dict[str, Any]:
    """A random rung's cost rows (many on one front, with ties) and the list Syne Tune 0.16's
    default priority, ``NonDominatedPriority()``, ranks them by."""
    import numpy as np
    from syne_tune.optimizer.schedulers.multiobjective.multiobjective_priority import (
        NonDominatedPriority,
    )

    rng = random.Random(1000 + seed)
    columns = 2 + seed % 2
    rows = []
    for _ in range(rng.randint(3, 14)):
        # Points near a line (or plane) of slope -1 make wide fronts; the grid makes ties.
        base = rng.random()
        row = [round(base + rng.gauss(0, 0.1), 1)]
        row += [round(1 - base + rng.gauss(0, 0.1), 1) for _ in range(columns - 1)]
        rows.append(row)
    ranked = NonDominatedPriority()(np.array(rows, dtype=float))
    return {"costs": rows, "order": [int(i) for i in ranked]}


def main() -> int:
    import syne_tune

    if syne_tune.__version__ != "0.16.0":
        print(f"Needs Syne Tune 0.16.0, found {syne_tune.__version__}.", file=sys.stderr)
        return 1
    streams = [stream(seed) for seed in range(STREAMS)]
    ranked = [orders(seed) for seed in range(ORDERS)]
    FIXTURE.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(
        {
            "syne_tune": syne_tune.__version__,
            "time_attr": TIME_ATTR,
            "streams": streams,
            "orders": ranked,
        },
        separators=(",", ":"),
    )
    FIXTURE.write_text(text + "\n")
    decisions = [e[-1] for s in streams for e in s["events"] if e[0] == "result"]
    print(
        f"{FIXTURE}: {len(streams)} streams, {len(decisions)} decisions "
        f"({decisions.count('STOP')} STOP), {len(text) // 1024} KiB"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
