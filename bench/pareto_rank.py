"""Benchmark: Pareto ranks of a run's trials (``core.pareto.pareto_ranks``), which the CLI
leaderboard, the dashboard's leaderboard endpoint and ``ResultGrid`` compute over a whole run on
every request.

The anchor, on the same rows in the same run: Optuna's own non-dominated sort
(``optuna.study._multi_objective._fast_non_domination_rank``, what its NSGA-II and
``study.best_trials`` use). Both must give the same ranks (checked); the script prints each one's
median time over ``--repeats`` and ``ours / optuna``.

    .venv/bin/python -m bench.pareto_rank                 # 1,000 / 10,000 / 100,000 rows
    .venv/bin/python -m bench.pareto_rank --rows 10000 --metrics 3
"""

from __future__ import annotations

import argparse
import random
import statistics
import time


def _rows(count: int, metrics: int, seed: int) -> list[list[float]]:
    rng = random.Random(seed)
    return [[rng.random() for _ in range(metrics)] for _ in range(count)]


def _median_seconds(work, repeats: int) -> tuple[float, object]:
    times = []
    result = None
    for _ in range(repeats):
        started = time.perf_counter()
        result = work()
        times.append(time.perf_counter() - started)
    return statistics.median(times), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="*", default=[1_000, 10_000, 100_000])
    parser.add_argument("--metrics", type=int, nargs="*", default=[2, 3])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    import numpy as np
    from optuna.study._multi_objective import _fast_non_domination_rank

    from airflow_trials.core.pareto import pareto_ranks

    print(f"{'rows':>8} {'metrics':>7} {'ours (s)':>10} {'optuna (s)':>11} {'ours/optuna':>12}")
    for metrics in args.metrics:
        modes = ["min", "max", "min", "max"][:metrics]
        signs = np.array([1.0 if m == "min" else -1.0 for m in modes])
        for count in args.rows:
            if metrics > 2 and count > 10_000:
                continue  # O(M N^2) for three or more metrics, as Optuna's
            rows = _rows(count, metrics, seed=count + metrics)
            ours_s, ours = _median_seconds(lambda r=rows, m=modes: pareto_ranks(r, m), args.repeats)
            losses = np.asarray(rows) * signs
            optuna_s, theirs = _median_seconds(
                lambda x=losses: _fast_non_domination_rank(x), args.repeats
            )
            assert list(ours) == [int(v) for v in theirs], "the two sorts disagree"  # type: ignore[arg-type]
            print(
                f"{count:>8} {metrics:>7} {ours_s:>10.4f} {optuna_s:>11.4f} "
                f"{ours_s / optuna_s:>12.2f}"
            )


if __name__ == "__main__":
    main()
